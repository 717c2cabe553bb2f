"""Every place the client touches a field of proto/ckpt.proto whose name or number may change
between API versions: the Fetch request and its data messages (read in place), the strategy
fields of uploads, checkpoints and transform jobs. The rest of the package goes through these
functions and never names those fields itself.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ckptd._proto import ckpt_pb2 as pb

# ------------------------------------------------------------------------------------ fetch


def fetch_request(checkpoint_id: str, dst_strategy: Optional[str], rank: Optional[int],
                  merged: bool, include: Sequence[str], exclude: Sequence[str],
                  strict: bool) -> pb.FetchRequest:
    """The FetchRequest of one destination rank (or every tensor whole, `merged`)."""
    request = pb.FetchRequest(checkpoint_id=checkpoint_id, include=list(include),
                              exclude=list(exclude), strict=strict)
    if merged:
        request.merged = True
    else:
        request.destination_strategy = dst_strategy
        request.rank = rank
    return request


# Tags (field number << 3 | wire type) of FetchResponse.data and FetchData.data.
_TAG_RESPONSE_DATA = (3 << 3) | 2
_TAG_DATA = (1 << 3) | 2


class DataMessage:
    """One FetchData message: `data` a memoryview of the received bytes (no copy), the parts'
    sizes and XXH3-64 checksums, the tiles' boxes and the band's row count (see
    proto/ckpt.proto)."""

    __slots__ = ("data", "part_bytes", "part_checksums", "tile_box", "band_rows")

    def __init__(self, data, part_bytes, part_checksums, tile_box, band_rows):
        self.data = data
        self.part_bytes = part_bytes
        self.part_checksums = part_checksums
        self.tile_box = tile_box
        self.band_rows = band_rows


def is_data_message(buffer: bytes) -> bool:
    """Whether a received FetchResponse is (most likely) a data message: its first field."""
    return len(buffer) > 0 and buffer[0] == _TAG_RESPONSE_DATA


def _varint(buffer, pos):
    b = buffer[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buffer[pos]
        result |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def parse_data_message(buffer: bytes) -> Optional[DataMessage]:
    """Reads FetchResponse{data: FetchData} with FetchData.data first (as protobuf serializes
    it) in place: the data as a view of `buffer`, no copy; protobuf parses the small fields
    after it.

    None when `buffer` is anything else or malformed: the caller then parses it with protobuf
    (`data_message_from_proto`), which either understands it or reports the damage.
    """
    try:
        if buffer[0] != _TAG_RESPONSE_DATA:
            return None
        length, pos = _varint(buffer, 1)
        end = pos + length
        if end != len(buffer):
            return None  # nothing may follow the data message
        view = memoryview(buffer)
        data = view[0:0]
        if pos < end and buffer[pos] == _TAG_DATA:
            n, pos = _varint(buffer, pos + 1)
            if pos + n > end:
                return None
            data = view[pos:pos + n]
            pos += n
        rest = pb.FetchData.FromString(view[pos:end])
        if rest.data:
            return None  # data after the other fields, or twice: not the usual layout
        return DataMessage(data, list(rest.part_bytes), list(rest.part_checksums),
                           list(rest.tile_box), rest.band_rows)
    except Exception:  # IndexError, ValueError, protobuf's DecodeError
        return None


def data_message_from_proto(data: pb.FetchData) -> DataMessage:
    """The fields of a FetchData parsed by protobuf."""
    return DataMessage(memoryview(data.data), list(data.part_bytes), list(data.part_checksums),
                       list(data.tile_box), data.band_rows)


# ------------------------------------------------------------------------------- uploads


def upload_header(checkpoint_id: str, source_strategy: str, rank: int,
                  source_file: str) -> pb.UploadHeader:
    """The first message of an Upload stream (empty strategy: a whole-tensor checkpoint)."""
    return pb.UploadHeader(checkpoint_id=checkpoint_id, source_strategy=source_strategy,
                           rank=rank, source_file=source_file)


# ------------------------------------------------------------------ checkpoints and jobs


def checkpoint_source_strategy(info: pb.CheckpointInfo) -> str:
    """CheckpointInfo's source strategy name (empty for a whole-tensor checkpoint)."""
    return info.source_strategy


def submit_transform_request(job_id: str, checkpoint_id: str, dst_strategy: str,
                             target: pb.TransformTarget) -> pb.SubmitTransformRequest:
    return pb.SubmitTransformRequest(job_id=job_id, checkpoint_id=checkpoint_id,
                                     destination_strategy=dst_strategy, target=target)


def transform_dst_strategy(request: pb.SubmitTransformRequest) -> str:
    """A submitted transform's destination strategy (empty for a merged file)."""
    return request.destination_strategy
