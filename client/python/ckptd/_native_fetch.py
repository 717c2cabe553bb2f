"""The native fetch path: Client.fetch, iter_fetch and fetch_to_file through ckptd._native.

ckptd._native (client/python/native/ckptd_native.cc, built by CMake when pybind11 and the Python
development files are installed) runs a Fetch stream with the C++ client library: the order and
size checks, the XXH3-64 verification of every part and the assembly of bands of tiles happen in
C++ with the GIL released, the verified bytes written straight into each tensor's NumPy array
(bands of tiles assembled there in place) while a thread of the library receives the next
messages. The
arrays themselves are allocated here, by the same `ArraySink` the grpcio path uses, when a
tensor's header arrives, so both paths return the same arrays (dtype, shape, bf16 as uint16);
errors come back as the absl::Status code and message the C++ library reports, which are the
codes and messages the grpcio path's FetchReceiver uses, turned into the same ckptd.errors
classes.

`enabled()` says whether a call takes this path: the module imported, and $CKPTD_PY_NATIVE is not
"0" (read at every call). Without the module (a pip-installed package) the client fetches through
grpcio.
"""

from __future__ import annotations

import os
import queue
import stat
import threading
from typing import Callable, Dict, Optional, Tuple

import grpc
import numpy as np

from ckptd import dtypes
from ckptd._fetch import ArraySink, FetchSummary, IteratorBase, TensorInfo
from ckptd._proto import ckpt_pb2 as pb
from ckptd.errors import Internal, error_for_code

try:
    from ckptd import _native
except ImportError:  # not built, or built for another interpreter
    _native = None

#: Environment variable: "0" makes every fetch take the grpcio path.
ENV_SWITCH = "CKPTD_PY_NATIVE"

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def available() -> bool:
    """Whether ckptd._native imported."""
    return _native is not None


def enabled() -> bool:
    """Whether fetches take the native path now (module present, not switched off)."""
    return _native is not None and os.environ.get(ENV_SWITCH, "1").strip() != "0"


def fetch_count() -> int:
    """How many fetches the native module ran in this process (0 without it)."""
    return 0 if _native is None else int(_native.fetch_count)


def _raise_outcome(outcome: Tuple[int, str]) -> None:
    code, message = outcome
    if code != 0:
        raise error_for_code(_CODES.get(code, grpc.StatusCode.UNKNOWN), message)


class Connection:
    """The native client of one ckptd.Client, connected with the same options (the C++ library
    reads the token file and TLS files itself, and gets the grpcio channel's fixed stream window).
    `client()` is None when the C++ library refuses these options (its checks of a token file are
    stricter than the grpcio path's): that client's fetches then take the grpcio path, which
    behaves as it always does with them. Thread-safe."""

    def __init__(self, address: str, token_file: Optional[str], tls_ca: Optional[str],
                 tls_cert: Optional[str], tls_key: Optional[str], timeout: float,
                 stream_window_bytes: int):
        self._args = (address, token_file or "", tls_ca or "", tls_cert or "", tls_key or "",
                      float(timeout), int(stream_window_bytes))
        self._lock = threading.Lock()
        self._client = None
        self._refused: Optional[Tuple[int, str]] = None
        self.client()  # connecting is lazy in gRPC; this sets the C++ channel up

    def client(self):
        with self._lock:
            if self._client is None and self._refused is None:
                client, outcome = _native.connect(*self._args)
                if client is None:
                    self._refused = outcome
                self._client = client
            return self._client


class _Callbacks:
    """The callbacks of one native fetch into arrays. Every exception raised in them (by
    `deliver`, by allocation, KeyboardInterrupt) is kept in `error` and aborts the fetch; the
    caller re-raises it once the native call returned."""

    def __init__(self, deliver: Callable[[TensorInfo, np.ndarray], bool]):
        self.summary: Optional[FetchSummary] = None
        self.error: Optional[BaseException] = None
        self._deliver = deliver
        self._keep_going = True
        self._sink = ArraySink(self._on_tensor)

    def on_summary(self, data: bytes) -> bool:
        try:
            self.summary = FetchSummary(pb.FetchPlanSummary.FromString(data))
            return True
        except BaseException as e:
            self.error = e
            return False

    def on_begin(self, data: bytes):
        try:
            self._sink.begin(TensorInfo(pb.FetchTensorHeader.FromString(data)))
            return self._sink._flat
        except BaseException as e:
            self.error = e
            return False

    def on_end(self) -> bool:
        try:
            self._sink.end()
            return self._keep_going
        except BaseException as e:
            self.error = e
            return False

    def _on_tensor(self, info: TensorInfo, array: np.ndarray) -> None:
        self._keep_going = bool(self._deliver(info, array))

    def finish(self, outcome: Tuple[int, str]) -> None:
        """Raises what ended the fetch, if anything did. Drops the sink and `deliver` first: they
        form a reference cycle with this object (and `deliver` may hold the caller's arrays),
        which would otherwise keep the arrays alive until the next garbage collection."""
        self._sink = self._deliver = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        _raise_outcome(outcome)


