"""Uploads, strategies and checkpoints from Python, checked against ckptctl; every MindSpore dtype
and the 512 MiB chunking of fetch_to_file."""

import json
import os
import pathlib
import shutil
import tempfile

import numpy as np
import pytest

import ckptd
import ckptd_testing as T
from test_fetch import assert_matches_file


def _utf32(text):
    return text.encode("utf-32-le")


def write_ms_checkpoint(path, tensors):
    """Writes {name: (dtype, dims, bytes)} in order as a whole-tensor .ckpt, with protobuf from
    MindSpore's .proto (independently of the client's own writer)."""
    import sys
    sys.path.insert(0, T.PY_PROTO_DIR)
    import mindspore_checkpoint_pb2 as ms
    checkpoint = ms.Checkpoint()
    for name, (dtype, dims, content) in tensors.items():
        value = checkpoint.value.add()
        value.tag = name
        value.tensor.dims.extend(dims)
        value.tensor.tensor_type = dtype
        value.tensor.tensor_content = content
    with open(path, "wb") as f:
        f.write(checkpoint.SerializeToString())


def every_dtype_file(path):
    """A whole-tensor .ckpt holding every MindSpore dtype (write_ms_checkpoint). Returns
    {name: (dtype, dims, bytes)}."""
    rng = np.random.default_rng(7)
    tensors = {
        "bool": ("Bool", [3, 4], rng.integers(0, 2, 12, dtype=np.uint8).tobytes()),
        "int8": ("Int8", [5], rng.integers(-128, 128, 5, dtype=np.int8).tobytes()),
        "uint8": ("UInt8", [2, 3], rng.integers(0, 256, 6, dtype=np.uint8).tobytes()),
        "int16": ("Int16", [3, 2], rng.integers(-2**15, 2**15, 6, dtype=np.int16).tobytes()),
        "uint16": ("UInt16", [4], rng.integers(0, 2**16, 4, dtype=np.uint16).tobytes()),
        "int32": ("Int32", [2, 2], rng.integers(-2**31, 2**31, 4, dtype=np.int32).tobytes()),
        "uint32": ("UInt32", [3], rng.integers(0, 2**32, 3, dtype=np.uint32).tobytes()),
        "int64": ("Int64", [2, 3], rng.integers(-2**63, 2**63, 6, dtype=np.int64).tobytes()),
        "uint64": ("UInt64", [4, 2], rng.integers(0, 2**64, 8, dtype=np.uint64).tobytes()),
        "float16": ("Float16", [3, 3], rng.standard_normal(9).astype(np.float16).tobytes()),
        "float32": ("Float32", [2, 2, 3], rng.standard_normal(12).astype(np.float32).tobytes()),
        "float64": ("Float64", [7], rng.standard_normal(7).tobytes()),
        "bfloat16": ("BFloat16", [4, 6], rng.integers(0, 2**16, 24, dtype=np.uint16).tobytes()),
        "int4": ("Int4", [3, 8], rng.integers(0, 256, 12, dtype=np.uint8).tobytes()),
        "scalar": ("Float32", [], np.float32(2.5).tobytes()),
        "name": ("str", [0], _utf32("h\u00e9llo \u4e16\u754c")),
    }
    write_ms_checkpoint(path, tensors)
    return tensors


def test_every_dtype_round_trips_exactly(server, client, tmp_path):
    source = tmp_path / "every.ckpt"
    tensors = every_dtype_file(source)
    result = client.upload_file("every-py", source)
    assert result.committed and result.ranks_total == 1
    T.ctl(server, "upload", "every-ctl", "--file", source)
    reference = tmp_path / "reference.ckpt"
    T.ctl_fetch(server, "every-ctl", reference, merged=True)
    for checkpoint in ("every-py", "every-ctl"):
        fetched = client.fetch(checkpoint, merged=True)
        assert_matches_file(fetched, reference)
        for name, (dtype, dims, content) in tensors.items():
            assert fetched[name].tobytes() == content, name
        mine = tmp_path / f"{checkpoint}.ckpt"
        client.fetch_to_file(checkpoint, merged=True, path=mine)
        assert mine.read_bytes() == reference.read_bytes()
    fetched = client.fetch("every-py", merged=True)
    assert fetched["name"][()] == "h\u00e9llo \u4e16\u754c"
    assert fetched["int4"].shape == (3, 4) and fetched["int4"].dtype == np.uint8
    assert fetched["bfloat16"].dtype == np.uint16
    assert fetched["scalar"].shape == () and fetched["scalar"][()] == np.float32(2.5)
    assert fetched["bool"].dtype == np.bool_
    wide = client.fetch("every-py", merged=True, upcast=True)
    assert wide["bfloat16"].dtype == np.float32 and wide["float16"].dtype == np.float32
    assert wide["int4"].tobytes() == fetched["int4"].tobytes()


