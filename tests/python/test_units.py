"""Unit tests of the Python client's pieces, without a server: the Fetch message reader, the
stream checker and tile assembly on crafted streams, the .ckpt codec, dtypes and rank files."""

import itertools
import os
import sys
import time
import zlib

import numpy as np
import pytest
import xxhash

import ckptd
import ckptd_testing as T
from ckptd import _fetch, _wire, dtypes
from ckptd._ckpt_file import CkptFileSink, CkptReader, CkptWriter, TensorStart, upload_stream, \
    value_header
from ckptd._proto import ckpt_pb2 as pb
from ckptd._rank_files import parse_epoch_step, resolve_rank_files, select_rank_file


def h(data):
    return xxhash.xxh3_64_intdigest(bytes(data))


# ---------------------------------------------------------------------------- crafted streams


def summary(tensors, total):
    return pb.FetchResponse(summary=pb.FetchPlanSummary(
        tensor_count=tensors, total_bytes=total, source_ranks=[0])).SerializeToString()


def header(name, dtype, shape, nbytes):
    return pb.FetchResponse(tensor=pb.FetchTensorHeader(
        name=name, dtype=dtype, local_shape=shape, global_shape=shape, box_lo=[0] * len(shape),
        box_hi=shape, total_bytes=nbytes)).SerializeToString()


def rows_message(data, parts=None):
    """Row-major bytes in parts of the given sizes (default: one part), each with its checksum."""
    if parts is None:
        parts = [len(data)]
    sums, offset = [], 0
    for n in parts:
        sums.append(h(data[offset:offset + n]))
        offset += n
    return T.fetch_data(data, part_bytes=parts, part_checksums=sums)


def tiles_message(array, boxes, band_rows):
    """Tiles of `array` (the slice), each the row-major bytes of its box."""
    data, sizes, sums, coords = b"", [], [], []
    for lo, hi in boxes:
        tile = array[tuple(slice(l, u) for l, u in zip(lo, hi))].tobytes()
        data += tile
        sizes.append(len(tile))
        sums.append(h(tile))
        coords += list(lo) + list(hi)
    return T.fetch_data(data, part_bytes=sizes, part_checksums=sums, tile_box=coords,
                        band_rows=band_rows)


def receive(messages, checkpoint="ck"):
    out = {}
    receiver = _fetch.FetchReceiver(checkpoint, _fetch.ArraySink(
        lambda info, array: out.__setitem__(info.name, array)))
    for m in messages:
        receiver.feed(m)
    receiver.end()
    return out


def grid_boxes(first, rows, shape, tile):
    """Boxes tiling rows [first, first + rows) of `shape` with tiles of at most `tile`."""
    ranges = [range(first, first + rows, tile[0])] + [range(0, n, t) for n, t in
                                                      zip(shape[1:], tile[1:])]
    boxes = []
    for lo in itertools.product(*ranges):
        hi = [min(l + t, (first + rows) if d == 0 else shape[d])
              for d, (l, t) in enumerate(zip(lo, tile))]
        boxes.append((list(lo), hi))
    return boxes


def test_data_messages_are_read_in_place():
    data = bytes(range(256)) * 5
    message = T.fetch_data(data, part_bytes=[1000, 280], part_checksums=[1, 2 ** 64 - 1],
                           tile_box=[0, 0, 3, 4], band_rows=7)
    parsed = _wire.parse_data_message(message)
    assert bytes(parsed.data) == data and parsed.data.obj is message  # a view, no copy
    assert (parsed.part_bytes, parsed.part_checksums, parsed.tile_box, parsed.band_rows) == \
        ([1000, 280], [1, 2 ** 64 - 1], [0, 0, 3, 4], 7)
    assert _wire.parse_data_message(summary(1, 2)) is None
    assert _wire.parse_data_message(message[:-1]) is None  # truncated
    # The data field after the others: not the in-place layout, parsed by protobuf instead.
    rest = T.fetch_data(part_bytes=[3], part_checksums=[h(b"abc")])[2:]  # all but the data
    reordered = rest + b"\x0a\x03abc"
    reordered = b"\x1a" + bytes([len(reordered)]) + reordered
    assert _wire.parse_data_message(reordered) is None
    assert receive([summary(1, 3), header("t", "UInt8", [3], 3), reordered])["t"].tobytes() == \
        b"abc"


