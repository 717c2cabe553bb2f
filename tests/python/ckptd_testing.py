"""Helpers of the Python client's tests: a real ckptd on 127.0.0.1:0, ckptctl as the reference
client, and an independent decoder of .ckpt files (protobuf's, from the MindSpore .proto).

The tests find the programs and modules through the environment that ctest sets
(tests/CMakeLists.txt): CKPTD_BIN, CKPTCTL_BIN, CKPT_PY_PROTO_DIR, and PYTHONPATH holding the
built ckptd package. Every ckptctl flag whose name depends on the API version is spelled here.
"""

import json
import os
import signal
import subprocess
import sys
import time

CKPTD = os.environ.get("CKPTD_BIN", "")
CKPTCTL = os.environ.get("CKPTCTL_BIN", "")
PY_PROTO_DIR = os.environ.get("CKPT_PY_PROTO_DIR", "")

# ckptctl's flag naming the destination strategy of fetch, deps, export and transform.
DST_STRATEGY_FLAG = "--dst-strategy"
# ckptctl's flag naming the source strategy of upload.
SRC_STRATEGY_FLAG = "--strategy"


def require_environment():
    missing = [name for name, value in (("CKPTD_BIN", CKPTD), ("CKPTCTL_BIN", CKPTCTL),
                                        ("CKPT_PY_PROTO_DIR", PY_PROTO_DIR)) if not value]
    if missing:
        raise RuntimeError(f"run these tests through ctest (missing {', '.join(missing)})")


class Server:
    """A ckptd process with its store in `data_dir`, listening on a free port of 127.0.0.1."""

    def __init__(self, data_dir, extra_args=()):
        self.data_dir = str(data_dir)
        self.extra_args = list(extra_args)
        self.process = None
        self.address = None
        self.log_path = self.data_dir + ".log"

    def start(self):
        port_file = self.data_dir + ".port"
        if os.path.exists(port_file):
            os.unlink(port_file)
        args = [CKPTD, "--listen", "127.0.0.1:0", "--data", self.data_dir, "--port-file",
                port_file, "--min-free-disk-mib", "64"] + self.extra_args
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with open(port_file) as f:
                    port = int(f.read().strip() or 0)
            except (OSError, ValueError):
                port = 0
            if port > 0:
                self.address = f"127.0.0.1:{port}"
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"ckptd exited during start-up: {self.log()}")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"ckptd did not start: {self.log()}")

    def stop(self):
        """SIGTERM, then SIGKILL after 30 s; returns the exit status."""
        if self.process is None:
            return None
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = self.process.wait()
        self.process = None
        return status

    def kill(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""


def ctl(server, *args, check=True):
    """Runs ckptctl against `server` (None: an offline subcommand); returns CompletedProcess."""
    command = [CKPTCTL] + ([] if server is None else ["--server", server.address])
    command += [str(a) for a in args]
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({result.returncode}): "
                             f"{result.stderr}{result.stdout}")
    return result


def ctl_upload_dir(server, checkpoint, source_strategy, directory):
    return ctl(server, "upload", checkpoint, SRC_STRATEGY_FLAG, source_strategy, "--dir",
               directory)


def ctl_fetch(server, checkpoint, out, dst_strategy=None, rank=None, merged=False, include=(),
              exclude=()):
    args = ["fetch", checkpoint, "--out", out]
    if merged:
        args.append("--merged")
    else:
        args += [DST_STRATEGY_FLAG, dst_strategy, "--rank", rank]
    for glob in include:
        args += ["--include", glob]
    for glob in exclude:
        args += ["--exclude", glob]
    return ctl(server, *args)


def ctl_deps_json(server, checkpoint, dst_strategy, rank=None):
    args = ["deps", checkpoint, DST_STRATEGY_FLAG, dst_strategy, "--json"]
    args += ["--all"] if rank is None else ["--rank", rank]
    return json.loads(ctl(server, *args).stdout)


def ctl_export(server, checkpoint, dst_strategy, directory):
    return ctl(server, "export", checkpoint, DST_STRATEGY_FLAG, dst_strategy, "--dir", directory)


def ctl_transform_export(server, checkpoint, dst_strategy, directory):
    return ctl(server, "transform", checkpoint, DST_STRATEGY_FLAG, dst_strategy, "--export-dir",
               directory, "--wait")


def decode_ckpt(path):
    """[(name, dtype, dims, joined bytes)] of a .ckpt, decoded by protobuf from MindSpore's
    .proto (consecutive same-name Values joined, as MindSpore's reader does)."""
    if PY_PROTO_DIR not in sys.path:
        sys.path.insert(0, PY_PROTO_DIR)
    import mindspore_checkpoint_pb2 as ms
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) >= 17 and raw[-17:-10] == b"crc_num":
        raw = raw[:-17]
    checkpoint = ms.Checkpoint.FromString(raw)
    tensors = []
    for value in checkpoint.value:
        t = value.tensor
        if tensors and tensors[-1][0] == value.tag:
            tensors[-1][3].append(t.tensor_content)
            continue
        tensors.append((value.tag, t.tensor_type, list(t.dims), [t.tensor_content]))
    return [(name, dtype, dims, b"".join(parts)) for name, dtype, dims, parts in tensors]


def value_count(path):
    """Number of Values (chunks) in a .ckpt without a trailer: walks the outer framing (key 0x0a,
    varint length) and skips each Value's bytes."""
    count = 0
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        while f.tell() < size:
            assert f.read(1) == b"\x0a", f"{path}: not a Checkpoint.value at {f.tell() - 1}"
            length, shift = 0, 0
            while True:
                byte = f.read(1)[0]
                length |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            f.seek(length, os.SEEK_CUR)
            count += 1
        assert f.tell() == size, f"{path}: the last Value runs past the end"
    return count


def fetch_data(data=b"", part_bytes=(), part_checksums=(), tile_box=(), band_rows=0):
    """A FetchResponse{data: FetchData} as the server sends it, serialized (for crafted
    streams): the only place the tests name FetchData's fields."""
    from ckptd._proto import ckpt_pb2 as pb
    return pb.FetchResponse(data=pb.FetchData(
        data=data, part_bytes=list(part_bytes), part_checksums=list(part_checksums),
        tile_box=list(tile_box), band_rows=band_rows)).SerializeToString()


def layout(dev_matrix, tensor_map, opt_shard_size=0):
    """One parameter of a MindSpore JSON strategy."""
    return {"dev_matrix": list(dev_matrix), "tensor_map": list(tensor_map), "field": 0,
            "opt_weight_shard_step": 0, "opt_weight_shard_size": opt_shard_size,
            "param_split_shape": [], "indices_offset": []}


def write_strategy(path, layouts):
    """A single-stage MindSpore JSON strategy file of {name: layout(...)}."""
    with open(path, "w") as f:
        json.dump({"current_stage": 0, "parallel_strategy_item": {},
                   "parallel_layout_item": layouts}, f)
    return path