def test_tensors_around_the_batch_bounds_round_trip_as_ckptctl_uploads_them(server, client,
                                                                            tmp_path):
    # The client batches every non-str tensor of at most one message (1 MiB), at most 4096 and
    # 1 MiB of bytes to a batch: more tiny tensors than one batch holds, tensors of exactly a
    # message, one byte over it, two that do not fit one batch together, an empty one and a str
    # one between them.
    rng = np.random.default_rng(11)
    tensors = {}
    for i in range(2500):
        tensors[f"tiny.{i:05d}"] = ("Float32", [2], rng.standard_normal(2).astype(np.float32))
    tensors["exact"] = ("Int8", [1 << 20], rng.integers(-128, 128, 1 << 20, dtype=np.int8))
    tensors["over"] = ("Int8", [(1 << 20) + 1], rng.integers(-128, 128, (1 << 20) + 1,
                                                             dtype=np.int8))
    tensors["empty"] = ("Float32", [3, 0], np.zeros(0, dtype=np.float32))
    tensors["half.a"] = ("Int8", [600 << 10], rng.integers(-128, 128, 600 << 10, dtype=np.int8))
    tensors["half.b"] = ("Int8", [600 << 10], rng.integers(-128, 128, 600 << 10, dtype=np.int8))
    for i in range(2500, 5000):
        tensors[f"tiny.{i:05d}"] = ("Float32", [2], rng.standard_normal(2).astype(np.float32))
    contents = {name: (dtype, dims, array.tobytes()) for name, (dtype, dims, array)
                in tensors.items()}
    contents["text"] = ("str", [0], _utf32("between batches"))
    source = tmp_path / "bounds.ckpt"
    write_ms_checkpoint(source, contents)

    assert client.upload_file("bounds-py", source).committed
    T.ctl(server, "upload", "bounds-ctl", "--file", source)
    reference = tmp_path / "reference.ckpt"
    T.ctl_fetch(server, "bounds-ctl", reference, merged=True)
    fetched = client.fetch("bounds-py", merged=True)
    assert_matches_file(fetched, reference)
    assert len(fetched) == len(tensors) + 1
    for name, (dtype, dims, array) in tensors.items():
        assert fetched[name].tobytes() == array.tobytes(), name
    assert fetched["text"][()] == "between batches"
    mine = tmp_path / "mine.ckpt"
    client.fetch_to_file("bounds-py", merged=True, path=mine)
    assert mine.read_bytes() == reference.read_bytes()


def test_fetch_to_file_splits_tensors_over_512_mib_as_ckptctl(server, client, tmp_path):
    # One Float32 tensor of 520 MiB: two Values (512 MiB + 8 MiB), as MindSpore writes them.
    rows, cols = 130, 1 << 20
    source = tmp_path / "big.ckpt"
    from ckptd._ckpt_file import CkptWriter
    row = np.arange(cols, dtype=np.uint32) * np.uint32(2654435761)
    with open(source, "wb") as f:
        writer = CkptWriter(f)
        writer.begin_tensor("big.weight", "Float32", [rows, cols], rows * cols * 4)
        for r in range(rows):
            row[0] = r  # rows differ, so that a misplaced chunk shows
            writer.append(row.data)
        writer.finish()
    client.upload_file("big", source)
    os.unlink(source)
    # The two 520 MiB outputs go to memory when there is room (nothing here is about the disk).
    out = tmp_path
    if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 4 << 30:
        out = pathlib.Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        reference = out / "reference.ckpt"
        mine = out / "mine.ckpt"
        T.ctl_fetch(server, "big", reference, merged=True)
        client.fetch_to_file("big", merged=True, path=mine)
        assert os.path.getsize(mine) == os.path.getsize(reference) > 512 << 20
        with open(reference, "rb") as a, open(mine, "rb") as b:
            while True:
                x = a.read(64 << 20)
                assert x == b.read(64 << 20)
                if not x:
                    break
        assert T.value_count(mine) == 2
    finally:
        if out != tmp_path:
            shutil.rmtree(out)
    client.delete_checkpoint("big")