def fetch(connection: Connection, request: bytes, upcast: bool, result: dict,
          info: Dict[str, TensorInfo]) -> Optional[FetchSummary]:
    """Fills `result` ({name: array}) and `info` with a whole fetch on the calling thread;
    returns the plan summary."""

    def deliver(tensor: TensorInfo, array: np.ndarray) -> bool:
        if tensor.name in result:
            raise Internal(f"fetch stream delivered tensor {tensor.name} twice")
        result[tensor.name] = dtypes.upcast(tensor.dtype, array) if upcast else array
        info[tensor.name] = tensor
        return True

    callbacks = _Callbacks(deliver)
    outcome = connection.client().fetch(request, callbacks.on_summary, callbacks.on_begin,
                                        callbacks.on_end)
    callbacks.finish(outcome)
    return callbacks.summary


class _IterState:
    """What the fetching thread and the iterator share (the thread never holds the iterator, so
    that dropping the iterator cancels the fetch)."""

    END = object()

    def __init__(self):
        # A hand-over: a completed tensor is put, and the fetching thread waits until the consumer
        # took it before it receives the next one, so that only the tensor being received is
        # held besides what the consumer keeps (as on the grpcio path).
        self.ready: "queue.Queue" = queue.Queue(1)
        self.taken = threading.Semaphore(0)
        self.stop = _native.StopFlag()
        self.callbacks: Optional[_Callbacks] = None

    def put(self, item) -> bool:
        # Bounded waits, so that a consumer that stopped reading (close) never strands the thread.
        while not self.stop.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                break
            except queue.Full:
                continue
        while not self.stop.is_set():
            if self.taken.acquire(timeout=0.1):
                return True
        return False

    def get(self):
        item = self.ready.get()
        self.taken.release()
        return item

    def run(self, client, request: bytes) -> None:
        callbacks = _Callbacks(lambda tensor, array: self.put((tensor, array)))
        self.callbacks = callbacks
        try:
            outcome = client.fetch(request, callbacks.on_summary, callbacks.on_begin,
                                   callbacks.on_end, self.stop)
            callbacks.finish(outcome)
            self.put(self.END)
        except BaseException as e:
            self.put(e)


class NativeFetchIterator(IteratorBase):
    """Client.iter_fetch on the native path: the same interface as ckptd.client.FetchIterator.

    The fetch runs on a thread of its own (the C++ library, GIL released) and hands each
    completed tensor over, receiving the next one while the consumer works on it; closing the
    iterator (close(), leaving a `with` block, or dropping it) cancels the call within a
    fraction of a second, even while the server sends nothing.
    """

    def __init__(self, connection: Connection, request: bytes, upcast: bool):
        super().__init__(upcast)
        client = connection.client()
        self._state = _IterState()
        self._done = False
        self._started = False
        self._thread = threading.Thread(target=self._state.run, args=(client, request),
                                        name="ckptd-native-fetch", daemon=True)
        self._thread.start()

    @property
    def summary(self) -> Optional[FetchSummary]:
        # As FetchIterator: known from the first next() on.
        callbacks = self._state.callbacks
        return None if callbacks is None or not self._started else callbacks.summary

    def __next__(self) -> Tuple[str, np.ndarray]:
        self._started = True
        if self._done:
            raise StopIteration
        item = self._state.get()
        if item is _IterState.END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return self._yielded(*item)

    def close(self) -> None:
        """Cancels the fetch if it is still running."""
        self._done = True
        self._state.stop.set()


def file_supported(path: str) -> bool:
    """Whether fetch_to_file can write `path` natively with the grpcio path's semantics: a new
    or regular file (not a symbolic link) in an existing directory, a character device or a
    pipe. Anything else takes the grpcio path, which reports its own errors."""
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        return False
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def fetch_to_file(connection: Connection, request: bytes, path: str,
                  progress: Optional[Callable[[int, int], None]]) -> FetchSummary:
    """Writes the fetch as a .ckpt at `path` (atomically: nothing there unless it succeeded)."""
    error = []

    def report(done: int, total: int) -> bool:
        try:
            progress(done, total)
            return True
        except BaseException as e:
            error.append(e)
            return False

    outcome, summary = connection.client().fetch_to_file(
        request, path, None if progress is None else report)
    if error:
        raise error[0]
    _raise_outcome(outcome)
    return FetchSummary(pb.FetchPlanSummary.FromString(summary))
