"""Receiving a Fetch stream: order and size checks, checksum verification and tile assembly.

`FetchReceiver` consumes the stream's messages as gRPC delivers them (serialized FetchResponse
bytes) and checks them as the C++ client library does (client/client.cc, FetchChecker): the plan
summary first, data only inside a tensor, byte totals equal to the headers and the summary, and
every part of every data message verified with XXH3-64 (seed 0) before a sink can see its bytes:
row-major data before it is handed on, tiles once copied into the sink's band (from the message
still in the CPU's cache) and before the band is complete. Data is handed on as views of the
received message (no copy) to a sink:

  * `ArraySink` places every tensor's bytes into one pre-allocated NumPy array: row-major data
    is copied once into its place, each tile of a band once into its region of the array.
  * `ckptd._ckpt_file.CkptFileSink` writes a MindSpore .ckpt, assembling bands of tiles in a
    buffer first because a file is written front to back.

Nothing here is thread-safe: one receiver per stream.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import xxhash

from ckptd import _wire
from ckptd import dtypes
from ckptd._proto import ckpt_pb2 as pb
from ckptd.errors import DataLoss, Internal

# The largest band of tiles accepted (proto/ckpt.proto: "A band of tiles holds at most 256 MiB").
MAX_BAND_BYTES = 256 << 20

_XXH3 = xxhash.xxh3_64
_XXH3_ONE_SHOT = xxhash.xxh3_64_intdigest
# Parts at least this large are hashed with the hasher object, whose update releases the GIL
# (the one-shot function does not), so that the receiving thread runs meanwhile; smaller ones
# with the one-shot function, which costs less per call than creating a hasher.
_GIL_FREE_HASH_BYTES = 64 << 10


def _xxh3(data) -> int:
    """XXH3-64 (seed 0) of a bytes-like object, without a copy."""
    if len(data) >= _GIL_FREE_HASH_BYTES:
        return _XXH3(data).intdigest()
    return _XXH3_ONE_SHOT(data)


class TensorInfo:
    """What the server announced about one delivered tensor (FetchTensorHeader).

    Attributes:
      name: parameter name.
      dtype: MindSpore dtype spelling ("Float32", "BFloat16", ...).
      local_shape: shape of the delivered slice (the destination rank's local shape).
      global_shape: shape of the whole tensor.
      box_lo, box_hi: the slice in global coordinates, [box_lo[i], box_hi[i]).
      nbytes: bytes of the slice as stored.
      verbatim: True for a value copied unchanged from one source rank.
    """

    __slots__ = ("name", "dtype", "local_shape", "global_shape", "box_lo", "box_hi", "nbytes",
                 "verbatim")

    def __init__(self, header: pb.FetchTensorHeader):
        self.name = header.name
        self.dtype = header.dtype
        self.local_shape = tuple(header.local_shape)
        self.global_shape = tuple(header.global_shape)
        self.box_lo = tuple(header.box_lo)
        self.box_hi = tuple(header.box_hi)
        self.nbytes = header.total_bytes
        self.verbatim = header.verbatim

    def __repr__(self) -> str:
        return (f"TensorInfo(name={self.name!r}, dtype={self.dtype!r}, "
                f"local_shape={self.local_shape}, global_shape={self.global_shape}, "
                f"box_lo={self.box_lo}, box_hi={self.box_hi}, nbytes={self.nbytes}, "
                f"verbatim={self.verbatim})")


class FetchSummary:
    """The plan of a fetch (FetchPlanSummary): tensors and bytes that follow, the source ranks
    read, and the server's non-fatal remarks."""

    __slots__ = ("tensor_count", "total_bytes", "source_ranks", "warnings")

    def __init__(self, summary: pb.FetchPlanSummary):
        self.tensor_count = summary.tensor_count
        self.total_bytes = summary.total_bytes
        self.source_ranks = list(summary.source_ranks)
        self.warnings = list(summary.warnings)

    def __repr__(self) -> str:
        return (f"FetchSummary(tensor_count={self.tensor_count}, "
                f"total_bytes={self.total_bytes}, source_ranks={self.source_ranks}, "
                f"warnings={self.warnings})")


class Sink:
    """Receives a verified fetch in order. Each method may raise an Error to abort it."""

    def begin(self, info: TensorInfo) -> None:
        """A new tensor of `info.nbytes` bytes starts."""

    def rows(self, data: memoryview) -> None:
        """The current tensor's next row-major bytes (valid only during the call)."""

    def band(self, first_row: int, rows: int) -> np.ndarray:
        """A uint8 array of shape local_shape[:first_row..+rows] + (element size,) into which
        the band's tiles are copied; `band_done` follows once they cover it. Until then it may
        hold bytes not yet verified (a failed check aborts the stream, band_done never comes)."""
        raise NotImplementedError

    def band_done(self, nbytes: int) -> None:
        """The band last returned by `band`, of `nbytes` bytes, is complete."""

    def end(self) -> None:
        """The current tensor got all its bytes."""


class IteratorBase:
    """What Client.iter_fetch's iterators share (ckptd.client.FetchIterator on the grpcio path,
    ckptd._native_fetch.NativeFetchIterator on the native one): `info`, the TensorInfo of every
    tensor yielded so far; `close()`, which a subclass implements to cancel the fetch and which
    is also called on leaving a `with` block and when the iterator is dropped; and `_yielded`,
    which a subclass's __next__ returns its tensors through."""

    def __init__(self, upcast: bool):
        self._upcast = upcast
        self.info: Dict[str, TensorInfo] = {}

    def close(self) -> None:
        """Cancels the fetch if it is still running."""
        raise NotImplementedError

    def _yielded(self, info: TensorInfo, array: np.ndarray) -> Tuple[str, np.ndarray]:
        """Records `info` and returns the (name, array) pair to yield, upcast if asked for."""
        if self._upcast:
            array = dtypes.upcast(info.dtype, array)
        self.info[info.name] = info
        return info.name, array

    def __iter__(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __del__(self):
        # An iterator whose __init__ failed may lack what close() needs: nothing to cancel then.
        try:
            self.close()
        except Exception:
            pass


class ArraySink(Sink):
    """Places each tensor into one pre-allocated NumPy array (see ckptd.dtypes for the mapping)
    and calls `on_tensor(info, array)` once it is complete."""

    def __init__(self, on_tensor: Callable[[TensorInfo, np.ndarray], None]):
        self._on_tensor = on_tensor
        self._info: Optional[TensorInfo] = None
        self._array: Optional[np.ndarray] = None
        self._flat: Optional[np.ndarray] = None   # the array's bytes, 1-D uint8
        self._offset = 0

    def begin(self, info: TensorInfo) -> None:
        if not dtypes.is_known(info.dtype):
            raise Internal(f"tensor {info.name} from the server has unknown dtype {info.dtype!r}")
        try:
            np_dtype, shape = dtypes.array_layout(info.dtype, info.local_shape, info.nbytes)
        except ValueError as e:
            raise Internal(f"tensor {info.name} from the server: {e}") from None
        if info.dtype == "str" and info.nbytes == 0:
            array = np.array("", dtype="<U1")
            flat = np.empty(0, np.uint8)
        else:
            array = np.empty(shape, np_dtype)
            flat = array.reshape(-1).view(np.uint8)
        self._info = info
        self._array = array
        self._flat = flat
        self._offset = 0

    def rows(self, data: memoryview) -> None:
        n = len(data)
        self._flat[self._offset:self._offset + n] = np.frombuffer(data, np.uint8)
        self._offset += n

    def band(self, first_row: int, rows: int) -> np.ndarray:
        itemsize = self._array.dtype.itemsize
        grid = self._flat.reshape(self._info.local_shape + (itemsize,))
        return grid[first_row:first_row + rows]

    def band_done(self, nbytes: int) -> None:
        self._offset += nbytes

    def end(self) -> None:
        info, array = self._info, self._array
        self._info = self._array = self._flat = None
        self._on_tensor(info, array)


class _Band:
    """A band of tiles being received: rows [first, first + rows) of the current slice."""

    __slots__ = ("first", "rows", "volume", "covered", "boxes", "target", "flat")

    def __init__(self, first: int, rows: int, volume: int, target: np.ndarray):
        self.first = first
        self.rows = rows
        self.volume = volume       # elements
        self.covered = 0           # elements
        self.boxes: List[np.ndarray] = []  # per message: its tiles' boxes, (k, 2, rank)
        self.target = target       # uint8, shape (rows, *local[1:], element size)
        self.flat = target.reshape(-1)


class _Current:
    __slots__ = ("info", "received", "band", "itemsize", "tileable", "row_bytes")

    def __init__(self, info: TensorInfo):
        self.info = info
        self.received = 0
        self.band: Optional[_Band] = None
        bits = dtypes.element_bits(info.dtype) if dtypes.is_known(info.dtype) else 0
        local = info.local_shape
        # Tiles are whole elements of a non-scalar slice (core/tile_band.h).
        self.tileable = bits % 8 == 0 and bits > 0 and info.dtype != "str" and bool(local)
        self.itemsize = bits // 8
        self.row_bytes = math.prod(local[1:]) * self.itemsize if local else 0


class FetchReceiver:
    """Checks and verifies one Fetch stream, handing its data to a sink (module docstring).

    `checkpoint_id` names the checkpoint in checksum errors. `progress(done, total)`, when given,
    is called with the data bytes delivered so far and the plan's total.
    """

    def __init__(self, checkpoint_id: str, sink: Sink,
                 progress: Optional[Callable[[int, int], None]] = None):
        self._checkpoint = checkpoint_id
        self._sink = sink
        self._progress = progress
        self.summary: Optional[FetchSummary] = None
        self._current: Optional[_Current] = None
        self._tensors = 0
        self._bytes = 0

    # ------------------------------------------------------------------------ messages

    def feed(self, buffer: bytes) -> None:
        """One received FetchResponse, serialized."""
        if _wire.is_data_message(buffer):
            data = _wire.parse_data_message(buffer)
            if data is not None:
                self._on_data(data)
                return
        try:
            message = pb.FetchResponse.FromString(buffer)
        except Exception as e:  # protobuf's DecodeError and friends
            raise Internal(f"malformed fetch message from the server: {e}") from None
        kind = message.WhichOneof("kind")
        if kind == "data":
            self._on_data(_wire.data_message_from_proto(message.data))
        elif kind == "tensor":
            self._on_tensor(message.tensor)
        elif kind == "summary":
            self._on_summary(message.summary)
        else:
            # A newer server's message kind: skipping it could silently drop data.
            raise Internal("fetch stream holds a message of an unknown kind (client too old?)")

    def end(self) -> None:
        """After the server closed the stream successfully."""
        if self.summary is None:
            raise DataLoss("fetch stream ended before its plan summary")
        self._end_tensor("the end of the stream")
        if self._tensors != self.summary.tensor_count or self._bytes != self.summary.total_bytes:
            raise DataLoss(f"fetch stream ended after {self._tensors} of "
                           f"{self.summary.tensor_count} tensors and {self._bytes} of "
                           f"{self.summary.total_bytes} bytes")

    # ------------------------------------------------------------------------ kinds

    def _on_summary(self, summary: pb.FetchPlanSummary) -> None:
        if self.summary is not None:
            raise Internal("fetch stream holds a second plan summary")
        if summary.tensor_count < 0 or summary.total_bytes < 0:
            raise Internal(f"fetch plan summary announces {summary.tensor_count} tensors and "
                           f"{summary.total_bytes} bytes")
        self.summary = FetchSummary(summary)
        self._report()

    def _on_tensor(self, header: pb.FetchTensorHeader) -> None:
        if self.summary is None:
            raise Internal("fetch stream sent a tensor before its plan summary")
        self._end_tensor(f"the header of tensor {header.name}")
        if self._tensors >= self.summary.tensor_count:
            raise DataLoss(f"fetch stream sent tensor {header.name} beyond the plan's "
                           f"{self.summary.tensor_count} tensors")
        if header.total_bytes < 0:
            raise Internal(f"tensor {header.name} announces {header.total_bytes} bytes")
        self._tensors += 1
        info = TensorInfo(header)
        self._current = _Current(info)
        self._sink.begin(info)

    def _on_data(self, m: _wire.DataMessage) -> None:
        c = self._current
        if c is None:
            raise Internal("fetch stream sent data outside a tensor")
        name = c.info.name
        if c.band is not None and not m.tile_box:
            raise DataLoss(f"tensor {name}: row-major data inside a band of tiles")
        data = m.data
        size = len(data)
        if size > c.info.nbytes - c.received:
            raise DataLoss(f"tensor {name}: received more than its {c.info.nbytes} "
                           f"announced bytes")
        # Parts end to end, each with its own checksum.
        part_bytes = m.part_bytes
        part_checksums = m.part_checksums
        if not part_bytes or len(part_bytes) != len(part_checksums):
            raise DataLoss(f"tensor {name}: a data message lists {len(part_bytes)} part sizes "
                           f"and {len(part_checksums)} part checksums (expected at least one of "
                           f"each, as many of one as of the other)")
        if len(part_bytes) == 1:
            if part_bytes[0] != size or size == 0:
                self._parts_error(part_bytes, size)
            bounds = None
        else:
            bounds = list(itertools.accumulate(part_bytes, initial=0))
            if bounds[-1] != size or 0 in part_bytes or min(part_bytes) < 0:
                self._parts_error(part_bytes, size)
        if m.tile_box:
            # Verified once copied into the band, from the message still in the CPU's cache
            # (see _add_tiles); nothing reads the band before then.
            self._add_tiles(m, bounds)
            return
        self._verify(data, bounds, part_checksums)
        if size:
            self._sink.rows(data)
            c.received += size
            self._bytes += size
            self._report()

    def _verify(self, data, bounds, part_checksums) -> None:
        """Raises DataLoss unless every part of `data` (bounds: the parts' offsets and the end,
        None for a single part) has its XXH3-64 checksum."""
        if bounds is None:
            actual = _xxh3(data)
            if actual != part_checksums[0]:
                self._checksum_error(actual, 0, len(data), part_checksums[0])
            return
        one_shot = _XXH3_ONE_SHOT
        if bounds[-1] < _GIL_FREE_HASH_BYTES * (len(bounds) - 1):
            actual = [one_shot(data[a:b]) for a, b in zip(bounds, bounds[1:])]
        else:
            actual = [_xxh3(data[a:b]) for a, b in zip(bounds, bounds[1:])]
        if actual != part_checksums:
            i = next(i for i, (a, e) in enumerate(zip(actual, part_checksums)) if a != e)
            self._checksum_error(actual[i], bounds[i], bounds[i + 1] - bounds[i],
                                 part_checksums[i])

    # ------------------------------------------------------------------------ tiles

    def _add_tiles(self, m: _wire.DataMessage, bounds) -> None:
        """Places a verified message of tiles (part i is tile i) into the current band, opening
        it at the first row not yet delivered; completes the band once its tiles cover it.

        The tiles are checked together (NumPy on their boxes) and copied as few NumPy
        assignments as their arrangement allows (`_copy_tiles`)."""
        c = self._current
        name = c.info.name
        local = c.info.local_shape
        rank = len(local)
        part_bytes = m.part_bytes
        k = len(part_bytes)
        if not c.tileable or not k or len(m.tile_box) != 2 * rank * k:
            raise DataLoss(f"tensor {name}: a data message of {k} parts lists "
                           f"{len(m.tile_box)} tile coordinates for a slice of rank {rank}")
        itemsize = c.itemsize
        row_bytes = c.row_bytes
        band = c.band
        if band is None:
            if row_bytes <= 0 or c.received % row_bytes:
                raise DataLoss(f"tensor {name}: tiles do not start at a whole row")
            first = c.received // row_bytes
            rows = m.band_rows
            if rows <= 0 or first + rows > local[0]:
                raise DataLoss(f"tensor {name}: a band of {rows} rows from row {first} leaves "
                               f"the slice of {local[0]} rows")
            if rows * row_bytes > MAX_BAND_BYTES:
                raise DataLoss(f"tensor {name}: a band of {rows * row_bytes} bytes exceeds the "
                               f"{MAX_BAND_BYTES} bytes a band may hold")
            band = _Band(first, rows, rows * (row_bytes // itemsize),
                         self._sink.band(first, rows))
            c.band = band
        elif m.band_rows != band.rows:
            raise DataLoss(f"tensor {name}: a band of {band.rows} rows continues as one of "
                           f"{m.band_rows}")
        first = band.first
        last = first + band.rows

        boxes = np.array(m.tile_box, dtype=np.int64).reshape(k, 2, rank)
        lo = boxes[:, 0]
        hi = boxes[:, 1]
        extent = hi - lo
        # Inside the band (first <= lo, hi <= last along dim 0; 0 <= lo, hi <= local beyond)
        # and not empty: checked as three whole-array comparisons, the culprit found only on a
        # failure.
        if not ((lo >= (first,) + (0,) * (rank - 1)).all() and
                (hi <= (last,) + tuple(local[1:])).all() and (extent > 0).all()):
            inside = ((lo[:, 0] >= first) & (hi[:, 0] <= last) & (extent > 0).all(axis=1) &
                      (lo[:, 1:] >= 0).all(axis=1) & (hi[:, 1:] <= local[1:]).all(axis=1))
            i = int(np.argmin(inside))
            raise DataLoss(f"tensor {name}: tile {_box_text(lo[i], hi[i])} leaves the band "
                           f"{_band_text(first, last, local)}")
        volumes = extent.prod(axis=1)
        sizes = np.array(part_bytes, dtype=np.int64)
        wrong = volumes * itemsize != sizes
        if wrong.any():
            i = int(np.argmax(wrong))
            raise DataLoss(f"tensor {name}: tile {_box_text(lo[i], hi[i])} of {volumes[i]} "
                           f"elements comes with {part_bytes[i]} bytes")
        covered = band.covered + int(volumes.sum())
        if covered > band.volume:
            raise DataLoss(f"tensor {name}: the tiles of band {_band_text(first, last, local)} "
                           f"cover more than it (they overlap)")
        band.covered = covered
        band.boxes.append(boxes)

        offsets = np.cumsum(sizes) - sizes
        _copy_tiles(band, lo, extent, offsets, m.data, local, itemsize, row_bytes)
        self._verify(m.data, bounds, m.part_checksums)
        if band.covered < band.volume:
            return
        all_boxes = band.boxes[0] if len(band.boxes) == 1 else np.concatenate(band.boxes)
        if (not _tiles_partition_rows(all_boxes[:, 0], all_boxes[:, 1], first, last, local) and
                _tiles_overlap(all_boxes[:, 0], all_boxes[:, 1])):
            raise DataLoss(f"tensor {name}: the tiles of band {_band_text(first, last, local)} "
                           f"overlap")
        band_bytes = band.volume * itemsize
        self._sink.band_done(band_bytes)
        c.band = None
        c.received += band_bytes
        self._bytes += band_bytes
        self._report()

    # ------------------------------------------------------------------------ helpers

    def _parts_error(self, part_bytes, size: int) -> None:
        """Raises DataLoss for part sizes that do not cut a message of `size` bytes into
        non-empty parts end to end."""
        name = self._current.info.name
        offset = 0
        for i, part in enumerate(part_bytes):
            if part <= 0 or part > size - offset:
                raise DataLoss(f"tensor {name}: a data message of {size} bytes lists part {i} "
                               f"of {part} bytes at offset {offset}")
            offset += part
        raise DataLoss(f"tensor {name}: the parts of a data message cover {offset} of its "
                       f"{size} bytes")

    def _checksum_error(self, actual: int, offset: int, size: int, expected: int) -> None:
        c = self._current
        begin = c.received + offset
        # Whole stored chunks are checked only here (the server sends their stored checksum
        # without hashing them), so a mismatch may be corruption in the store or in transit.
        raise DataLoss(f"checkpoint {self._checkpoint} tensor {c.info.name}: bytes [{begin}, "
                       f"{begin + size}) failed their XXH3-64 checksum (received {actual:x}, "
                       f"expected {expected:x}): corrupted in the server's store or in transit")

    def _end_tensor(self, where: str) -> None:
        c = self._current
        if c is None:
            return
        if c.band is not None:
            raise DataLoss(f"tensor {c.info.name}: a band of tiles "
                           f"{_band_text(c.band.first, c.band.first + c.band.rows, c.info.local_shape)}"
                           f" was incomplete before {where}")
        if c.received != c.info.nbytes:
            raise DataLoss(f"tensor {c.info.name}: received {c.received} of {c.info.nbytes} "
                           f"bytes before {where}")
        self._current = None
        self._sink.end()

    def _report(self) -> None:
        if self._progress is not None:
            self._progress(self._bytes, self.summary.total_bytes)


def _copy_tiles(band: _Band, lo: np.ndarray, extent: np.ndarray, offsets: np.ndarray, data,
                local, itemsize: int, row_bytes: int) -> None:
    """Copies a message's tiles (boxes [lo, lo + extent) of the slice `local`, checked to lie in
    the band; tile i's bytes at `offsets[i]` of `data`) into the band, with as few NumPy
    assignments as their arrangement allows.

    The server cuts a band into tile rows: tiles of equal boxes side by side along dim 1, each
    spanning every dim after it, in row-major order. Consecutive tiles forming such a row are
    one run; consecutive runs of the same tiles stacked along dim 0 are one grid, copied as one
    strided assignment (grid row, tile, tile row, bytes of a tile row). Runs of single tiles
    spanning whole rows are contiguous in the band and the message alike, and are copied as one
    block even when their heights differ. Any other tile is copied by itself.
    """
    k, rank = lo.shape
    if rank == 1:
        # One element per row: as tiles of width 1 in a slice of width 1.
        width = 1
        elem = itemsize
        ones = np.ones(k, np.int64)
        q = np.column_stack((lo[:, 0], extent[:, 0], ones, ones, ones - 1, offsets))
    else:
        width = local[1]
        elem = itemsize * math.prod(local[2:])  # bytes of one index of dim 1
        if rank == 2:
            spans = np.ones(k, np.int64)
        else:
            spans = ((lo[:, 2:] == 0) & (extent[:, 2:] == local[2:])).all(axis=1)
        q = np.column_stack((lo[:, 0], extent[:, 0], extent[:, 1], spans, lo[:, 1], offsets))
    # Per tile: row start, height, width, spans the dims after dim 1, column start, offset.
    # Tile i continues the run of tile i - 1 when the first four agree (same rows, same width,
    # spanning) and its columns start where the previous tile's end.
    same = ((q[1:, :4] == q[:-1, :4]).all(axis=1) & (q[1:, 4] == q[:-1, 4] + q[:-1, 2]) &
            (q[1:, 3] == 1))
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    counts = np.diff(starts, append=k).tolist()
    runs = [(start, n, r0, c0, hh, ww, spanning == 1, offset) for start, n, (
        r0, hh, ww, spanning, c0, offset) in zip(starts.tolist(), counts, q[starts].tolist())]
    first = band.first
    flat = band.flat
    j = 0
    while j < len(runs):
        start, n, r0, c0, hh, ww, spanning, offset = runs[j]
        if not spanning:
            # A tile cut in a dim after dim 1 (not the server's usual layout): by itself.
            region = (slice(r0 - first, r0 - first + hh),) + tuple(
                slice(int(lo[start, d]), int(lo[start, d] + extent[start, d]))
                for d in range(1, rank))
            shape = tuple(extent[start].tolist()) + (itemsize,)
            nbytes = math.prod(shape)
            band.target[region] = np.frombuffer(data, np.uint8, nbytes, offset).reshape(shape)
            j += 1
            continue
        if n == 1 and c0 == 0 and ww == width:
            # Whole rows: followed by more whole-row tiles at the next rows, one block.
            rows = hh
            j += 1
            while j < len(runs):
                _, n2, r2, c2, h2, w2, spanning2, _ = runs[j]
                if not (spanning2 and n2 == 1 and c2 == 0 and w2 == width and r2 == r0 + rows):
                    break
                rows += h2
                j += 1
            nbytes = rows * row_bytes
            begin = (r0 - first) * row_bytes
            flat[begin:begin + nbytes] = np.frombuffer(data, np.uint8, nbytes, offset)
            continue
        # A grid: the runs below this one with the same tiles at the same columns.
        gi = 1
        j += 1
        while j < len(runs):
            _, n2, r2, c2, h2, w2, spanning2, _ = runs[j]
            if not (spanning2 and n2 == n and c2 == c0 and h2 == hh and w2 == ww and
                    r2 == r0 + gi * hh):
                break
            gi += 1
            j += 1
        tile_row = ww * elem
        dest = np.ndarray((gi, n, hh, tile_row), np.uint8, flat,
                          (r0 - first) * row_bytes + c0 * elem,
                          (hh * row_bytes, tile_row, row_bytes, 1))
        dest[...] = np.frombuffer(data, np.uint8, gi * n * hh * tile_row,
                                  offset).reshape(gi, n, hh, tile_row)


def _box_text(lo, hi) -> str:
    return "[" + ", ".join(f"{l}:{h}" for l, h in zip(lo, hi)) + ")"


def _band_text(first: int, last: int, local) -> str:
    return _box_text((first,) + (0,) * (len(local) - 1), (last,) + tuple(local[1:]))


def _tiles_partition_rows(lo: np.ndarray, hi: np.ndarray, first: int, last: int, local) -> bool:
    """Whether the boxes [lo[i], hi[i]) (shape (n, rank), each inside the band) cut the band of
    rows [first, last) of slice `local` into tile rows: boxes sharing their row range side by
    side along dim 1 from 0 to its end, each spanning every dim after it, and those row ranges
    end to end from `first` to `last`. Such boxes cannot overlap. False says nothing about an
    overlap (the server's usual arrangement is checked with a few NumPy operations;
    `_tiles_overlap` decides any other)."""
    n, rank = lo.shape
    if rank < 2:
        return False
    if rank > 2 and not ((lo[:, 2:] == 0).all() and (hi[:, 2:] == local[2:]).all()):
        return False
    order = np.lexsort((lo[:, 1], lo[:, 0]))  # by row range start, then column
    lo0, hi0, lo1, hi1 = lo[order, 0], hi[order, 0], lo[order, 1], hi[order, 1]
    # A box starts a tile row where its row start differs from its predecessor's.
    starts = np.concatenate(([True], lo0[1:] != lo0[:-1]))
    ends = np.concatenate((starts[1:], [True]))
    if (hi0 != np.maximum.accumulate(np.where(starts, hi0, 0))).any():
        return False  # boxes with the same row start but different row ends
    # Within a tile row the columns run end to end from 0 to the slice's width.
    if (lo1[starts] != 0).any() or (hi1[ends] != local[1]).any():
        return False
    if (lo1[1:][~starts[1:]] != hi1[:-1][~starts[1:]]).any():
        return False
    # The tile rows run end to end from the band's first row to its last.
    row_lo, row_hi = lo0[starts], hi0[starts]
    return bool(row_lo[0] == first and row_hi[-1] == last and (row_lo[1:] == row_hi[:-1]).all())


def _tiles_overlap(lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether any two of the boxes [lo[i], hi[i]) (shape (n, rank)) intersect.

    The boundaries are compressed per dim into a grid of cells; every box adds one to the cells
    it spans (through a difference array: +1/-1 at its corners, then prefix sums), and an
    overlap is a cell counted twice. O(n * 2^rank + cells); pairwise for a few boxes."""
    n, rank = lo.shape
    if n <= 1:
        return False
    if n <= 32:
        pairs = (np.maximum(lo[:, None, :], lo[None, :, :]) <
                 np.minimum(hi[:, None, :], hi[None, :, :])).all(axis=2)
        np.fill_diagonal(pairs, False)
        return bool(pairs.any())
    bounds = [np.unique(np.concatenate((lo[:, d], hi[:, d]))) for d in range(rank)]
    cells = math.prod(len(b) for b in bounds)
    if cells > 1 << 24:
        # Pathologically scattered boxes: pairwise, a block of rows at a time.
        for start in range(0, n, 256):
            a_lo = lo[start:start + 256, None, :]
            a_hi = hi[start:start + 256, None, :]
            pairs = (np.maximum(a_lo, lo[None]) < np.minimum(a_hi, hi[None])).all(axis=2)
            pairs[np.arange(len(pairs)), np.arange(start, start + len(pairs))] = False
            if pairs.any():
                return True
        return False
    ilo = [np.searchsorted(bounds[d], lo[:, d]) for d in range(rank)]
    ihi = [np.searchsorted(bounds[d], hi[:, d]) for d in range(rank)]
    diff = np.zeros([len(b) for b in bounds], dtype=np.int64)
    for corner in itertools.product((0, 1), repeat=rank):
        index = tuple(ihi[d] if corner[d] else ilo[d] for d in range(rank))
        np.add.at(diff, index, -1 if sum(corner) % 2 else 1)
    for d in range(rank):
        diff = np.cumsum(diff, axis=d)
    return bool(diff.max() > 1)