def test_row_major_data_in_messages_and_parts():
    values = np.arange(60, dtype=np.float32).reshape(6, 10)
    raw = values.tobytes()
    out = receive([summary(2, 2 * len(raw)), header("a", "Float32", [6, 10], len(raw)),
                   rows_message(raw[:100]), rows_message(raw[100:], parts=[20, 1, 119]),
                   header("b", "Float32", [6, 10], len(raw)), rows_message(raw)])
    assert np.array_equal(out["a"], values) and np.array_equal(out["b"], values)


@pytest.mark.parametrize("shape,tile,band_rows", [
    ((12, 10), (4, 3), 8),        # 2-D, edge tiles narrower: per-tile copies
    ((12, 12), (3, 4), 6),        # 2-D, equal tiles: one grid copy per message
    ((24,), (5,), 20),            # 1-D: every tile whole rows
    ((6, 4, 5), (2, 4, 5), 6),    # 3-D whole-row tiles: contiguous runs
    ((6, 4, 5), (3, 2, 5), 6),    # 3-D partial tiles
])
def test_tiles_in_any_order_assemble_the_slice(shape, tile, band_rows):
    values = np.random.default_rng(1).integers(0, 2 ** 16, size=shape, dtype=np.uint16)
    raw = values.tobytes()
    messages = [summary(1, len(raw)), header("t", "BFloat16", list(shape), len(raw))]
    first = 0
    rng = np.random.default_rng(2)
    while first < shape[0]:
        rows = min(band_rows, shape[0] - first)
        boxes = grid_boxes(first, rows, shape, tile)
        if tile[1:] == shape[1:] or tile == (3, 4):
            order = boxes  # keep the grid order the server uses
        else:
            order = [boxes[i] for i in rng.permutation(len(boxes))]
        half = max(1, len(order) // 2)
        messages.append(tiles_message(values, order[:half], rows))
        if order[half:]:
            messages.append(tiles_message(values, order[half:], rows))
        first += rows
    out = receive(messages)
    assert out["t"].dtype == np.uint16 and out["t"].tobytes() == raw


def tile_rows(first, heights, widths, shape):
    """Boxes of tile rows as the server cuts a band: rows of the given heights from `first`,
    each cut along dim 1 into the given widths, spanning every dim after it."""
    boxes, r = [], first
    for height in heights:
        c = 0
        for width in widths:
            boxes.append(([r, c] + [0] * (len(shape) - 2),
                          [r + height, c + width] + list(shape[2:])))
            c += width
        r += height
    return boxes


@pytest.mark.parametrize("shape,heights,widths", [
    ((20, 12), [3, 3, 2, 2, 2, 4, 4], [4, 4, 4]),   # grids of equal tiles, heights changing
    ((20, 12), [3, 3, 2, 2, 2, 4, 4], [5, 5, 2]),   # a narrower last column: one run per row
    ((20, 12), [1, 4, 2, 6, 7], [12]),              # whole rows of different heights: one block
    ((9, 4, 3), [2, 2, 5], [2, 2]),                 # 3-D, tiles spanning the last dim
    ((9, 4, 3), [4, 5], [4]),                       # 3-D whole rows
])
def test_tile_rows_as_the_server_cuts_them(shape, heights, widths):
    values = np.random.default_rng(3).integers(0, 2 ** 31, size=shape, dtype=np.int32)
    raw = values.tobytes()
    boxes = tile_rows(0, heights, widths, shape)
    lo = np.array([b[0] for b in boxes])
    hi = np.array([b[1] for b in boxes])
    assert _fetch._tiles_partition_rows(lo, hi, 0, shape[0], shape)
    # One band, cut across messages at an arbitrary tile; then the same tiles shuffled.
    start = [summary(1, len(raw)), header("t", "Int32", list(shape), len(raw))]
    cut = len(boxes) // 3 + 1
    ordered = start + [tiles_message(values, boxes[:cut], shape[0]),
                       tiles_message(values, boxes[cut:], shape[0])]
    assert receive(ordered)["t"].tobytes() == raw
    shuffled = [boxes[i] for i in np.random.default_rng(4).permutation(len(boxes))]
    assert receive(start + [tiles_message(values, shuffled, shape[0])])["t"].tobytes() == raw


def test_tile_row_partition_check_is_exact():
    shape = (10, 8)
    lo = np.array([[0, 0], [0, 4], [4, 0], [4, 4], [6, 0]])
    hi = np.array([[4, 4], [4, 8], [6, 4], [6, 8], [10, 8]])
    assert _fetch._tiles_partition_rows(lo, hi, 0, 10, shape)
    assert _fetch._tiles_partition_rows(lo[::-1].copy(), hi[::-1].copy(), 0, 10, shape)
    assert not _fetch._tiles_partition_rows(lo, hi, 0, 11, shape)   # not up to the band's end
    assert not _fetch._tiles_partition_rows(lo + [1, 0], hi + [1, 0], 0, 11, shape)
    gap = hi.copy()
    gap[0, 1] = 3                                                     # a hole in the first row
    assert not _fetch._tiles_partition_rows(lo, gap, 0, 10, shape)
    ragged = hi.copy()
    ragged[1, 0] = 5                                                  # row ranges disagree
    assert not _fetch._tiles_partition_rows(lo, ragged, 0, 10, shape)
    assert not _fetch._tiles_partition_rows(np.array([[0, 0], [0, 0]]),
                                            np.array([[2, 8], [2, 8]]), 0, 2, shape)
    # Whatever it accepts never overlaps (brute force over random tile sets).
    rng = np.random.default_rng(6)
    for _ in range(300):
        n = int(rng.integers(1, 6))
        lo = rng.integers(0, 3, size=(n, 2)) * [2, 4]
        hi = lo + rng.integers(1, 3, size=(n, 2)) * [2, 4]
        if _fetch._tiles_partition_rows(lo, hi, 0, int(hi[:, 0].max()), (10, 8)):
            assert not any((np.maximum(lo[i], lo[j]) < np.minimum(hi[i], hi[j])).all()
                           for i in range(n) for j in range(i + 1, n))


def test_checksum_mismatch_names_tensor_and_byte_range():
    raw = bytes(range(200))
    good = _wire.parse_data_message(rows_message(raw[100:], parts=[40, 60]))
    bad = T.fetch_data(raw[100:], part_bytes=[40, 60],
                       part_checksums=[good.part_checksums[0], good.part_checksums[1] ^ 1])
    with pytest.raises(ckptd.DataLoss) as error:
        receive([summary(1, 200), header("w", "UInt8", [200], 200), rows_message(raw[:100]), bad],
                checkpoint="run-1")
    assert "checkpoint run-1 tensor w: bytes [140, 200) failed their XXH3-64 checksum" in \
        error.value.message
    flipped = bytearray(rows_message(raw))
    flipped[10] ^= 0xFF  # inside the data
    with pytest.raises(ckptd.DataLoss, match=r"tensor w: bytes \[0, 200\)"):
        receive([summary(1, 200), header("w", "UInt8", [200], 200), bytes(flipped)])



def test_tile_checksum_mismatch_fails_the_band_before_the_sink_sees_it(tmp_path):
    """Tiles are checked after their copy into the band: a flipped byte in any tile is DataLoss
    naming the tile's bytes, and the band never reaches the sink (no file is written)."""
    values = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    boxes = grid_boxes(0, 8, [8, 12], [4, 4])
    message = tiles_message(values, boxes, band_rows=8)
    good = _wire.parse_data_message(message)
    tile_bytes = 4 * 4 * 4
    start = [summary(1, values.nbytes), header("t", "Float32", [8, 12], values.nbytes)]
    assert np.array_equal(receive(start + [message])["t"], values)
    for i in (0, 4, len(boxes) - 1):
        flipped = bytearray(good.data)
        flipped[i * tile_bytes + 5] ^= 0x10
        bad = T.fetch_data(bytes(flipped), part_bytes=good.part_bytes,
                           part_checksums=good.part_checksums, tile_box=good.tile_box,
                           band_rows=8)
        with pytest.raises(ckptd.DataLoss,
                           match=rf"tensor t: bytes \[{i * tile_bytes}, {(i + 1) * tile_bytes}\)"
                                 r" failed their XXH3-64 checksum"):
            receive(start + [bad])
        # One tile per message: the single-part path.
        single = [tiles_message(values, [box], band_rows=8) for box in boxes]
        one = _wire.parse_data_message(single[i])
        corrupt = bytearray(one.data)
        corrupt[3] ^= 0x01
        single[i] = T.fetch_data(bytes(corrupt), part_bytes=one.part_bytes,
                                 part_checksums=one.part_checksums, tile_box=one.tile_box,
                                 band_rows=8)
        with pytest.raises(ckptd.DataLoss, match=r"tensor t: .* failed their XXH3-64 checksum"):
            receive(start + single)
        # The file holds what the tensor's start wrote and nothing of the band.
        sizes = []
        for messages in (start, start + [bad]):
            path = tmp_path / f"t{i}-{len(messages)}.ckpt"
            with open(path, "wb") as out:
                receiver = _fetch.FetchReceiver("ck", CkptFileSink(out))
                try:
                    for m in messages:
                        receiver.feed(m)
                except ckptd.DataLoss:
                    pass
            sizes.append(path.stat().st_size)
        assert sizes[0] == sizes[1]

def test_malformed_streams_are_refused():
    values = np.arange(16, dtype=np.uint8).reshape(4, 4)
    start = [summary(1, 16), header("t", "UInt8", [4, 4], 16)]
    # Two tiles of 6 elements in a band of 8.
    overlapping = tiles_message(values, [([0, 0], [2, 3]), ([0, 1], [2, 4])], 2)
    with pytest.raises(ckptd.DataLoss, match="overlap"):
        receive(start + [overlapping])
    # Volumes that add up but overlap, leaving a hole.
    boxes = [([0, 0], [1, 4]), ([0, 0], [1, 2]), ([0, 2], [1, 4]), ([1, 0], [2, 2])]
    with pytest.raises(ckptd.DataLoss, match="overlap"):
        receive(start + [tiles_message(values, boxes, 2)])
    with pytest.raises(ckptd.DataLoss, match="leaves the band"):
        receive(start + [tiles_message(values, [([0, 0], [3, 4])], 2)])
    with pytest.raises(ckptd.DataLoss, match="incomplete"):
        receive(start + [tiles_message(values, [([0, 0], [2, 2])], 2)])
    with pytest.raises(ckptd.DataLoss, match="0 part sizes and 0 part checksums"):
        receive(start + [T.fetch_data(bytes(16))])
    with pytest.raises(ckptd.DataLoss, match="1 part sizes and 2 part checksums"):
        receive(start + [T.fetch_data(bytes(16), part_bytes=[16], part_checksums=[1, 2])])
    with pytest.raises(ckptd.DataLoss, match="lists part 1 of 0 bytes at offset 8"):
        receive(start + [T.fetch_data(bytes(16), part_bytes=[8, 0, 8],
                                      part_checksums=[h(bytes(8)), h(b""), h(bytes(8))])])
    with pytest.raises(ckptd.DataLoss, match="lists part 1 of 12 bytes at offset 8"):
        receive(start + [T.fetch_data(bytes(16), part_bytes=[8, 12],
                                      part_checksums=[h(bytes(8)), h(bytes(8))])])
    with pytest.raises(ckptd.DataLoss, match="the parts of a data message cover 8 of its 16"):
        receive(start + [T.fetch_data(bytes(16), part_bytes=[8], part_checksums=[h(bytes(8))])])
    with pytest.raises(ckptd.DataLoss, match="more than its 16 announced bytes"):
        receive(start + [rows_message(bytes(17))])
    with pytest.raises(ckptd.DataLoss, match="received 8 of 16 bytes"):
        receive(start + [rows_message(bytes(8))])
    with pytest.raises(ckptd.DataLoss, match="beyond the plan"):
        receive(start + [rows_message(bytes(16)), header("u", "UInt8", [1], 1)])
    with pytest.raises(ckptd.DataLoss, match="ended after 1 of 1 tensors and 16 of 20 bytes"):
        receive([summary(1, 20)] + start[1:] + [rows_message(bytes(16))])
    with pytest.raises(ckptd.Internal, match="outside a tensor"):
        receive([summary(1, 16), rows_message(bytes(16))])
    with pytest.raises(ckptd.Internal, match="before its plan summary"):
        receive(start[1:])
    with pytest.raises(ckptd.Internal, match="unknown kind"):
        receive([b""])
    with pytest.raises(ckptd.Internal, match="unknown dtype"):
        receive([summary(1, 4), header("x", "Float8", [4], 4)])


def test_tiles_overlap_on_many_boxes_matches_brute_force():
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(33, 80))
        lo = rng.integers(0, 50, size=(n, 3))
        hi = lo + rng.integers(1, 4, size=(n, 3))
        brute = any((np.maximum(lo[i], lo[j]) < np.minimum(hi[i], hi[j])).all()
                    for i in range(n) for j in range(i + 1, n))
        assert _fetch._tiles_overlap(lo, hi) == brute
    grid = np.array([[r, c] for r in range(0, 40, 4) for c in range(0, 40, 5)])
    assert not _fetch._tiles_overlap(grid, grid + [4, 5])
    shifted = grid.copy()
    shifted[7] += [1, 0]
    assert _fetch._tiles_overlap(shifted, shifted + [4, 5])


