"""Finding the .ckpt of every rank in a MindSpore rank directory (DIR/rank_<r>/), with the same
rules as the C++ client library (client/client.cc: ResolveRankFiles)."""

from __future__ import annotations

import os
import re
from typing import List, Optional, Tuple

from ckptd.errors import InvalidArgument, NotFound

_EPOCH_STEP = re.compile(r"^(\d{1,18})_(\d{1,18})$")


def parse_epoch_step(file_name: str) -> Optional[Tuple[int, int]]:
    """The (epoch, step) of "<prefix>-<epoch>_<step>.ckpt" (the prefix may contain '-'), or None
    for any other name."""
    if not file_name.endswith(".ckpt"):
        return None
    stem = file_name[:-len(".ckpt")]
    dash = stem.rfind("-")
    if dash < 0:
        return None
    m = _EPOCH_STEP.match(stem[dash + 1:])
    if not m:
        return None
    return int(m.group(1)), int(m.group(2))


def select_rank_file(rank_dir: str) -> str:
    """The newest .ckpt among the regular files of `rank_dir`: the largest (epoch, step) when
    every candidate is named "<prefix>-<epoch>_<step>.ckpt" (compared numerically), otherwise,
    and between equal numbers, the latest modification time, then the largest name. NotFound
    when there is none."""
    candidates = []
    try:
        entries = list(os.scandir(rank_dir))
    except OSError as e:
        raise NotFound(f"cannot list {rank_dir}: {e.strerror}") from None
    for entry in entries:
        name = entry.name
        if len(name) <= 5 or not name.endswith(".ckpt"):
            continue
        try:
            if not entry.is_file():
                continue
            mtime = entry.stat().st_mtime_ns
        except OSError as e:
            raise NotFound(f"cannot stat {entry.path}: {e.strerror}") from None
        candidates.append((name, entry.path, parse_epoch_step(name), mtime))
    if not candidates:
        raise NotFound(f"{rank_dir} holds no .ckpt file")
    numbered = all(c[2] is not None for c in candidates)

    def key(c):
        return ((c[2] if numbered else (0, 0)), c[3], c[0])

    return max(candidates, key=key)[1]


def _rank_list(ranks: List[int], max_listed: int = 10) -> str:
    text = ", ".join(f"rank_{r}" for r in ranks[:max_listed])
    if len(ranks) > max_listed:
        text += f" and {len(ranks) - max_listed} more"
    return text


def resolve_rank_files(directory: str, world_size: int) -> List[str]:
    """The checkpoint file of every rank of `directory`, which must hold exactly rank_0 ..
    rank_<world_size-1> (entries not named rank_<digits> are ignored)."""
    if world_size < 1:
        raise InvalidArgument(f"world size must be positive, got {world_size}")
    if not os.path.isdir(directory):
        raise NotFound(f"{directory} is not a directory")
    found = {}
    beyond = []
    try:
        entries = list(os.scandir(directory))
    except OSError as e:
        raise NotFound(f"cannot list {directory}: {e.strerror}") from None
    for entry in entries:
        name = entry.name
        if not name.startswith("rank_"):
            continue
        digits = name[5:]
        if not digits or not digits.isascii() or not digits.isdigit():
            continue  # rank_backup and the like are not rank directories
        if not entry.is_dir():
            continue
        rank = int(digits) if len(digits) <= 18 else None
        if rank is None or f"rank_{rank}" != name:
            raise InvalidArgument(f"{entry.path}: rank directories are named rank_<r> without "
                                  f"leading zeros")
        if rank >= world_size:
            beyond.append(rank)
        else:
            found[rank] = entry.path
    missing = [r for r in range(world_size) if r not in found]
    if missing or beyond:
        problems = []
        if missing:
            problems.append(f"missing {_rank_list(missing)}")
        if beyond:
            problems.append(f"unexpected {_rank_list(sorted(beyond))} beyond the world")
        raise InvalidArgument(f"{directory} does not match the strategy's {world_size} ranks "
                              f"(rank_0..rank_{world_size - 1}): {'; '.join(problems)}")
    return [select_rank_file(found[r]) for r in range(world_size)]
