"""MindSpore .ckpt files, streamed in both directions, byte-compatible with ckptd's C++ codec
(core/ckpt_format.cc).

A .ckpt is a concatenation of serialized `Checkpoint` messages holding one `Value` each
(proto/mindspore_checkpoint.proto), optionally followed by a `crc_num` trailer. A tensor larger
than 512 MiB is written as consecutive Values of 512 MiB chunks, each repeating the tag, the full
dims and the type. The protobuf framing around each Value's content is written by hand here, so
that a tensor's bytes go from the network to the file without ever being held whole; reading
does the same in reverse for uploads.
"""

from __future__ import annotations

import os
import secrets
import stat
import zlib
from typing import Iterator, List, Optional

import numpy as np

from ckptd import dtypes
from ckptd._fetch import Sink, TensorInfo
from ckptd.errors import DataLoss, Internal, InvalidArgument, NotFound, PermissionDenied, \
    ResourceExhausted, Unimplemented

# MindSpore's SLICE_SIZE: tensors larger than this are written as several Values.
SLICE_BYTES = 512 * 1024 * 1024
# Largest Value accepted when reading (MindSpore writes at most 512 MiB of content per Value).
MAX_VALUE_BYTES = 2 << 30
_CRC_MAGIC = b"crc_num"
_CRC_TRAILER_BYTES = 17  # the magic and a 10-byte big-endian CRC32

_KEY_FIELD1_BYTES = 0x0A
_KEY_FIELD2_BYTES = 0x12
_KEY_FIELD3_BYTES = 0x1A
_KEY_FIELD1_VARINT = 0x08


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64: ten-byte two's complement, as protobuf writes it
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def value_header(name: str, dtype: str, dims, content_bytes: int) -> bytes:
    """The bytes of a one-Value Checkpoint message up to its tensor_content, which has
    `content_bytes` bytes and follows (core/ckpt_format.cc, EncodeValueHeader)."""
    name_bytes = name.encode("utf-8")
    type_bytes = dtype.encode("ascii")
    tensor = bytearray()
    for d in dims:
        tensor.append(_KEY_FIELD1_VARINT)  # TensorProto.dims, unpacked
        tensor += _varint(int(d))
    tensor.append(_KEY_FIELD2_BYTES)  # TensorProto.tensor_type
    tensor += _varint(len(type_bytes))
    tensor += type_bytes
    tensor.append(_KEY_FIELD3_BYTES)  # TensorProto.tensor_content
    tensor += _varint(content_bytes)
    tensor_len = len(tensor) + content_bytes
    value = bytearray()
    value.append(_KEY_FIELD1_BYTES)  # Value.tag
    value += _varint(len(name_bytes))
    value += name_bytes
    value.append(_KEY_FIELD2_BYTES)  # Value.tensor
    value += _varint(tensor_len)
    value_len = len(value) + tensor_len
    return bytes([_KEY_FIELD1_BYTES]) + _varint(value_len) + bytes(value) + bytes(tensor)


class CkptWriter:
    """Writes tensors to a binary file object one at a time, their bytes in any pieces, as
    ckptd's CkptWriter does (no crc_num trailer). Not thread-safe."""

    def __init__(self, file, slice_bytes: int = SLICE_BYTES):
        if slice_bytes <= 0:
            raise InvalidArgument(f"slice_bytes must be positive, got {slice_bytes}")
        self._file = file
        self._slice = slice_bytes
        self._name = ""
        self._dtype = ""
        self._dims: List[int] = []
        self._remaining_total = 0
        self._remaining_chunk = 0
        self.bytes_written = 0

    def begin_tensor(self, name: str, dtype: str, dims, total_bytes: int) -> None:
        """Announces a tensor of `total_bytes` bytes (written with `dims` as given)."""
        if self._remaining_total:
            raise Internal(f"tensor {self._name} still expects {self._remaining_total} bytes "
                           f"when {name} begins")
        self._name, self._dtype, self._dims = name, dtype, list(dims)
        self._remaining_total = total_bytes
        self._start_chunk()

    def append(self, data) -> None:
        """The current tensor's next bytes (any bytes-like object)."""
        view = memoryview(data).cast("B")
        if len(view) > self._remaining_total:
            raise Internal(f"{len(view)} bytes for tensor {self._name} exceed the "
                           f"{self._remaining_total} it still expects")
        while len(view):
            if self._remaining_chunk == 0:
                self._start_chunk()
            k = min(self._remaining_chunk, len(view))
            self._emit(view[:k])
            self._remaining_chunk -= k
            self._remaining_total -= k
            view = view[k:]

    def finish(self) -> None:
        if self._remaining_total:
            raise Internal(f"tensor {self._name} still expects {self._remaining_total} bytes "
                           f"at the end of the file")

    def _start_chunk(self) -> None:
        chunk = min(self._slice, self._remaining_total)
        self._emit(value_header(self._name, self._dtype, self._dims, chunk))
        self._remaining_chunk = chunk

    def _emit(self, data) -> None:
        self._file.write(data)
        self.bytes_written += len(data)