def test_fetch_into_a_ckpt_assembles_bands_like_arrays(tmp_path):
    values = np.random.default_rng(3).standard_normal((12, 10)).astype(np.float32)
    raw = values.tobytes()
    boxes = grid_boxes(0, 8, (12, 10), (4, 3))
    messages = [summary(1, len(raw)), header("w", "Float32", [12, 10], len(raw)),
                tiles_message(values, boxes[::-1], 8), rows_message(raw[8 * 40:])]
    with open(tmp_path / "mine.ckpt", "wb") as f:
        sink = CkptFileSink(f)
        receiver = _fetch.FetchReceiver("ck", sink)
        for m in messages:
            receiver.feed(m)
        receiver.end()
        sink.finish()
    with open(tmp_path / "expected.ckpt", "wb") as f:
        writer = CkptWriter(f)
        writer.begin_tensor("w", "Float32", [12, 10], len(raw))
        writer.append(raw)
    assert (tmp_path / "mine.ckpt").read_bytes() == (tmp_path / "expected.ckpt").read_bytes()


# ---------------------------------------------------------------------------- .ckpt codec


def _ms():
    sys.path.insert(0, T.PY_PROTO_DIR)
    import mindspore_checkpoint_pb2 as ms
    return ms


def test_value_framing_is_protobufs():
    ms = _ms()
    for name, dtype, dims, content in [("w", "Float32", [2, 3], bytes(24)),
                                       ("\u00e9t\u00e9", "str", [0], "ab".encode("utf-32-le")),
                                       ("s", "Int64", [], bytes(8)),
                                       ("neg", "Int8", [-1, 300], b""),
                                       ("big", "UInt8", [200000], bytes(200000))]:
        checkpoint = ms.Checkpoint()
        value = checkpoint.value.add()
        value.tag = name
        value.tensor.dims.extend(dims)
        value.tensor.tensor_type = dtype
        value.tensor.tensor_content = content
        assert value_header(name, dtype, dims, len(content)) + content == \
            checkpoint.SerializeToString()