def test_upload_dir_equals_ckptctl_upload(server, client, sample_dir, tmp_path):
    client.put_strategy("src", sample_dir / "src_strategy.ckpt")
    client.put_strategy("d3", sample_dir / "dst_strategy.json")
    progress = []
    summary = client.upload_dir("py", "src", sample_dir / "checkpoint", parallelism=3,
                                progress=lambda done, total: progress.append((done, total)))
    assert summary.committed and summary.ranks_total == 8 and summary.ranks_received == 8
    assert [r.rank for r in summary.ranks] == list(range(8))
    assert summary.file_bytes == sum(
        os.path.getsize(sample_dir / "checkpoint" / f"rank_{r}" / "sample-1_10.ckpt")
        for r in range(8))
    assert progress[-1] == (summary.file_bytes, summary.file_bytes)
    T.ctl_upload_dir(server, "ctl", "src", sample_dir / "checkpoint")
    mine, theirs = client.describe("py"), client.describe("ctl")

    def stable(t):
        # The server de-duplicates equal verbatim values of ranks uploaded at the same time
        # racily (ckptctl's uploads also store 1 or 2 copies of the sample's learning_rate), so
        # only a sharded tensor's stored slices are compared.
        return t if t.kind == "sharded" else (t.name, t.dtype, t.global_shape, t.layout)

    assert [stable(t) for t in mine.tensors] == [stable(t) for t in theirs.tensors]
    assert (mine.info.source_strategy, mine.info.ranks, mine.info.tensor_count,
            mine.info.logical_bytes) == \
        (theirs.info.source_strategy, theirs.info.ranks, theirs.info.tensor_count,
         theirs.info.logical_bytes)
    assert summary.bytes_stored == mine.info.stored_bytes
    for rank in range(3):
        a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
        T.ctl_fetch(server, "py", a, dst_strategy="d3", rank=rank)
        T.ctl_fetch(server, "ctl", b, dst_strategy="d3", rank=rank)
        assert a.read_bytes() == b.read_bytes()


def test_upload_rank_by_rank_commits_on_the_last(server, client, sample_dir):
    client.put_strategy("src", sample_dir / "src_strategy.ckpt", overwrite=True)
    for rank in range(8):
        result = client.upload_rank("ranks", "src", rank,
                                    sample_dir / "checkpoint" / f"rank_{rank}" / "sample-1_10.ckpt")
        assert result.ranks_received == rank + 1 and result.ranks_total == 8
        assert result.committed == (rank == 7)
        assert ("ranks" in [c.id for c in client.list_checkpoints()]) == (rank == 7)


def test_malformed_rank_file_is_invalid_argument_and_commits_nothing(server, client, sample_dir,
                                                                     tmp_path):
    client.put_strategy("src", sample_dir / "src_strategy.ckpt", overwrite=True)
    broken = tmp_path / "checkpoint"
    for rank in range(8):
        (broken / f"rank_{rank}").mkdir(parents=True)
        content = (sample_dir / "checkpoint" / f"rank_{rank}" / "sample-1_10.ckpt").read_bytes()
        if rank == 5:
            content = content[:len(content) // 2]  # cut inside a tensor's content
        (broken / f"rank_{rank}" / "sample-1_10.ckpt").write_bytes(content)
    with pytest.raises(ckptd.InvalidArgument) as error:
        client.upload_dir("broken", "src", broken, parallelism=2)
    assert "rank_5/sample-1_10.ckpt" in error.value.message
    assert "past the end of the file" in error.value.message
    assert "broken" not in [c.id for c in client.list_checkpoints()]


def test_strategies_put_get_list_delete(server, client, sample_dir):
    info = client.put_strategy("s-bin", sample_dir / "src_strategy.ckpt")
    assert (info.world_size, info.stage_count, info.devices_per_stage) == (8, 2, 4)
    json_info = client.put_strategy("s-json", (sample_dir / "dst_strategy.json").read_bytes())
    assert json_info.world_size == 3
    with pytest.raises(ckptd.AlreadyExists):
        client.put_strategy("s-json", sample_dir / "dst_strategy.json")
    assert client.put_strategy("s-json", sample_dir / "d2col.json", overwrite=True).world_size == 2
    names = [s.name for s in client.list_strategies()]
    assert "s-bin" in names and "s-json" in names
    got = client.get_strategy("s-bin")
    assert got.info == info and got.format == "json"
    reference = json.loads(T.ctl(server, "strategy", "get", "s-bin", "--json").stdout)
    assert json.loads(got.content) == reference
    assert client.get_strategy("s-bin", format="binary").content
    assert client.strategy_info("s-bin") == info
    client.delete_strategy("s-bin")
    with pytest.raises(ckptd.NotFound):
        client.get_strategy("s-bin")
    with pytest.raises(ckptd.NotFound):
        client.strategy_info("s-bin")
    with pytest.raises(ckptd.InvalidArgument):
        client.put_strategy("x", sample_dir)  # a directory
    with pytest.raises(ckptd.InvalidArgument):
        client.put_strategy("x", b"{}", format="yaml")


def test_list_describe_delete_checkpoints(server, client, sample_dir):
    client.put_strategy("src", sample_dir / "src_strategy.ckpt", overwrite=True)
    client.upload_file("whole", sample_dir / "whole.ckpt")
    listed = {c.id: c for c in client.list_checkpoints()}
    assert listed["whole"].source_strategy == "" and listed["whole"].ranks == 1
    description = client.describe("whole")
    assert description.info == listed["whole"]
    assert [t.name for t in description.tensors] == \
        [name for name, _, _, _ in T.decode_ckpt(sample_dir / "whole.ckpt")]
    assert all(t.kind in ("sharded", "verbatim") for t in description.tensors)
    client.delete_checkpoint("whole")
    assert "whole" not in [c.id for c in client.list_checkpoints()]
    with pytest.raises(ckptd.NotFound):
        client.describe("whole")