class AtomicFile:
    """Writes `path` atomically: bytes go to `<path>.tmp.<random>` in the same directory, and
    commit() flushes, fsyncs and renames it over `path`, then fsyncs the directory; abort() (or
    leaving a `with` block by an exception) removes the temporary file and leaves `path`
    untouched. A character device or a pipe (/dev/null, a named pipe) is written in place."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        try:
            st = os.stat(self.path)
            mode = st.st_mode
        except FileNotFoundError:
            mode = None
        except OSError as e:
            raise _os_error(e, "stat", self.path) from None
        if mode is not None and stat.S_ISDIR(mode):
            raise InvalidArgument(f"{self.path} is a directory")
        self.in_place = mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode))
        self.temp_path = self.path if self.in_place else \
            f"{self.path}.tmp.{secrets.token_hex(6)}"
        try:
            if self.in_place:
                self.file = open(self.path, "wb", buffering=1 << 20)
            else:
                fd = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             0o666)
                self.file = os.fdopen(fd, "wb", buffering=1 << 20)
        except OSError as e:
            raise _os_error(e, "create", self.temp_path) from None
        self._done = False

    def write(self, data) -> None:
        try:
            self.file.write(data)
        except OSError as e:
            raise _os_error(e, "write", self.temp_path) from None

    def commit(self) -> None:
        try:
            self.file.flush()
            if not self.in_place:
                os.fsync(self.file.fileno())
            self.file.close()
            if not self.in_place:
                os.rename(self.temp_path, self.path)
                directory = os.path.dirname(os.path.abspath(self.path))
                dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
        except OSError as e:
            self.abort()
            raise _os_error(e, "commit", self.path) from None
        self._done = True

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.file.close()
        except OSError:
            pass
        if not self.in_place:
            try:
                os.unlink(self.temp_path)
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False


def _os_error(e: OSError, what: str, path: str):
    import errno
    message = f"cannot {what} {path}: {e.strerror or e}"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhausted(message)
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PermissionDenied(message)
    if e.errno == errno.ENOENT:
        return NotFound(message)
    return Internal(message)


class CkptFileSink(Sink):
    """Writes a fetch as a MindSpore .ckpt through a CkptWriter, as `ckptctl fetch` does: the
    delivered local shape as dims ([0] for str values), no trailer. Bands of tiles are assembled
    in a buffer (at most one band, reused) and written once complete."""

    def __init__(self, file, slice_bytes: int = SLICE_BYTES):
        self._writer = CkptWriter(file, slice_bytes)
        self._buffer = np.empty(0, np.uint8)
        self._band: Optional[np.ndarray] = None
        self._info: Optional[TensorInfo] = None

    def begin(self, info: TensorInfo) -> None:
        if not dtypes.is_known(info.dtype):
            raise Internal(f"tensor {info.name} from the server has unknown dtype {info.dtype!r}")
        try:
            dtypes.array_layout(info.dtype, info.local_shape, info.nbytes)
        except ValueError as e:
            raise Internal(f"tensor {info.name} from the server: {e}") from None
        # MindSpore stores scalars with empty dims and str values with dims [0].
        dims = [0] if info.dtype == "str" else list(info.local_shape)
        self._info = info
        self._writer.begin_tensor(info.name, info.dtype, dims, info.nbytes)

    def rows(self, data: memoryview) -> None:
        self._writer.append(data)

    def band(self, first_row: int, rows: int) -> np.ndarray:
        local = self._info.local_shape
        itemsize = dtypes.element_bits(self._info.dtype) // 8
        shape = (rows,) + tuple(local[1:]) + (itemsize,)
        n = int(np.prod(shape))
        if self._buffer.size < n:
            self._buffer = np.empty(n, np.uint8)
        self._band = self._buffer[:n].reshape(shape)
        return self._band

    def band_done(self, nbytes: int) -> None:
        self._writer.append(self._buffer[:nbytes].data)
        self._band = None

    def end(self) -> None:
        self._info = None

    def finish(self) -> None:
        self._writer.finish()
        self._buffer = np.empty(0, np.uint8)


# ------------------------------------------------------------------------------------ reading


class CkptValue:
    """One Value (one chunk of a tensor) read from a file: its tag, dtype and dims, and its
    content, either already in memory (`content`) or streamed from the file by `pieces`."""

    __slots__ = ("name", "dtype", "dims", "content_bytes", "content", "_reader", "_left")

    def __init__(self, name, dtype, dims, content_bytes, content, reader):
        self.name = name
        self.dtype = dtype
        self.dims = dims
        self.content_bytes = content_bytes
        self.content = content
        self._reader = reader
        self._left = 0 if content is not None else content_bytes

    def pieces(self, max_bytes: int) -> Iterator[bytes]:
        """The content in pieces of at most `max_bytes` (once)."""
        if self.content is not None:
            view = memoryview(self.content)
            for i in range(0, len(view), max_bytes):
                yield view[i:i + max_bytes]
            return
        while self._left:
            n = min(max_bytes, self._left)
            yield self._reader._read(n, f"the content of tensor {self.name}")
            self._left -= n

    def read_all(self) -> bytes:
        if self.content is None:
            self.content = b"".join(bytes(p) for p in self.pieces(max(self._left, 1)))
            self._left = 0
        return bytes(self.content)


class CkptReader:
    """Streams the Values of a .ckpt file: at most one Value's small fields in memory, its
    content read in pieces, unless the content precedes the fields that describe it (then that
    Value is read whole). Verifies a crc_num trailer when the file has one (DataLoss on a
    mismatch). Errors are InvalidArgument naming the file, the offset and the tensor. Not
    thread-safe; use as a context manager or call close()."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        try:
            self._file = open(self.path, "rb", buffering=1 << 20)
            self.size = os.fstat(self._file.fileno()).st_size
        except OSError as e:
            raise _os_error(e, "open", self.path) from None
        self.offset = 0
        self._crc: Optional[int] = None
        self._trailer_at = -1
        if self.size >= _CRC_TRAILER_BYTES:
            self._file.seek(self.size - _CRC_TRAILER_BYTES)
            if self._file.read(len(_CRC_MAGIC)) == _CRC_MAGIC:
                self._crc = 0
                self._trailer_at = self.size - _CRC_TRAILER_BYTES
            self._file.seek(0)
        self._pending: Optional[CkptValue] = None

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------------ values

    def next_value(self) -> Optional[CkptValue]:
        """The next Value, or None at the end of the file. The previous Value's content must
        have been consumed (the rest is skipped)."""
        if self._pending is not None:
            for _ in self._pending.pieces(1 << 20):
                pass
            self._pending = None
        if self.offset == self.size:
            return None
        if self.offset == self._trailer_at:
            self._read_trailer()
            return None
        start = self.offset
        key = self._read(1, "a value")[0]
        if key != _KEY_FIELD1_BYTES:
            self._malformed(start, f"expected a Checkpoint.value (key 0x0a), found 0x{key:02x}")
        length = self._read_varint("the length of a value")
        if length > MAX_VALUE_BYTES:
            self._malformed(start, f"a value of {length} bytes exceeds the {MAX_VALUE_BYTES} "
                                   f"accepted")
        end = self.offset + length
        if end > self.size or (self._trailer_at >= 0 and end > self._trailer_at):
            self._malformed(start, f"a value of {length} bytes runs past the end of the file")
        name = None
        dtype = None
        dims: List[int] = []
        content = None
        content_bytes = 0
        streamed = False
        while self.offset < end:
            field, wire = self._read_key(end, name)
            if field == 1 and wire == 2:
                n = self._read_length(end, "the tag", name)
                name = self._decode_name(self._read(n, "the tag"), start)
            elif field == 2 and wire == 2:
                tensor_len = self._read_length(end, "a tensor", name)
                tensor_end = self.offset + tensor_len
                while self.offset < tensor_end:
                    tfield, twire = self._read_key(tensor_end, name)
                    if tfield == 1 and twire == 0:
                        dims.append(self._signed(self._read_varint("a dim")))
                    elif tfield == 1 and twire == 2:
                        n = self._read_length(tensor_end, "packed dims", name)
                        stop = self.offset + n
                        while self.offset < stop:
                            dims.append(self._signed(self._read_varint("a dim")))
                        if self.offset != stop:
                            self._malformed(start, f"tensor {name}: packed dims overrun")
                    elif tfield == 2 and twire == 2:
                        n = self._read_length(tensor_end, "the tensor_type", name)
                        raw = self._read(n, "the tensor_type")
                        dtype = raw.decode("utf-8", errors="replace")
                        if not dtypes.is_known(dtype):
                            self._malformed(start, f"tensor {name}: unknown tensor_type "
                                                   f"{dtype!r}")
                    elif tfield == 3 and twire == 2:
                        content_bytes = self._read_length(tensor_end, "the tensor_content", name)
                        if (dtype is not None and name is not None and
                                self.offset + content_bytes == tensor_end == end):
                            streamed = True  # the last bytes of the value: stream them
                            break
                        content = self._read(content_bytes, f"the content of tensor {name}")
                    else:
                        self._skip_field(tfield, twire, tensor_end, name)
                if streamed:
                    break
                if self.offset != tensor_end:
                    self._malformed(start, f"tensor {name}: fields overrun the tensor")
            elif field == 3 and wire == 2:
                raise Unimplemented(f"{self.path}: tensor {name or '?'} at offset {start} is a "
                                    f"map tensor (MapParameter), which ckptd does not support")
            else:
                self._skip_field(field, wire, end, name)
        if name is None:
            self._malformed(start, "a value without a tag")
        if dtype is None:
            self._malformed(start, f"tensor {name} has no tensor_type")
        if not streamed and self.offset != end:
            self._malformed(start, f"tensor {name}: fields overrun the value")
        if content is None and not streamed:
            content = b""
        value = CkptValue(name, dtype, dims, content_bytes if streamed else len(content),
                          None if streamed else content, self)
        if streamed:
            self._pending = value
        return value

    # ------------------------------------------------------------------------ low level

    def _read(self, n: int, what: str) -> bytes:
        data = self._file.read(n)
        if len(data) != n:
            raise InvalidArgument(f"{self.path}: truncated at offset {self.offset + len(data)} "
                                  f"in {what} ({n - len(data)} bytes missing)")
        self.offset += n
        if self._crc is not None:
            self._crc = zlib.crc32(data, self._crc)
        return data

    def _read_varint(self, what: str) -> int:
        result = 0
        shift = 0
        while True:
            b = self._read(1, what)[0]
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7
            if shift > 63:
                self._malformed(self.offset, f"{what}: varint too long")

    def _read_key(self, limit: int, name) -> tuple:
        at = self.offset
        key = self._read_varint("a field key")
        if self.offset > limit:
            self._malformed(at, f"tensor {name}: a field key overruns its message")
        return key >> 3, key & 7

    def _read_length(self, limit: int, what: str, name) -> int:
        at = self.offset
        n = self._read_varint(what)
        if self.offset + n > limit:
            self._malformed(at, f"{what} of tensor {name} ({n} bytes) overruns its message")
        return n

    def _skip_field(self, field: int, wire: int, limit: int, name) -> None:
        at = self.offset
        if wire == 0:
            self._read_varint("a field")
        elif wire == 1:
            self._read(8, "a field")
        elif wire == 2:
            self._read(self._read_length(limit, f"field {field}", name), "a field")
        elif wire == 5:
            self._read(4, "a field")
        else:
            self._malformed(at, f"tensor {name}: field {field} has wire type {wire}")
        if self.offset > limit:
            self._malformed(at, f"tensor {name}: field {field} overruns its message")

    def _read_trailer(self) -> None:
        computed = self._crc
        self._crc = None  # the trailer is not part of the checksummed bytes
        trailer = self._read(_CRC_TRAILER_BYTES, "the crc_num trailer")
        stored = int.from_bytes(trailer[len(_CRC_MAGIC):], "big")
        if stored != computed:
            raise DataLoss(f"{self.path}: CRC32 {computed:08x} of the file does not match its "
                           f"crc_num trailer {stored:08x}")

    @staticmethod
    def _signed(v: int) -> int:
        return v - (1 << 64) if v >= 1 << 63 else v

    def _decode_name(self, raw: bytes, start: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self._malformed(start, f"a tag is not UTF-8: {raw[:40]!r}")

    def _malformed(self, at: int, detail: str):
        raise InvalidArgument(f"{self.path}: malformed .ckpt at offset {at}: {detail}")


class TensorStart:
    """Announces a tensor in `upload_stream`: its bytes follow as pieces."""

    __slots__ = ("name", "dtype", "dims", "total_bytes")

    def __init__(self, name: str, dtype: str, dims: List[int], total_bytes: int):
        self.name = name
        self.dtype = dtype
        self.dims = dims
        self.total_bytes = total_bytes


def upload_stream(reader: CkptReader, max_bytes: int) -> Iterator:
    """The file's tensors as an Upload stream sends them: a TensorStart before each tensor, then
    its content in pieces (bytes-like) of at most `max_bytes`, consecutive same-name Values
    joined into one tensor (MindSpore splits tensors over 512 MiB so). Checks that every chunk of
    a tensor has its dtype and dims and that the content matches them (str values: a multiple of
    4 bytes), raising InvalidArgument naming the file and the tensor."""
    path = reader.path
    value = reader.next_value()
    while value is not None:
        name, dtype, dims = value.name, value.dtype, value.dims
        if dtype == "str":
            # str values carry no element count in their dims, so the size is only known once
            # every Value of the tensor is read; they are short scalars, joined in memory.
            parts = [value.read_all()]
            value = reader.next_value()
            while value is not None and value.name == name:
                if value.dtype != "str":
                    raise InvalidArgument(f"{path}: tensor {name} mixes str and {value.dtype} "
                                          f"chunks")
                parts.append(value.read_all())
                value = reader.next_value()
            joined = b"".join(parts)
            if len(joined) % 4:
                raise InvalidArgument(f"{path}: str tensor {name} has {len(joined)} bytes, not "
                                      f"UTF-32")
            yield TensorStart(name, dtype, dims, len(joined))
            view = memoryview(joined)
            for i in range(0, len(view), max_bytes):
                yield view[i:i + max_bytes]
            continue
        try:
            total = dtypes.byte_size(dtype, dtypes.logical_shape(dtype, dims))
        except ValueError as e:
            raise InvalidArgument(f"{path}: tensor {name}: {e}") from None
        yield TensorStart(name, dtype, dims, total)
        sent = 0
        while True:
            if value.content_bytes > total - sent:
                raise InvalidArgument(f"{path}: tensor {name} ({dtype}, dims {list(dims)}) has "
                                      f"more content than the {total} bytes its dims need")
            yield from value.pieces(max_bytes)
            sent += value.content_bytes
            value = reader.next_value()
            if value is None or value.name != name:
                break
            if value.dtype != dtype or value.dims != dims:
                raise InvalidArgument(f"{path}: tensor {name} has chunks of different dtype or "
                                      f"dims ({dtype} {list(dims)} then {value.dtype} "
                                      f"{list(value.dims)})")
        if sent != total:
            raise InvalidArgument(f"{path}: tensor {name} ({dtype}, dims {list(dims)}) has "
                                  f"{sent} bytes of content but its dims need {total}")