def test_writer_splits_values_and_reader_joins_them(tmp_path):
    path = tmp_path / "chunked.ckpt"
    a = np.arange(100, dtype=np.int32)
    with open(path, "wb") as f:
        writer = CkptWriter(f, slice_bytes=64)
        writer.begin_tensor("a", "Int32", [100], a.nbytes)
        for i in range(0, 100, 7):
            writer.append(a[i:i + 7].data)
        writer.begin_tensor("empty", "Float32", [0, 3], 0)
        writer.begin_tensor("s", "str", [0], 8)
        writer.append("hi".encode("utf-32-le"))
        writer.finish()
    assert T.value_count(path) == 7 + 1 + 1  # 400 bytes in 64-byte Values
    decoded = T.decode_ckpt(path)
    assert decoded[0] == ("a", "Int32", [100], a.tobytes())
    assert decoded[1][:3] == ("empty", "Float32", [0, 3])
    with CkptReader(path) as reader:
        items = list(upload_stream(reader, max_bytes=50))
    starts = [i for i in items if isinstance(i, TensorStart)]
    assert [(s.name, s.dtype, s.dims, s.total_bytes) for s in starts] == \
        [("a", "Int32", [100], 400), ("empty", "Float32", [0, 3], 0), ("s", "str", [0], 8)]
    pieces = [bytes(i) for i in items if not isinstance(i, TensorStart)]
    assert all(len(p) <= 50 for p in pieces)
    assert b"".join(pieces) == a.tobytes() + "hi".encode("utf-32-le")


