"""Helpers shared by the offline checks of deploy/: a small Dockerfile parser, the flags and
environment variables that the built binaries' --help lists, and a pass/fail reporter.

Debian's Python 3, standard library only (the Kubernetes check adds python3-yaml).
"""

import dataclasses
import re
import shlex
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Set


class Report:
    """Prints one `ok`/`FAIL` line per check and a closing `NAME: P passed, F failed` line."""

    def __init__(self, name: str):
        self.name = name
        self.passed = 0
        self.failed = 0

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        if ok:
            self.passed += 1
            print("ok   %s" % what, flush=True)
        else:
            self.failed += 1
            print("FAIL %s" % what, flush=True)
            if detail:
                for line in detail.rstrip("\n").split("\n"):
                    print("    " + line, flush=True)
        return ok

    def finish(self) -> int:
        print("%s: %d passed, %d failed" % (self.name, self.passed, self.failed), flush=True)
        return 0 if self.failed == 0 and self.passed > 0 else 1


# ------------------------------------------------------------------------------- Dockerfile

@dataclasses.dataclass
class Instruction:
    line: int                 # 1-based line of the instruction's first line
    keyword: str              # upper case: FROM, RUN, COPY, ...
    args: str                 # the rest, continuation lines joined with spaces


@dataclasses.dataclass
class Stage:
    name: Optional[str]       # the `AS name` of its FROM, lower case
    image: str                # the FROM image, ARG defaults substituted
    instructions: List[Instruction]

    def all(self, keyword: str) -> List[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


class DockerfileError(Exception):
    pass


def parse_dockerfile(text: str) -> List[Stage]:
    """Splits a Dockerfile into stages of instructions.

    Handles comments, parser directives, `\\` line continuations (with comment lines inside a
    continued instruction skipped, as Docker does) and ARGs before the first FROM, whose defaults
    are substituted into FROM images. Raises DockerfileError for an instruction before the first
    FROM (other than ARG), an unknown keyword or a continuation running past the end.
    """
    known = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
             "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
    instructions: List[Instruction] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        raw = lines[i]
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        start = i
        parts = []
        current = raw
        while True:
            body = current.rstrip()
            if body.endswith("\\"):
                parts.append(body[:-1].strip())
                i += 1
                while i < len(lines) and lines[i].strip().startswith("#"):
                    i += 1
                if i >= len(lines):
                    raise DockerfileError("line %d: continuation runs past the end" % (start + 1))
                current = lines[i]
                continue
            parts.append(body.strip())
            break
        i += 1
        full = " ".join(p for p in parts if p)
        keyword, _, args = full.partition(" ")
        keyword = keyword.upper()
        if keyword not in known:
            raise DockerfileError("line %d: unknown instruction %s" % (start + 1, keyword))
        instructions.append(Instruction(start + 1, keyword, args.strip()))

    global_args: Dict[str, str] = {}
    stages: List[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            words = [w for w in words if not w.startswith("--platform")]
            if not words:
                raise DockerfileError("line %d: FROM without an image" % ins.line)
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                           lambda m: global_args.get(m.group(1) or m.group(2), m.group(0)),
                           words[0])
            name = None
            if len(words) >= 3 and words[1].upper() == "AS":
                name = words[2].lower()
            stages.append(Stage(name, image, [ins]))
        elif not stages:
            if ins.keyword != "ARG":
                raise DockerfileError("line %d: %s before the first FROM" % (ins.line, ins.keyword))
            key, _, value = ins.args.partition("=")
            global_args[key.strip()] = value.strip().strip('"')
        else:
            stages[-1].instructions.append(ins)
    return stages


def env_pairs(instruction: Instruction) -> Dict[str, str]:
    """The variables of an ENV instruction (`ENV A=1 B=2` form, or the legacy `ENV A 1`)."""
    words = shlex.split(instruction.args)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    out = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise DockerfileError("line %d: ENV word %r is not KEY=VALUE" %
                                  (instruction.line, word))
        out[key] = value
    return out


def exec_form(args: str) -> Optional[List[str]]:
    """The argv of a JSON exec-form argument (`["a", "b"]`), or None for the shell form."""
    import json
    args = args.strip()
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


# ------------------------------------------------------------------------ what --help lists

def run_help(argv: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, timeout=30, check=False,
                          universal_newlines=True)


_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_ENV = re.compile(r"\(Env:\s*([A-Z][A-Z0-9_]*)\)")


def help_options(text: str) -> Set[str]:
    """Every `--long-option` that a CLI11 help text names."""
    return set(_OPTION.findall(text))


def help_envs(text: str) -> Set[str]:
    """Every environment variable that a CLI11 help text names as `(Env:NAME)`."""
    return set(_ENV.findall(text))


def help_subcommands(text: str) -> Set[str]:
    """The commands listed under `Subcommands:` in a CLI11 help text."""
    names = set()
    section = text.partition("\nSubcommands:\n")[2]
    for line in section.split("\n"):
        if not line.startswith("  "):
            break
        word = line.split()[0] if line.split() else ""
        if line[2:3] != " " and word:
            names.add(word)
    return names


def flag_of_env(name: str) -> str:
    """CKPTD_MAP_BUDGET_MIB -> --map-budget-mib (ckptd's naming rule for its flags' env vars)."""
    assert name.startswith("CKPTD_")
    return "--" + name[len("CKPTD_"):].lower().replace("_", "-")


def fail_exit(message: str) -> None:
    print("ERROR " + message, file=sys.stderr)
    sys.exit(2)
