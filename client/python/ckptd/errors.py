"""The exceptions of the ckptd client: one class per gRPC status code, all subclasses of Error.

Every failure of a call reaches the caller as one of these, carrying the server's message
unchanged (`message`) and its gRPC code (`code`). Failures detected by the client itself (a
checksum mismatch, a malformed .ckpt to upload, bad arguments) use the same classes with the code
the C++ client library uses for them, so callers handle one hierarchy.
"""

from __future__ import annotations

import grpc


class Error(Exception):
    """Base class of every ckptd client error.

    Attributes:
      code: the grpc.StatusCode of the failure.
      message: the server's (or the client's) message, unchanged.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class Cancelled(Error):
    code = grpc.StatusCode.CANCELLED


class Unknown(Error):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(Error):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(Error):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(Error):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(Error):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(Error):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(Error):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(Error):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(Error):
    code = grpc.StatusCode.ABORTED


class OutOfRange(Error):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(Error):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(Error):
    code = grpc.StatusCode.INTERNAL


class Unavailable(Error):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(Error):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(Error):
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated)}


def error_for_code(code: grpc.StatusCode, message: str) -> Error:
    """The Error subclass instance for `code` (Unknown for a code without its own class)."""
    return _BY_CODE.get(code, Unknown)(message)


def from_rpc_error(error: grpc.RpcError, address: str) -> Error:
    """Converts a failed gRPC call into the matching Error.

    UNAVAILABLE and DEADLINE_EXCEEDED mean the server never answered, so the address is added as
    context; every other code carries the server's own message, which already names what failed.
    As in the C++ client, gRPC's empty answer for a method the server lacks is explained.
    """
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = (error.details() if hasattr(error, "details") else None) or ""
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        message = f"ckptd at {address}: {message}"
    elif code == grpc.StatusCode.UNIMPLEMENTED and not message:
        message = (f"ckptd at {address} does not support this call "
                   "(is it older than this client?)")
    return error_for_code(code, message)