def test_reader_verifies_a_crc_trailer_and_refuses_bad_files(tmp_path):
    ms = _ms()
    checkpoint = ms.Checkpoint()
    value = checkpoint.value.add()
    value.tag = "w"
    value.tensor.dims.extend([4])
    value.tensor.tensor_type = "Float32"
    value.tensor.tensor_content = bytes(range(16))
    body = checkpoint.SerializeToString()
    good = tmp_path / "good.ckpt"
    good.write_bytes(body + b"crc_num" + zlib.crc32(body).to_bytes(10, "big"))
    with CkptReader(good) as reader:
        assert len([i for i in upload_stream(reader, 1 << 20)]) == 2
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(body + b"crc_num" + (zlib.crc32(body) ^ 1).to_bytes(10, "big"))
    with pytest.raises(ckptd.DataLoss, match="crc_num"):
        with CkptReader(bad) as reader:
            list(upload_stream(reader, 1 << 20))
    # Content before the type: read whole, still correct.
    reordered = tmp_path / "reordered.ckpt"
    raw_tensor = (b"\x1a\x08" + bytes(8) + b"\x08\x02" + b"\x12\x05Int32")
    inner = b"\x0a\x01v" + b"\x12" + bytes([len(raw_tensor)]) + raw_tensor
    reordered.write_bytes(b"\x0a" + bytes([len(inner)]) + inner)
    assert T.decode_ckpt(reordered) == [("v", "Int32", [2], bytes(8))]
    with CkptReader(reordered) as reader:
        items = list(upload_stream(reader, 1 << 20))
    assert items[0].total_bytes == 8 and bytes(items[1]) == bytes(8)
    unknown = tmp_path / "unknown.ckpt"
    unknown.write_bytes(body.replace(b"Float32", b"Float33"))
    with pytest.raises(ckptd.InvalidArgument, match="unknown tensor_type 'Float33'"):
        with CkptReader(unknown) as reader:
            list(upload_stream(reader, 1 << 20))
    short = tmp_path / "short.ckpt"
    short.write_bytes(body[:len(body) // 2])
    with pytest.raises(ckptd.InvalidArgument, match="short.ckpt"):
        with CkptReader(short) as reader:
            list(upload_stream(reader, 1 << 20))
    mismatch = ms.Checkpoint()
    v = mismatch.value.add()
    v.tag = "w"
    v.tensor.dims.extend([5])
    v.tensor.tensor_type = "Float32"
    v.tensor.tensor_content = bytes(16)
    wrong = tmp_path / "wrong.ckpt"
    wrong.write_bytes(mismatch.SerializeToString())
    with pytest.raises(ckptd.InvalidArgument, match="its dims need 20"):
        with CkptReader(wrong) as reader:
            list(upload_stream(reader, 1 << 20))


# ---------------------------------------------------------------------------- dtypes and files


def test_dtype_layouts_and_bfloat16():
    assert set(dtypes.MINDSPORE_DTYPES) == {
        "Bool", "Int8", "UInt8", "Int16", "UInt16", "Int32", "UInt32", "Int64", "UInt64",
        "Float16", "Float32", "Float64", "BFloat16", "Int4", "str"}
    assert dtypes.array_layout("Int4", (3, 8), 12) == (np.dtype(np.uint8), (3, 4))
    assert dtypes.array_layout("Float32", (0,), 4) == (np.dtype(np.float32), ())  # dims [0]
    assert dtypes.array_layout("str", (0,), 12) == (np.dtype("<U3"), ())
    with pytest.raises(ValueError):
        dtypes.array_layout("Float32", (2, 2), 12)
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0001, 0x3E20], dtype=np.uint16)
    wide = ckptd.bfloat16_to_float32(bits)
    assert wide.dtype == np.float32
    assert wide[:3].tolist() == [1.0, -2.0, float("inf")]
    assert wide.view(np.uint32).tolist() == [b << 16 for b in bits.tolist()]


