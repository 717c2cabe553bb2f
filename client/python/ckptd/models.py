"""The plain objects the client returns: strategies, checkpoints, uploads and transform jobs.

They copy what the server answered into Python values, so that scripts never depend on the
generated protobuf classes.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import List, Optional

from ckptd import _wire
from ckptd._proto import ckpt_pb2 as pb


@dataclasses.dataclass(frozen=True)
class StrategyInfo:
    """A registered strategy: its name, the parameters it lays out, the devices of one pipeline
    stage, the stages and the world size (devices_per_stage * stage_count)."""
    name: str
    parameter_count: int
    devices_per_stage: int
    stage_count: int
    world_size: int

    @classmethod
    def from_proto(cls, m: pb.StrategyInfo) -> "StrategyInfo":
        return cls(m.name, m.parameter_count, m.devices_per_stage, m.stage_count, m.world_size)


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A registered strategy read back: its summary and its content, encoded as `format`
    ("json": MindSpore's JSON strategy; "binary": MindSpore's ParallelStrategyMap)."""
    info: StrategyInfo
    content: bytes
    format: str


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint: its id, the source strategy it was uploaded with (empty for a
    whole-tensor checkpoint), its source ranks, distinct tensors, bytes of the global tensors
    (each once), bytes stored, and its commit time (Unix seconds)."""
    id: str
    source_strategy: str
    ranks: int
    tensor_count: int
    logical_bytes: int
    stored_bytes: int
    created_unix: int

    @classmethod
    def from_proto(cls, m: pb.CheckpointInfo) -> "CheckpointInfo":
        return cls(m.id, _wire.checkpoint_source_strategy(m), m.ranks, m.tensor_count,
                   m.logical_bytes, m.stored_bytes, m.created_unix)


@dataclasses.dataclass(frozen=True)
class TensorDescription:
    """One tensor of a stored checkpoint: name, MindSpore dtype, global shape, whether it is
    laid out by the source strategy ("sharded") or kept whole per rank ("verbatim"), its source
    layout in words, and the distinct slices and bytes stored for it."""
    name: str
    dtype: str
    global_shape: tuple
    kind: str
    layout: str
    stored_slices: int
    stored_bytes: int

    @classmethod
    def from_proto(cls, m: pb.TensorDescription) -> "TensorDescription":
        kind = "verbatim" if m.kind == pb.TENSOR_KIND_VERBATIM else "sharded"
        return cls(m.name, m.dtype, tuple(m.global_shape), kind, m.layout, m.stored_slices,
                   m.stored_bytes)


@dataclasses.dataclass(frozen=True)
class CheckpointDescription:
    """`describe`: the checkpoint's summary and every tensor, in source file order."""
    info: CheckpointInfo
    tensors: List[TensorDescription]


@dataclasses.dataclass(frozen=True)
class UploadResult:
    """The server's answer to one uploaded rank: ranks received so far and needed, whether this
    rank completed (and so committed) the checkpoint, the bytes stored after de-duplication, and
    non-fatal remarks."""
    checkpoint_id: str
    ranks_received: int
    ranks_total: int
    committed: bool
    bytes_stored: int
    warnings: List[str]

    @classmethod
    def from_proto(cls, m: pb.UploadResponse) -> "UploadResult":
        return cls(m.checkpoint_id, m.ranks_received, m.ranks_total, m.committed,
                   m.bytes_stored, list(m.warnings))


@dataclasses.dataclass(frozen=True)
class RankUpload:
    """One rank of `upload_dir`: the .ckpt chosen in rank_<r>/, its size, the server's answer."""
    rank: int
    file: str
    file_bytes: int
    result: UploadResult


@dataclasses.dataclass(frozen=True)
class UploadSummary:
    """`upload_dir`: whether the checkpoint was committed, the ranks the server has received and
    needs, the summed file sizes and stored bytes, and every rank's upload."""
    checkpoint_id: str
    committed: bool
    ranks_received: int
    ranks_total: int
    file_bytes: int
    bytes_stored: int
    ranks: List[RankUpload]


class JobState(enum.IntEnum):
    """A transform job's state (proto JobState)."""
    UNSPECIFIED = pb.JOB_STATE_UNSPECIFIED
    QUEUED = pb.JOB_STATE_QUEUED
    RUNNING = pb.JOB_STATE_RUNNING
    SUCCEEDED = pb.JOB_STATE_SUCCEEDED
    FAILED = pb.JOB_STATE_FAILED
    CANCELLED = pb.JOB_STATE_CANCELLED

    @property
    def terminal(self) -> bool:
        """True for SUCCEEDED, FAILED and CANCELLED: the job will not change any more."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclasses.dataclass(frozen=True)
class JobProgress:
    """Tensors, bytes and destination ranks written so far and in total; recent throughput and
    estimated seconds left (0 when unknown or done)."""
    tensors_done: int
    tensors_total: int
    bytes_done: int
    bytes_total: int
    ranks_done: int
    ranks_total: int
    bytes_per_second: float
    eta_seconds: float

    @classmethod
    def from_proto(cls, m: pb.JobProgress) -> "JobProgress":
        return cls(m.tensors_done, m.tensors_total, m.bytes_done, m.bytes_total, m.ranks_done,
                   m.ranks_total, m.bytes_per_second, m.eta_seconds)


@dataclasses.dataclass(frozen=True)
class Job:
    """A transform job as the server reports it.

    The request: `checkpoint_id` (source), `dst_strategy` (empty for a merged file) and exactly
    one of `new_checkpoint` / `export_dir` / `merged_file` (the others None), with `ranks` and
    `prefix` for an export. Then its state, why it failed or was cancelled (`reason`), its
    progress, Unix seconds of submission, start and end (0 when not yet), and the times it was
    (re)started. `created` is set on the Job returned by `submit_transform`: False when the job
    id already existed with the same request (an idempotent resubmission); None elsewhere.
    """
    id: str
    state: JobState
    reason: str
    progress: JobProgress
    checkpoint_id: str
    dst_strategy: str
    new_checkpoint: Optional[str]
    export_dir: Optional[str]
    merged_file: Optional[str]
    ranks: List[int]
    prefix: str
    submitted_unix: int
    started_unix: int
    finished_unix: int
    attempts: int
    owner: str = ""
    created: Optional[bool] = None

    @property
    def done(self) -> bool:
        """Whether the job has ended (succeeded, failed or was cancelled)."""
        return self.state.terminal

    @property
    def succeeded(self) -> bool:
        return self.state == JobState.SUCCEEDED

    @classmethod
    def from_proto(cls, m: pb.Job, created: Optional[bool] = None) -> "Job":
        request = m.request
        target = request.target
        output = target.WhichOneof("output")
        try:
            state = JobState(m.state)
        except ValueError:
            state = JobState.UNSPECIFIED
        return cls(
            id=m.id, state=state, reason=m.reason, progress=JobProgress.from_proto(m.progress),
            checkpoint_id=request.checkpoint_id,
            dst_strategy=_wire.transform_dst_strategy(request),
            new_checkpoint=target.new_checkpoint_id if output == "new_checkpoint_id" else None,
            export_dir=target.export_dir if output == "export_dir" else None,
            merged_file=target.merged_file if output == "merged_file" else None,
            ranks=list(target.ranks), prefix=target.prefix, submitted_unix=m.submitted_unix,
            started_unix=m.started_unix, finished_unix=m.finished_unix, attempts=m.attempts,
            owner=m.owner, created=created)
