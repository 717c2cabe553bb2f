"""Python client of ckptd, the sharded-checkpoint service for MindSpore.

    import ckptd
    client = ckptd.Client("ckptd.example:50051")
    tensors = client.fetch("run-42", dst_strategy="infer-3dev", rank=1)   # {name: ndarray}

See docs/python.md for the API reference.
"""

from ckptd.client import DEFAULT_ADDRESS, DEFAULT_TIMEOUT, Client, FetchedRank, FetchIterator
from ckptd._fetch import FetchSummary, TensorInfo
from ckptd.dtypes import MINDSPORE_DTYPES, bfloat16_to_float32
from ckptd.errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error,
                          FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange,
                          PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable,
                          Unimplemented, Unknown)
from ckptd.models import (CheckpointDescription, CheckpointInfo, Job, JobProgress, JobState,
                          RankUpload, Strategy, StrategyInfo, TensorDescription, UploadResult,
                          UploadSummary)

__version__ = "0.1.0"

__all__ = [
    "Client", "FetchedRank", "FetchIterator", "FetchSummary", "TensorInfo", "DEFAULT_ADDRESS",
    "DEFAULT_TIMEOUT", "MINDSPORE_DTYPES", "bfloat16_to_float32",
    "Error", "Aborted", "AlreadyExists", "Cancelled", "DataLoss", "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange",
    "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable", "Unimplemented",
    "Unknown",
    "CheckpointDescription", "CheckpointInfo", "Job", "JobProgress", "JobState", "RankUpload",
    "Strategy", "StrategyInfo", "TensorDescription", "UploadResult", "UploadSummary",
]