def test_rank_files_are_found_as_the_cpp_client_finds_them(tmp_path):
    assert parse_epoch_step("net-rank-3-12_345.ckpt") == (12, 345)
    assert parse_epoch_step("final.ckpt") is None and parse_epoch_step("a-1_2.txt") is None
    rank = tmp_path / "rank_0"
    rank.mkdir()
    for name in ("m-9_10.ckpt", "m-10_10.ckpt", "m-10_9.ckpt"):
        (rank / name).write_bytes(b"")
    assert os.path.basename(select_rank_file(str(rank))) == "m-10_10.ckpt"
    later = rank / "final.ckpt"
    later.write_bytes(b"")
    os.utime(later, (time.time() + 10, time.time() + 10))
    assert os.path.basename(select_rank_file(str(rank))) == "final.ckpt"
    (tmp_path / "rank_1").mkdir()
    (tmp_path / "rank_1" / "x.ckpt").write_bytes(b"")
    (tmp_path / "rank_backup").mkdir()
    assert len(resolve_rank_files(str(tmp_path), 2)) == 2
    with pytest.raises(ckptd.InvalidArgument, match="missing rank_2"):
        resolve_rank_files(str(tmp_path), 3)
    with pytest.raises(ckptd.InvalidArgument, match="unexpected rank_1 beyond the world"):
        resolve_rank_files(str(tmp_path), 1)
    (tmp_path / "rank_2").mkdir()
    with pytest.raises(ckptd.NotFound, match="holds no .ckpt"):
        resolve_rank_files(str(tmp_path), 3)


