#!/usr/bin/env python3
"""Fault loop: kills ckptd with SIGKILL in the middle of random operations and checks, after
each restart, that every committed checkpoint is intact and that nothing partial is visible.

    chaos.py --ckptd BIN --ckptctl BIN -n N [--seed S] [--big-mib M] [--keep]

One ckptd on 127.0.0.1 port 0 with a temporary store and export root, then N rounds of:
  1. start one operation at random through ckptctl: an upload (the `ckptctl sample` checkpoint,
     8 ranks, or a generated one of about --big-mib MiB, 4 ranks, or a whole-tensor file), a
     transform job `--as NEW`, an export job `--export-dir` beneath the export root, or a delete;
  2. SIGKILL ckptd after a random delay (before, during or after the operation's work);
  3. restart ckptd on the same store and wait for every transform job to end (interrupted jobs
     are resumed by ckptd; each must end SUCCEEDED or FAILED, never stay RUNNING);
  4. check: `ckptctl ls` lists exactly the checkpoints known to be committed plus, for the
     interrupted operation, possibly its target (a commit whose reply was lost), never anything
     else; every listed checkpoint fetched whole (`fetch --merged`) and at one destination rank
     equals the generated source byte for byte; the export root holds only complete exports,
     each file equal to the client-side export of the source, and no partial or temporary entry;
     a job that SUCCEEDED has its output, one that FAILED has none.
Exits 0 and prints "N kills, M checkpoints verified, 0 mismatches" when everything held, 1 with
the first violations otherwise (the work directory is then kept for inspection).

The generated checkpoint is sharded on rows over 4 ranks (dev_matrix [4], tensor_map [0, -1])
and re-sharded to columns over 2 ranks, so that transform jobs do real work and take long
enough to be interrupted. Standard library only (Debian's python3).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 120
CALL_TIMEOUT_S = 300
JOB_TIMEOUT_S = 300


# ----------------------------------------------------------------------- generated checkpoints

def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def ckpt_value(name: str, dims: list[int], content: bytes) -> bytes:
    """One MindSpore Checkpoint message holding one Float32 Value (the framing ckptd writes)."""
    tensor = bytearray()
    for d in dims:
        tensor += b"\x08" + _varint(d)
    tensor += b"\x12" + _varint(7) + b"Float32"
    tensor += b"\x1a" + _varint(len(content))
    tensor_len = len(tensor) + len(content)
    name_b = name.encode()
    value = b"\x0a" + _varint(len(name_b)) + name_b + b"\x12" + _varint(tensor_len)
    return b"\x0a" + _varint(len(value) + tensor_len) + value + bytes(tensor) + content


def layout_strategy(names: list[str], devices: int, tensor_map: list[int]) -> dict:
    item = {"dev_matrix": [devices], "tensor_map": tensor_map, "field": 0,
            "opt_weight_shard_step": 0, "opt_weight_shard_size": 0,
            "param_split_shape": [], "indices_offset": []}
    return {"current_stage": 0, "parallel_strategy_item": {},
            "parallel_layout_item": {n: dict(item) for n in names}}


def generate_big(out: Path, mib: int, rng: random.Random) -> None:
    """out/checkpoint/rank_<r>/big_<r>.ckpt (4 row shards), out/whole.ckpt (the same tensors
    whole, tensors sorted by name as ckptd writes them), out/src.json and out/dst.json."""
    rows, cols = 256, 256  # 256 KiB per Float32 tensor
    count = max(1, mib * 4)
    names = [f"big.layer{i:04d}.weight" for i in range(count)]
    shards = 4
    rank_files = [bytearray() for _ in range(shards)]
    whole = bytearray()
    for name in names:
        data = rng.randbytes(rows * cols * 4)
        whole += ckpt_value(name, [rows, cols], data)
        band = rows // shards * cols * 4
        for r in range(shards):
            rank_files[r] += ckpt_value(name, [rows // shards, cols], data[r * band:(r + 1) * band])
    for r in range(shards):
        d = out / "checkpoint" / f"rank_{r}"
        d.mkdir(parents=True)
        (d / f"big_{r}.ckpt").write_bytes(rank_files[r])
    (out / "whole.ckpt").write_bytes(whole)
    (out / "src.json").write_text(json.dumps(layout_strategy(names, shards, [0, -1])))
    (out / "dst.json").write_text(json.dumps(layout_strategy(names, 2, [-1, 0])))


# ----------------------------------------------------------------------------- the harness

class Failure(Exception):
    pass


class Chaos:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = Path(tempfile.mkdtemp(prefix="ckptd-chaos."))
        self.data = self.work / "data"
        self.exports = self.work / "exports"
        self.exports.mkdir()
        self.proc: subprocess.Popen | None = None
        self.server = ""
        self.log = open(self.work / "ckptd.log", "ab")
        # Checkpoint id -> data set ("sample" or "big"); known committed.
        self.committed: dict[str, str] = {}
        # Export dir name -> data set; known complete.
        self.exported: dict[str, str] = {}
        self.kills = 0
        self.verified = 0
        self.mismatches: list[str] = []
        self.outcomes: dict[str, int] = {}

    # -- processes

    def ckptctl(self, *argv, check=True, timeout=CALL_TIMEOUT_S) -> subprocess.CompletedProcess:
        env = dict(os.environ, CKPT_SERVER=self.server)
        p = subprocess.run([self.args.ckptctl, *argv], env=env, capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise Failure(f"ckptctl {' '.join(argv)} exited {p.returncode}: {p.stderr.strip()}")
        return p

    def start(self) -> None:
        port_file = self.work / "port"
        port_file.unlink(missing_ok=True)
        self.log.write(b"=== start\n")
        self.log.flush()
        # A small free-space reserve: the loop must not depend on the machine's free disk.
        self.proc = subprocess.Popen(
            [self.args.ckptd, "--listen", "127.0.0.1:0", "--port-file", str(port_file),
             "--data", str(self.data), "--export-root", str(self.exports),
             "--min-free-disk-mib", "16", "--job-bandwidth-mib", str(self.args.job_mib_s)],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip():
                self.server = f"127.0.0.1:{port_file.read_text().strip()}"
                return
            if self.proc.poll() is not None:
                raise Failure(f"ckptd exited {self.proc.returncode} during start-up "
                              f"(log: {self.work / 'ckptd.log'})")
            time.sleep(0.05)
        raise Failure(f"ckptd did not start within {START_TIMEOUT_S} s")

    def kill(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:  # a crash (or a sanitizer report) before the kill
            self.mismatch(f"ckptd exited {self.proc.returncode} on its own "
                          f"(log: {self.work / 'ckptd.log'})")
        else:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.returncode != 0:
                self.mismatch(f"ckptd exited {self.proc.returncode} after SIGTERM "
                              f"(log: {self.work / 'ckptd.log'})")
        elif self.proc is not None:
            self.mismatch(f"ckptd exited {self.proc.returncode} on its own "
                          f"(log: {self.work / 'ckptd.log'})")
        self.proc = None

    # -- data

    def prepare(self) -> None:
        self.src = {"sample": self.work / "sample", "big": self.work / "big"}
        subprocess.run([self.args.ckptctl, "sample", str(self.src["sample"])], check=True,
                       capture_output=True)
        generate_big(self.src["big"], self.args.big_mib, self.rng)
        self.start()
        self.ckptctl("strategy", "put", "sample_src", str(self.src["sample"] / "src_strategy.ckpt"))
        self.ckptctl("strategy", "put", "sample_dst", str(self.src["sample"] / "dst_strategy.json"))
        self.ckptctl("strategy", "put", "big_src", str(self.src["big"] / "src.json"))
        self.ckptctl("strategy", "put", "big_dst", str(self.src["big"] / "dst.json"))
        self.dst_ranks = {"sample": 3, "big": 2}
        # References from a clean server: the whole-tensor fetch must equal the generated
        # source's whole.ckpt; each destination rank's fetch and the client-side export are the
        # expected bytes of every later fetch and server-side export.
        self.ref = self.work / "ref"
        for ds in ("sample", "big"):
            self.upload_cmd(ds, f"ref-{ds}", whole=False, check=True)
            got = self.ref / ds / "merged.ckpt"
            got.parent.mkdir(parents=True)
            self.ckptctl("fetch", f"ref-{ds}", "--merged", "--out", str(got))
            if got.read_bytes() != (self.src[ds] / "whole.ckpt").read_bytes():
                raise Failure(f"reference fetch --merged of {ds} differs from its whole.ckpt")
            for r in range(self.dst_ranks[ds]):
                self.ckptctl("fetch", f"ref-{ds}", "--dst-strategy", f"{ds}_dst", "--rank",
                             str(r), "--out", str(self.ref / ds / f"rank{r}.ckpt"))
            self.ckptctl("export", f"ref-{ds}", "--dst-strategy", f"{ds}_dst", "--dir",
                         str(self.ref / ds / "export"))
            self.committed[f"ref-{ds}"] = ds

    def upload_cmd(self, ds: str, ckpt: str, whole: bool, check=False):
        if whole:
            argv = ["upload", ckpt, "--file", str(self.src[ds] / "whole.ckpt")]
        else:
            argv = ["upload", ckpt, "--strategy", f"{ds}_src", "--dir",
                    str(self.src[ds] / "checkpoint")]
        return self.ckptctl(*argv, check=check) if check else argv

    # -- checks

    def mismatch(self, what: str) -> None:
        self.mismatches.append(what)
        print(f"chaos: MISMATCH: {what}", file=sys.stderr)

    def files_under(self, root: Path) -> dict[str, Path]:
        return {str(p.relative_to(root)): p for p in sorted(root.rglob("*"))}

    def verify_checkpoint(self, ckpt: str, ds: str) -> None:
        out = self.work / "fetched.ckpt"
        out.unlink(missing_ok=True)
        self.ckptctl("fetch", ckpt, "--merged", "--out", str(out))
        if out.read_bytes() != (self.src[ds] / "whole.ckpt").read_bytes():
            self.mismatch(f"checkpoint {ckpt}: fetch --merged differs from the generated source")
        r = self.rng.randrange(self.dst_ranks[ds])
        out.unlink()
        self.ckptctl("fetch", ckpt, "--dst-strategy", f"{ds}_dst", "--rank", str(r),
                     "--out", str(out))
        if out.read_bytes() != (self.ref / ds / f"rank{r}.ckpt").read_bytes():
            self.mismatch(f"checkpoint {ckpt}: destination rank {r} differs from the reference")
        out.unlink()
        self.verified += 1

    def verify_export(self, name: str, ds: str) -> None:
        got = self.files_under(self.exports / name)
        want = self.files_under(self.ref / ds / "export")
        if sorted(got) != sorted(want):
            self.mismatch(f"export {name}: entries {sorted(got)} instead of {sorted(want)}")
            return
        for rel, path in want.items():
            if path.is_file() and got[rel].read_bytes() != path.read_bytes():
                self.mismatch(f"export {name}: {rel} differs from the client-side export")

    def listed(self) -> set[str]:
        out = self.ckptctl("ls").stdout
        return {line.split()[0] for line in out.splitlines() if line.strip()}

    def job_state(self, job: str) -> str | None:
        p = self.ckptctl("jobs", "get", job, check=False)
        if p.returncode != 0:
            if "NOT_FOUND" in p.stderr:
                return None
            raise Failure(f"ckptctl jobs get {job}: {p.stderr.strip()}")
        return p.stdout.split("\n", 1)[0].split(":", 1)[1].strip().split()[0]

    def wait_job(self, job: str) -> str | None:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while True:
            state = self.job_state(job)
            if state in (None, "SUCCEEDED", "FAILED", "CANCELLED"):
                return state
            if time.monotonic() > deadline:
                raise Failure(f"job {job} still {state} {JOB_TIMEOUT_S} s after the restart")
            time.sleep(0.1)

    # -- one round

    def pick(self, i: int):
        """An operation: (kind, argv, target, data set)."""
        sources = sorted(self.committed)
        deletable = [c for c in sources if not c.startswith("ref-")]
        kinds = ["upload", "upload", "transform", "export", "delete"]
        if len(deletable) >= self.args.max_stored:
            kinds = ["transform", "export", "delete", "delete"]
        if not deletable:
            kinds = [k for k in kinds if k != "delete"]
        kind = self.rng.choice(kinds)
        if kind == "upload":
            ds = self.rng.choice(["sample", "big", "big"])
            target = f"up{i}"
            return kind, self.upload_cmd(ds, target, whole=self.rng.random() < 0.25), target, ds
        if kind == "delete":
            target = self.rng.choice(deletable)
            return kind, ["rm", target], target, self.committed[target]
        source = self.rng.choice(sources)
        ds = self.committed[source]
        job = f"job{i}"
        if kind == "transform":
            target = f"tr{i}"
            argv = ["transform", source, "--dst-strategy", f"{ds}_dst", "--as", target]
        else:
            target = f"ex{i}"
            argv = ["transform", source, "--dst-strategy", f"{ds}_dst", "--export-dir", target]
        return kind, argv + ["--id", job, "--wait"], target, ds

    def round(self, i: int) -> None:
        kind, argv, target, ds = self.pick(i)
        env = dict(os.environ, CKPT_SERVER=self.server)
        client = subprocess.Popen([self.args.ckptctl, *argv], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        # Uploads and deletes of these sizes take a fraction of a job's time.
        scale = 1.0 if kind in ("transform", "export") else 0.4
        delay = self.rng.uniform(0, self.args.max_delay * scale)
        time.sleep(delay)
        self.kill()
        _, err = client.communicate(timeout=CALL_TIMEOUT_S)
        done = client.returncode == 0
        self.outcomes[f"{kind} {'completed' if done else 'interrupted'}"] = \
            self.outcomes.get(f"{kind} {'completed' if done else 'interrupted'}", 0) + 1
        self.start()

        job_state = None
        if kind in ("transform", "export"):
            job_state = self.wait_job(f"job{i}")
            if done and job_state != "SUCCEEDED":
                self.mismatch(f"round {i}: {kind} job{i} reported success, now {job_state}")
            if not done:  # how the interrupted job ended: resumed, failed or never submitted
                end = {None: "not submitted"}.get(job_state, str(job_state).lower())
                self.outcomes[f"{kind} job {end}"] = self.outcomes.get(f"{kind} job {end}", 0) + 1

        listed = self.listed()
        # The interrupted operation's target may or may not exist; anything else must match.
        if kind in ("upload", "transform"):
            present = target in listed
            if done and not present:
                self.mismatch(f"round {i}: {kind} of {target} completed but it is not listed")
            if kind == "transform" and job_state == "SUCCEEDED" and not present:
                self.mismatch(f"round {i}: job{i} SUCCEEDED but {target} is not listed")
            if kind == "transform" and job_state != "SUCCEEDED" and present:
                self.mismatch(f"round {i}: job{i} is {job_state} but {target} is listed")
            if present:
                self.committed[target] = ds
        elif kind == "delete":
            if done and target in listed:
                self.mismatch(f"round {i}: rm {target} completed but it is still listed")
            if target not in listed:
                del self.committed[target]
        elif kind == "export":
            exists = (self.exports / target).exists()
            if job_state == "SUCCEEDED" and not exists:
                self.mismatch(f"round {i}: job{i} SUCCEEDED but export {target} is absent")
            if job_state != "SUCCEEDED" and exists:
                self.mismatch(f"round {i}: job{i} is {job_state} but export {target} exists")
            if exists:
                self.exported[target] = ds

        if listed != set(self.committed):
            self.mismatch(f"round {i}: ls shows {sorted(listed)}, expected "
                          f"{sorted(self.committed)}")
        for ckpt in sorted(listed & set(self.committed)):
            self.verify_checkpoint(ckpt, self.committed[ckpt])
        entries = sorted(p.name for p in self.exports.iterdir())
        if entries != sorted(self.exported):
            self.mismatch(f"round {i}: the export root holds {entries}, expected only the "
                          f"complete exports {sorted(self.exported)}")
        for name, eds in sorted(self.exported.items()):
            self.verify_export(name, eds)
        # Bounded disk use: verified exports beyond the last few are removed (by the harness,
        # as an operator would; ckptd never touches a finished export).
        while len(self.exported) > 3:
            oldest = min(self.exported, key=lambda n: int(n[2:]))
            shutil.rmtree(self.exports / oldest)
            del self.exported[oldest]
        if self.args.verbose:
            print(f"chaos: round {i}: {kind} {target} killed after {delay:.3f} s "
                  f"({'completed' if done else 'interrupted: ' + err.strip()[-80:]})"
                  f"{'' if job_state is None else ', job ' + job_state}; "
                  f"{len(listed)} stored, {len(self.exported)} exports", flush=True)

    def run(self) -> int:
        t0 = time.monotonic()
        try:
            self.prepare()
            for i in range(1, self.args.n + 1):
                self.round(i)
                if len(self.mismatches) >= 10:
                    break
            self.stop()
        except Failure as e:
            self.mismatch(str(e))
        finally:
            if self.proc is not None:
                self.proc.kill()
                self.proc.wait()
        summary = (f"{self.kills} kills, {self.verified} checkpoints verified, "
                   f"{len(self.mismatches)} mismatches")
        print(f"chaos: {summary} ({time.monotonic() - t0:.0f} s, seed {self.args.seed}; "
              + ", ".join(f"{k}: {v}" for k, v in sorted(self.outcomes.items())) + ")")
        print(summary)
        if self.mismatches or self.args.keep:
            print(f"chaos: work directory kept: {self.work}", file=sys.stderr)
        else:
            shutil.rmtree(self.work, ignore_errors=True)
        return 1 if self.mismatches else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckptd", required=True)
    ap.add_argument("--ckptctl", required=True)
    ap.add_argument("-n", type=int, default=5, help="kills (rounds)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    ap.add_argument("--big-mib", type=int, default=8, help="size of the generated checkpoint")
    ap.add_argument("--job-mib-s", type=int, default=32,
                    help="ckptd --job-bandwidth-mib, so that jobs last long enough to interrupt")
    ap.add_argument("--max-delay", type=float, default=0.8,
                    help="largest delay (s) between starting a job and the kill (uploads and "
                         "deletes: 0.4 of it)")
    ap.add_argument("--max-stored", type=int, default=6,
                    help="stored checkpoints beyond which deletes are favoured")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per round")
    args = ap.parse_args()
    if args.n < 1 or args.big_mib < 1:
        ap.error("-n and --big-mib must be positive")
    if args.seed is None:
        args.seed = int(time.time())
    return Chaos(args).run()


if __name__ == "__main__":
    sys.exit(main())