def test_malloc_tuning_applies_on_glibc():
    import subprocess
    run = subprocess.run([sys.executable, "-c", "import ckptd.malloc_tuning as m; "
                          "print(m.tune_malloc_for_streaming())"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "True", run.stderr


# Allocates, fills and frees 384 MiB of 8 MiB arrays (more than any fixed trim threshold a
# streaming policy would pick below a rank's size), then does it again, and prints what the
# second round cost in page faults and how much of the first round's memory was kept when freed.
_REUSE_PROBE = """
import resource, sys
import numpy as np
import ckptd.malloc_tuning as m
if sys.argv[1] == "tuned":
    assert m.tune_malloc_for_streaming()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
def fill():
    arrays = [np.empty(8 << 20, np.uint8) for _ in range(48)]
    for a in arrays:
        a.fill(1)
    return arrays
arrays = fill()
held = rss()
del arrays
kept = rss() - (held - (384 << 20))
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
arrays = fill()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, kept)
"""


def test_malloc_tuning_keeps_freed_arrays_for_the_next_fetch():
    # A fetch's arrays freed are the next fetch's arrays: with the policy nothing is handed back
    # to the kernel, so the second round needs (almost) no fresh pages; glibc's defaults unmap
    # and fault all of them again.
    import subprocess

    def probe(mode):
        run = subprocess.run([sys.executable, "-c", _REUSE_PROBE, mode], capture_output=True,
                             text=True, env=dict(os.environ))
        assert run.returncode == 0, run.stderr
        faults, kept = (int(x) for x in run.stdout.split())
        return faults, kept

    faults, kept = probe("tuned")
    assert kept >= (384 << 20) * 0.95, f"only {kept >> 20} MiB of 384 MiB freed kept"
    # 384 MiB is 192 huge pages or 98304 small ones; a handful of faults is the interpreter's.
    assert faults < 64, f"{faults} page faults refilling memory the process had freed"
    untuned_faults, untuned_kept = probe("default")
    assert untuned_kept < (384 << 20) * 0.5 and untuned_faults > 2 * max(faults, 32)
