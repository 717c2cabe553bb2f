"""ckptd.Client: the Python client of one ckptd server (proto/ckpt.proto)."""

from __future__ import annotations

import collections
import concurrent.futures
import os
import queue
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
import grpc.experimental
import numpy as np

from ckptd import _native_fetch
from ckptd import _wire
from ckptd._ckpt_file import AtomicFile, CkptFileSink, CkptReader, TensorStart, upload_stream
from ckptd._fetch import ArraySink, FetchReceiver, FetchSummary, IteratorBase, TensorInfo
from ckptd._proto import ckpt_pb2 as pb
from ckptd._proto import ckpt_pb2_grpc
from ckptd._rank_files import resolve_rank_files
from ckptd.errors import Cancelled, Internal, InvalidArgument, Unavailable, \
    from_rpc_error
from ckptd.models import CheckpointDescription, CheckpointInfo, Job, RankUpload, Strategy, \
    StrategyInfo, TensorDescription, UploadResult, UploadSummary

#: Address used when neither `address` nor $CKPT_SERVER is given (as ckptctl).
DEFAULT_ADDRESS = "127.0.0.1:50051"
#: Deadline of each unary call when `timeout` is not given, seconds (as ckptctl).
DEFAULT_TIMEOUT = 30.0
# Largest message accepted from the server: data messages are at most 1 MiB; strategy and
# describe responses can be a few MiB (as the C++ client).
_MAX_RECEIVE_BYTES = 8 << 20
# The largest HTTP/2 frame the client accepts (HTTP/2's own maximum).
_MAX_FRAME_BYTES = (1 << 24) - 1
# Bytes a stream's server may send ahead of what the client has read (see Client.__init__).
_STREAM_WINDOW_BYTES = 16 << 20
# Fetch messages received ahead of the one being placed (each at most 1 MiB).
_PREFETCH_MESSAGES = 4
# The API's bound on one Upload data message, and on the bytes of one UploadTensorBatch.
_DATA_MESSAGE_BYTES = 1 << 20
# Tensors per UploadTensorBatch, at most (as the C++ client).
_MAX_BATCH_TENSORS = 4096

ProgressFn = Callable[[int, int], None]
PathLike = Union[str, "os.PathLike[str]"]


class FetchedRank(dict):
    """The tensors of one fetch, by name (a dict of NumPy arrays), in the order the server sent
    them. `summary` is the plan (FetchSummary: tensor count, bytes, source ranks read, warnings),
    `info` maps each name to its TensorInfo (dtype, local and global shape, box, verbatim)."""

    summary: FetchSummary
    info: Dict[str, TensorInfo]


class _Prefetcher:
    """Reads a Fetch call on a thread of its own, up to `depth` messages ahead of the consumer.

    Receiving a message in gRPC Python (copying it out of gRPC's buffers) holds the GIL, while
    checking and placing the previous one mostly does not (xxHash and NumPy copies release
    it), so the two overlap on two cores. Iterating yields the messages in order and re-raises
    the call's error (grpc.RpcError) at the point it happened; cancel() stops the call and
    the thread. Used by one consumer thread.
    """

    _END = object()

    def __init__(self, call, depth: int):
        self._call = call
        self._queue = queue.Queue(depth)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckptd-fetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for message in self._call:
                if not self._put(message):
                    return
            self._put(self._END)
        except BaseException as e:  # grpc.RpcError above all; handed to the consumer
            self._put(e)

    def _put(self, item) -> bool:
        # Bounded waits, so that a consumer that stopped reading (cancel) never strands us.
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> "_Prefetcher":
        return self

    def __next__(self):
        item = self._queue.get()
        if item is self._END:
            self._queue.put(item)  # stays ended
            raise StopIteration
        if isinstance(item, BaseException):
            self._queue.put(item)
            raise item
        return item

    def cancel(self) -> None:
        self._stopped.set()
        self._call.cancel()


class FetchIterator(IteratorBase):
    """Iterates a fetch: yields (name, array) as each tensor completes (see Client.iter_fetch).

    `summary` is the plan once the first tensor arrived (None before), `info` the TensorInfo of
    every tensor yielded so far. Closing it (close(), leaving a `with` block, or dropping it)
    cancels the stream.
    """

    def __init__(self, call, receiver_factory, address: str, upcast: bool):
        super().__init__(upcast)
        self._call = call
        self._address = address
        self._ready = collections.deque()
        # The sink holds the deque, not the iterator: dropping the iterator then frees it (and
        # cancels the stream) at once rather than at the next garbage collection.
        ready = self._ready
        self._receiver: FetchReceiver = receiver_factory(
            ArraySink(lambda info, array: ready.append((info, array))))
        self._done = False

    @property
    def summary(self) -> Optional[FetchSummary]:
        return self._receiver.summary

    def __next__(self) -> Tuple[str, np.ndarray]:
        while not self._ready:
            if self._done:
                raise StopIteration
            try:
                buffer = next(self._call)
            except StopIteration:
                self._done = True
                self._receiver.end()
                continue
            except grpc.RpcError as e:
                self._done = True
                raise from_rpc_error(e, self._address) from None
            try:
                self._receiver.feed(buffer)
            except BaseException:
                self.close()
                raise
        return self._yielded(*self._ready.popleft())

    def close(self) -> None:
        """Cancels the stream if it is still running."""
        if not self._done:
            self._done = True
            self._call.cancel()
        self._ready.clear()


def _read_file(path: Optional[PathLike], what: str) -> Optional[bytes]:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgument(f"cannot read the {what} {os.fspath(path)}: {e.strerror}") from None


def _serialize_upload(message) -> bytes:
    # Data messages come pre-framed as UploadRequest{data} bytes (see _data_message).
    return message if isinstance(message, bytes) else message.SerializeToString()


class _UploadBatcher:
    """Turns `upload_stream`'s items into Upload messages: every non-str tensor whose bytes fit
    in a message goes whole into UploadTensorBatch messages (at most _DATA_MESSAGE_BYTES of bytes
    and _MAX_BATCH_TENSORS tensors each), the others as a header and data messages. A tensor sent
    on its own costs two messages, each a round trip through the server's executor, which
    dominates a checkpoint of many tensors of up to a few hundred KiB per rank."""

    def __init__(self):
        self._batch = pb.UploadRequest()
        self._batch_bytes = 0
        self._held: Optional[TensorStart] = None  # a batchable tensor whose pieces are coming
        self._pieces: List = []

    def add(self, item) -> Iterator:
        """The messages that can leave once `item` (a TensorStart or a piece) is known."""
        if isinstance(item, TensorStart):
            # upload_stream checked the held tensor's size before announcing the next one.
            yield from self._close_held()
            if item.dtype != "str" and item.total_bytes <= _DATA_MESSAGE_BYTES:
                self._held = item
                return
            yield from self.flush()
            yield pb.UploadRequest(tensor=pb.UploadTensorHeader(
                name=item.name, dtype=item.dtype, dims=item.dims, total_bytes=item.total_bytes))
        elif self._held is not None:
            self._pieces.append(item)
        else:
            yield _data_message(item)

    def finish(self) -> Iterator:
        """The messages left at the end of the file."""
        yield from self._close_held()
        yield from self.flush()

    def flush(self) -> Iterator:
        if len(self._batch.batch.tensors):
            yield self._batch
            self._batch = pb.UploadRequest()
            self._batch_bytes = 0

    def _close_held(self) -> Iterator:
        t = self._held
        if t is None:
            return
        self._held = None
        data = b"".join(self._pieces)
        self._pieces = []
        if (self._batch_bytes + len(data) > _DATA_MESSAGE_BYTES
                or len(self._batch.batch.tensors) >= _MAX_BATCH_TENSORS):
            yield from self.flush()
        self._batch.batch.tensors.add(
            header=pb.UploadTensorHeader(name=t.name, dtype=t.dtype, dims=t.dims,
                                         total_bytes=t.total_bytes),
            data=data)
        self._batch_bytes += len(data)


def _data_message(piece) -> bytes:
    """The wire bytes of UploadRequest{data: piece}: built around the piece, one copy."""
    n = len(piece)
    head = bytearray(b"\x1a")  # UploadRequest.data = 3, length-delimited
    while n >= 0x80:
        head.append((n & 0x7F) | 0x80)
        n >>= 7
    head.append(n)
    return b"".join((head, piece))


class _UploadGroup:
    """The streams of one upload_dir: the first failure cancels all of them and keeps new ones
    from starting. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls = set()
        self.cancelled = False

    def add(self, call) -> bool:
        with self._lock:
            if self.cancelled:
                return False
            self._calls.add(call)
            return True

    def remove(self, call) -> None:
        with self._lock:
            self._calls.discard(call)

    def cancel_all(self) -> None:
        with self._lock:
            self.cancelled = True
            calls = list(self._calls)
        for call in calls:
            call.cancel()


class Client:
    """Client of one ckptd server. Thread-safe: methods may be called concurrently.

    Args:
      address: gRPC target, "HOST:PORT" or "unix:PATH". Default: $CKPT_SERVER, else
        127.0.0.1:50051 (as ckptctl).
      token_file: file holding a bearer token, sent as "authorization: Bearer <token>" with every
        call. Default: $CKPT_TOKEN_FILE.
      tls_ca: PEM file of the CA that signed the server's certificate; enables TLS. Default:
        $CKPT_TLS_CA.
      tls_cert, tls_key: PEM client certificate and key for mutual TLS (both or neither);
        enable TLS. Default: $CKPT_TLS_CERT, $CKPT_TLS_KEY.
      timeout: deadline of each unary call, seconds (default 30). Streams (fetch, upload,
        watch_job) have none: a rank of hundreds of GiB legitimately takes long.

    Errors are ckptd.Error subclasses named after the gRPC code (ckptd.NotFound, ...), carrying
    the server's message.
    """

    def __init__(self, address: Optional[str] = None, *, token_file: Optional[PathLike] = None,
                 tls_ca: Optional[PathLike] = None, tls_cert: Optional[PathLike] = None,
                 tls_key: Optional[PathLike] = None, timeout: Optional[float] = None):
        env = os.environ
        self.address = address or env.get("CKPT_SERVER") or DEFAULT_ADDRESS
        token_file = token_file or env.get("CKPT_TOKEN_FILE") or None
        tls_ca = tls_ca or env.get("CKPT_TLS_CA") or None
        tls_cert = tls_cert or env.get("CKPT_TLS_CERT") or None
        tls_key = tls_key or env.get("CKPT_TLS_KEY") or None
        if timeout is None:
            timeout = DEFAULT_TIMEOUT
        if not timeout > 0:
            raise InvalidArgument(f"timeout must be positive, got {timeout}")
        self.timeout = float(timeout)
        if (tls_cert is None) != (tls_key is None):
            raise InvalidArgument("tls_cert and tls_key go together (mutual TLS needs both)")
        self._metadata = None
        if token_file is not None:
            token = _read_file(token_file, "token file").decode("utf-8", "replace").strip()
            if not token:
                raise InvalidArgument(f"the token file {os.fspath(token_file)} is empty")
            self._metadata = (("authorization", f"Bearer {token}"),)
        options = [("grpc.max_receive_message_length", _MAX_RECEIVE_BYTES),
                   # Lets the server send a data message in one HTTP/2 frame instead of 16 KiB
                   # ones: gRPC Python then assembles each message from fewer pieces (each piece
                   # costs it a Python object and a copy).
                   ("grpc.http2.max_frame_size", _MAX_FRAME_BYTES),
                   # Streams (Fetch, WatchJob) are received on the thread that iterates them
                   # instead of being handed over from gRPC's polling thread for every message:
                   # less CPU per fetched byte. Every stream this client opens is iterated by its
                   # caller, so nothing else needs that thread.
                   (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
                   # A fixed flow-control window per stream instead of gRPC's bandwidth-delay
                   # probing: the probe reads a client busy placing tensors as a slow link and
                   # keeps growing the window (bytes the server may send ahead, which the
                   # client buffers). _STREAM_WINDOW_BYTES bounds that memory and still allows
                   # 1.6 GB/s over a 10 ms round trip.
                   ("grpc.http2.bdp_probe", 0),
                   ("grpc.http2.lookahead_bytes", _STREAM_WINDOW_BYTES)]
        if tls_ca is not None or tls_cert is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_file(tls_ca, "TLS CA file"),
                private_key=_read_file(tls_key, "TLS key file"),
                certificate_chain=_read_file(tls_cert, "TLS certificate file"))
            self._channel = grpc.secure_channel(self.address, credentials, options)
        else:
            self._channel = grpc.insecure_channel(self.address, options)
        # The native fetch path (ckptd/_native_fetch.py): a C++ channel with the same options.
        self._native = None
        if _native_fetch.available():
            self._native = _native_fetch.Connection(
                self.address, None if token_file is None else os.fspath(token_file),
                None if tls_ca is None else os.fspath(tls_ca),
                None if tls_cert is None else os.fspath(tls_cert),
                None if tls_key is None else os.fspath(tls_key), self.timeout,
                _STREAM_WINDOW_BYTES)
        self._stub = ckpt_pb2_grpc.CheckpointServiceStub(self._channel)
        # Fetch and Upload bypass the generated (de)serializers: data messages are read in
        # place and written around the file's bytes.
        self._fetch = self._channel.unary_stream(
            "/ckpt.v1.CheckpointService/Fetch",
            request_serializer=pb.FetchRequest.SerializeToString, response_deserializer=None)
        self._upload = self._channel.stream_unary(
            "/ckpt.v1.CheckpointService/Upload", request_serializer=_serialize_upload,
            response_deserializer=pb.UploadResponse.FromString)

    def close(self) -> None:
        """Closes the channel; calls in progress are cancelled (native fetches in progress run
        to their end)."""
        self._native = None  # later fetches fail as the closed grpcio channel makes them
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"ckptd.Client({self.address!r})"

    @property
    def native_fetch(self) -> bool:
        """Whether fetches take the native path (ckptd._native built and $CKPTD_PY_NATIVE not
        "0"); see docs/python.md."""
        return (self._native is not None and _native_fetch.enabled() and
                self._native.client() is not None)

    def _unary(self, method, request):
        try:
            return method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.address) from None

    # ------------------------------------------------------------------------ strategies

    def put_strategy(self, name: str, source: Union[PathLike, bytes], *,
                     overwrite: bool = False, format: Optional[str] = None) -> StrategyInfo:
        """Registers a strategy under `name`: `source` is a strategy file's path or its bytes.

        `format` is "json" (MindSpore's JSON strategy) or "binary" (MindSpore's
        ParallelStrategyMap, a merged pipeline file when there are several stages); by default a
        path ending in .json, or bytes starting with '{', are JSON. A directory of per-stage
        files must be merged first (`ckptctl strategy merge`). `overwrite` replaces an existing
        strategy of that name (stored checkpoints keep their own copy).
        """
        if isinstance(source, (bytes, bytearray, memoryview)):
            content = bytes(source)
            guessed = "json" if content.lstrip()[:1] == b"{" else "binary"
        else:
            path = os.fspath(source)
            if os.path.isdir(path):
                raise InvalidArgument(f"{path} is a directory: merge its per-stage strategy "
                                      f"files first (ckptctl strategy merge)")
            content = _read_file(path, "strategy file")
            guessed = "json" if path.endswith(".json") else "binary"
        fmt = _strategy_format(format or guessed)
        request = pb.PutStrategyRequest(name=name, content=content, format=fmt,
                                        overwrite=overwrite)
        return StrategyInfo.from_proto(self._unary(self._stub.PutStrategy, request).info)

    def get_strategy(self, name: str, *, format: str = "json") -> Strategy:
        """A registered strategy, its content encoded as `format` ("json" or "binary")."""
        request = pb.GetStrategyRequest(name=name, format=_strategy_format(format))
        response = self._unary(self._stub.GetStrategy, request)
        return Strategy(StrategyInfo.from_proto(response.info), response.content, format)

    def strategy_info(self, name: str) -> StrategyInfo:
        """A registered strategy's summary alone (world size, parameter count), without
        transferring its content."""
        request = pb.GetStrategyRequest(name=name, info_only=True)
        return StrategyInfo.from_proto(self._unary(self._stub.GetStrategy, request).info)

    def list_strategies(self) -> List[StrategyInfo]:
        """Every registered strategy, by name."""
        response = self._unary(self._stub.ListStrategies, pb.ListStrategiesRequest())
        return [StrategyInfo.from_proto(s) for s in response.strategies]

    def delete_strategy(self, name: str) -> None:
        self._unary(self._stub.DeleteStrategy, pb.DeleteStrategyRequest(name=name))

    # ------------------------------------------------------------------------ uploads

    def upload_rank(self, checkpoint: str, source_strategy: str, rank: int, path: PathLike, *,
                    progress: Optional[ProgressFn] = None) -> UploadResult:
        """Uploads one source rank's MindSpore .ckpt, streaming (one Value in memory at a time,
        1 MiB messages). The checkpoint is committed, atomically, when its last rank arrives.
        `progress(done, total)` gets the file bytes read and the file size. InvalidArgument
        naming the file and tensor for a malformed file; nothing of a failed rank is kept."""
        return self._upload_rank(checkpoint, source_strategy, rank, os.fspath(path), progress,
                                 None)

    def upload_file(self, checkpoint: str, path: PathLike, *,
                    progress: Optional[ProgressFn] = None) -> UploadResult:
        """Uploads a whole-tensor checkpoint (one .ckpt, no strategy: rank 0 of 1)."""
        return self._upload_rank(checkpoint, "", 0, os.fspath(path), progress, None)

    def upload_dir(self, checkpoint: str, source_strategy: str, directory: PathLike, *,
                   parallelism: int = 4, progress: Optional[ProgressFn] = None) -> UploadSummary:
        """Uploads DIR/rank_<r>/ for every rank r of the source strategy's world, `parallelism`
        ranks at a time. Each rank directory's newest .ckpt is used (the largest
        <prefix>-<epoch>_<step>.ckpt, else the latest). The first failure cancels the other
        streams and is raised. `progress(done, total)` gets the summed file bytes of all ranks
        (called from several threads)."""
        if parallelism < 1:
            raise InvalidArgument(f"upload parallelism must be at least 1, got {parallelism}")
        if not source_strategy:
            raise InvalidArgument("uploading a rank directory needs a source strategy name")
        world = self.strategy_info(source_strategy).world_size
        if world < 1:
            raise Internal(f"ckptd reports a world of {world} ranks for strategy "
                           f"{source_strategy}")
        files = resolve_rank_files(os.fspath(directory), world)
        sizes = [os.path.getsize(f) for f in files]
        total = sum(sizes)
        group = _UploadGroup()
        lock = threading.Lock()
        done_by_rank = [0] * len(files)

        def rank_progress(rank):
            if progress is None:
                return None

            def report(done, _total):
                with lock:
                    done_by_rank[rank] = done
                    summed = sum(done_by_rank)
                progress(summed, total)
            return report

        def run(rank):
            return self._upload_rank(checkpoint, source_strategy, rank, files[rank],
                                     rank_progress(rank), group)

        results: List[Optional[UploadResult]] = [None] * len(files)
        first_error: Optional[BaseException] = None
        with concurrent.futures.ThreadPoolExecutor(min(parallelism, len(files))) as pool:
            futures = {pool.submit(run, r): r for r in range(len(files))}
            for future in concurrent.futures.as_completed(futures):
                try:
                    results[futures[future]] = future.result()
                except BaseException as e:  # the first failure is the news; later ones follow it
                    if first_error is None or (isinstance(first_error, Cancelled) and
                                               not isinstance(e, Cancelled)):
                        first_error = e
                    group.cancel_all()
        if first_error is not None:
            raise first_error
        ranks = [RankUpload(r, files[r], sizes[r], results[r]) for r in range(len(files))]
        ranks_total = world
        for r in ranks:
            if r.result.ranks_total > 0:
                ranks_total = r.result.ranks_total
        return UploadSummary(
            checkpoint_id=checkpoint, committed=any(r.result.committed for r in ranks),
            ranks_received=max(r.result.ranks_received for r in ranks), ranks_total=ranks_total,
            file_bytes=total, bytes_stored=sum(r.result.bytes_stored for r in ranks), ranks=ranks)

    def _upload_rank(self, checkpoint: str, strategy: str, rank: int, path: str,
                     progress: Optional[ProgressFn], group: Optional[_UploadGroup]
                     ) -> UploadResult:
        reader = CkptReader(path)
        local_error: List[BaseException] = []
        started = threading.Event()
        holder = {}

        def requests():
            try:
                yield pb.UploadRequest(header=_wire.upload_header(
                    checkpoint, strategy, rank, _source_file_label(path)))
                if progress is not None:
                    progress(0, reader.size)
                batcher = _UploadBatcher()
                for item in upload_stream(reader, _DATA_MESSAGE_BYTES):
                    sent = False
                    for message in batcher.add(item):
                        yield message
                        sent = True
                    if sent and progress is not None:
                        progress(reader.offset, reader.size)
                yield from batcher.finish()
                # Ends the stream: the server validates and stores the rank.
            except BaseException as e:
                # A bad file: cancel rather than end the stream, so that the server drops the
                # rank instead of seeing a short one.
                local_error.append(e)
                started.wait()
                holder["call"].cancel()

        try:
            call = self._upload.future(requests(), metadata=self._metadata)
            holder["call"] = call
            started.set()
            if group is not None and not group.add(call):
                call.cancel()
                raise Cancelled(f"upload of rank {rank} not started: another rank failed")
            try:
                response = call.result()
            except grpc.RpcError as e:
                if local_error:
                    raise local_error[0] from None
                raise from_rpc_error(e, self.address) from None
            except grpc.FutureCancelledError:
                if local_error:
                    raise local_error[0] from None
                raise Cancelled(f"upload of rank {rank} cancelled: another rank failed") \
                    from None
            finally:
                if group is not None:
                    group.remove(call)
        finally:
            reader.close()
        if local_error:
            raise local_error[0]
        if progress is not None:
            progress(reader.size, reader.size)
        return UploadResult.from_proto(response)

    # ------------------------------------------------------------------------ fetch

    def iter_fetch(self, checkpoint: str, dst_strategy: Optional[str] = None,
                   rank: Optional[int] = None, *, merged: bool = False,
                   include: Optional[Sequence[str]] = None,
                   exclude: Optional[Sequence[str]] = None, strict: bool = False,
                   upcast: bool = False) -> FetchIterator:
        """Streams destination rank `rank` of `dst_strategy` (or, `merged`, every tensor whole),
        yielding (name, array) as each tensor completes, so that a worker can copy tensors to
        its device while the rest stream. Arguments as `fetch`. Only the tensor being received
        is held besides what the caller keeps."""
        request = self._fetch_request(checkpoint, dst_strategy, rank, merged, include, exclude,
                                      strict)
        if self.native_fetch:
            return _native_fetch.NativeFetchIterator(self._native, request.SerializeToString(),
                                                     upcast)
        call = _Prefetcher(self._fetch(request, metadata=self._metadata), _PREFETCH_MESSAGES)
        return FetchIterator(call, lambda sink: FetchReceiver(checkpoint, sink), self.address,
                             upcast)

    def fetch(self, checkpoint: str, dst_strategy: Optional[str] = None,
              rank: Optional[int] = None, *, merged: bool = False,
              include: Optional[Sequence[str]] = None, exclude: Optional[Sequence[str]] = None,
              strict: bool = False, upcast: bool = False) -> FetchedRank:
        """The tensors of destination global rank `rank` of the registered `dst_strategy`, or
        with `merged=True` every tensor whole, as {name: numpy array} (a FetchedRank, which also
        holds the plan and each tensor's TensorInfo).

        Each tensor streams into one pre-allocated array, every message's parts verified with
        XXH3-64 first (DataLoss naming the tensor and byte range on a mismatch). Dtypes map as
        ckptd.dtypes describes: BFloat16 comes back bit-exact as uint16, unless `upcast` asks
        for float32 copies of BFloat16 and Float16 tensors. `include` / `exclude` are fnmatch
        globs on tensor names; `strict` refuses parameters laid out at the source but absent
        from the destination strategy instead of delivering them whole.
        """
        result = FetchedRank()
        if self.native_fetch:
            request = self._fetch_request(checkpoint, dst_strategy, rank, merged, include,
                                          exclude, strict)
            result.info = {}
            result.summary = _native_fetch.fetch(self._native, request.SerializeToString(),
                                                 upcast, result, result.info)
            return result
        with self.iter_fetch(checkpoint, dst_strategy, rank, merged=merged, include=include,
                             exclude=exclude, strict=strict, upcast=upcast) as stream:
            for name, array in stream:
                if name in result:
                    raise Internal(f"fetch stream delivered tensor {name} twice")
                result[name] = array
            result.summary = stream.summary
            result.info = stream.info
        return result

    def fetch_to_file(self, checkpoint: str, dst_strategy: Optional[str] = None,
                      rank: Optional[int] = None, *, path: PathLike, merged: bool = False,
                      include: Optional[Sequence[str]] = None,
                      exclude: Optional[Sequence[str]] = None, strict: bool = False,
                      progress: Optional[ProgressFn] = None) -> FetchSummary:
        """Writes the fetched tensors as a MindSpore .ckpt at `path` (the bytes `ckptctl fetch`
        writes: local shapes as dims, tensors over 512 MiB as 512 MiB Values), streaming. The
        file appears atomically only when the whole fetch succeeded; a failed fetch leaves no
        file. `progress(done, total)` gets the data bytes received and the plan's total.
        Returns the plan summary."""
        request = self._fetch_request(checkpoint, dst_strategy, rank, merged, include, exclude,
                                      strict)
        if self.native_fetch and _native_fetch.file_supported(os.fspath(path)):
            return _native_fetch.fetch_to_file(self._native, request.SerializeToString(),
                                               os.fspath(path), progress)
        with AtomicFile(path) as out:
            sink = CkptFileSink(out)
            receiver = FetchReceiver(checkpoint, sink, progress)
            call = _Prefetcher(self._fetch(request, metadata=self._metadata),
                               _PREFETCH_MESSAGES)
            finished = False
            try:
                for buffer in call:
                    receiver.feed(buffer)
                finished = True
            except grpc.RpcError as e:
                finished = True
                raise from_rpc_error(e, self.address) from None
            finally:
                if not finished:
                    call.cancel()  # stop the server producing bytes nobody reads
            receiver.end()
            sink.finish()
            out.commit()
        return receiver.summary

    @staticmethod
    def _fetch_request(checkpoint, dst_strategy, rank, merged, include, exclude, strict):
        if isinstance(include, str) or isinstance(exclude, str):
            raise InvalidArgument("include and exclude are lists of globs, not one string")
        if merged:
            if dst_strategy is not None or rank is not None:
                raise InvalidArgument("a merged fetch takes no dst_strategy or rank")
        else:
            if not dst_strategy:
                raise InvalidArgument("fetch needs dst_strategy and rank, or merged=True")
            if rank is None:
                raise InvalidArgument(f"fetch of strategy {dst_strategy} needs a rank")
            if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool):
                raise InvalidArgument(f"rank must be an integer, got {rank!r}")
        return _wire.fetch_request(checkpoint, dst_strategy, None if rank is None else int(rank),
                                   merged, include or (), exclude or (), strict)

    # ------------------------------------------------------------------------ checkpoints

    def list_checkpoints(self) -> List[CheckpointInfo]:
        """Every committed checkpoint, by id."""
        response = self._unary(self._stub.ListCheckpoints, pb.ListCheckpointsRequest())
        return [CheckpointInfo.from_proto(c) for c in response.checkpoints]

    def describe(self, checkpoint: str) -> CheckpointDescription:
        """A stored checkpoint's summary and every tensor, in source file order."""
        response = self._unary(self._stub.DescribeCheckpoint,
                               pb.DescribeCheckpointRequest(checkpoint_id=checkpoint))
        return CheckpointDescription(CheckpointInfo.from_proto(response.info),
                                     [TensorDescription.from_proto(t) for t in response.tensors])

    def delete_checkpoint(self, checkpoint: str) -> None:
        self._unary(self._stub.DeleteCheckpoint,
                    pb.DeleteCheckpointRequest(checkpoint_id=checkpoint))

    def dependencies(self, checkpoint: Optional[str] = None, dst_strategy: Optional[str] = None,
                     rank: Optional[int] = None, *,
                     source_strategy: Optional[str] = None) -> Dict[int, List[int]]:
        """Which source ranks each destination rank of `dst_strategy` reads: {rank: [source
        ranks, ascending]} for `rank`, or for every destination rank when `rank` is None. The
        source is a stored `checkpoint` (its strategy and tensors) or, instead, a registered
        `source_strategy` (layouts only)."""
        if (checkpoint is None) == (source_strategy is None):
            raise InvalidArgument("dependencies needs either a checkpoint or a source_strategy")
        if not dst_strategy:
            raise InvalidArgument("dependencies needs a dst_strategy")
        request = pb.RankDependenciesRequest(destination_strategy=dst_strategy)
        if checkpoint is not None:
            request.checkpoint_id = checkpoint
        else:
            request.source_strategy = source_strategy
        if rank is None:
            request.all = True
        else:
            request.rank = int(rank)
        response = self._unary(self._stub.RankDependencies, request)
        if rank is not None and len(response.ranks) != 1:
            raise Internal(f"ckptd answered {len(response.ranks)} ranks for a one-rank "
                           f"dependency query")
        return {r.rank: list(r.source_ranks) for r in response.ranks}

    # ------------------------------------------------------------------------ jobs

    def submit_transform(self, checkpoint: str, *, dst_strategy: Optional[str] = None,
                         new_checkpoint: Optional[str] = None,
                         export_dir: Optional[str] = None, merged_file: Optional[str] = None,
                         ranks: Optional[Sequence[int]] = None, prefix: Optional[str] = None,
                         job_id: Optional[str] = None) -> Job:
        """Submits a server-side transform job producing exactly one of: a new stored
        checkpoint `new_checkpoint` under `dst_strategy`; MindSpore's layout
        `export_dir`/rank_<r>/<prefix><r>.ckpt beneath the server's --export-root (paths are
        relative to it; `ranks`: the destination ranks to write, default all; `prefix` default
        "checkpoint_"); or one
        `merged_file` of whole tensors there. A client-chosen `job_id` makes submission
        idempotent: the same request again returns the existing job with `created` False
        (AlreadyExists when the id is taken by a different request)."""
        outputs = [o for o in (new_checkpoint, export_dir, merged_file) if o is not None]
        if len(outputs) != 1:
            raise InvalidArgument("submit_transform needs exactly one of new_checkpoint, "
                                  "export_dir or merged_file")
        if export_dir is None and (ranks is not None or prefix is not None):
            raise InvalidArgument("ranks and prefix apply to export_dir only")
        target = pb.TransformTarget()
        if new_checkpoint is not None:
            target.new_checkpoint_id = new_checkpoint
        elif export_dir is not None:
            target.export_dir = os.fspath(export_dir)
            target.ranks.extend(int(r) for r in (ranks or ()))
            if prefix is not None:
                target.prefix = prefix
        else:
            target.merged_file = os.fspath(merged_file)
        request = _wire.submit_transform_request(job_id or "", checkpoint, dst_strategy or "",
                                                 target)
        response = self._unary(self._stub.SubmitTransform, request)
        return Job.from_proto(response.job, created=response.created)

    def get_job(self, job_id: str) -> Job:
        return Job.from_proto(self._unary(self._stub.GetJob, pb.GetJobRequest(job_id=job_id)))

    def cancel_job(self, job_id: str) -> Job:
        """Asks the server to cancel a queued or running job (its partial output is removed);
        returns the job as the server left it."""
        return Job.from_proto(self._unary(self._stub.CancelJob,
                                          pb.CancelJobRequest(job_id=job_id)))

    def delete_job(self, job_id: str) -> None:
        """Removes a finished job's record (FailedPrecondition while it is queued or running,
        NotFound for an unknown id). Below the admin role, only the job's owner may."""
        self._unary(self._stub.DeleteJob, pb.DeleteJobRequest(job_id=job_id))

    def list_jobs(self) -> List[Job]:
        """Every job, by id."""
        response = self._unary(self._stub.ListJobs, pb.ListJobsRequest())
        return [Job.from_proto(j) for j in response.jobs]

    def watch_job(self, job_id: str) -> Iterator[Job]:
        """Yields the job's state whenever it changes (at most a few times a second) until it
        ends; the last one yielded is terminal (job.done). Unavailable when the server ends the
        watch early (the job itself continues on the server: watch it again). Closing the
        iterator cancels the watch."""
        call = self._stub.WatchJob(pb.WatchJobRequest(job_id=job_id), metadata=self._metadata)
        last = None
        try:
            for m in call:
                last = Job.from_proto(m)
                yield last
        except grpc.RpcError as e:
            error = from_rpc_error(e, self.address)
            raise type(error)(f"watching job {job_id}: {error.message}") from None
        finally:
            call.cancel()
        if last is None:
            raise Internal(f"ckptd ended the watch of job {job_id} without sending its state")
        if not last.done:
            raise Unavailable(f"ckptd ended the watch of job {job_id} while it was "
                              f"{last.state.name}; the job continues on the server")

    def wait_job(self, job_id: str, on_update: Optional[Callable[[Job], None]] = None) -> Job:
        """Watches the job until it ends and returns its terminal state (check job.succeeded
        and job.reason); `on_update` gets every state on the way."""
        last = None
        for job in self.watch_job(job_id):
            if on_update is not None:
                on_update(job)
            last = job
        return last

    # ------------------------------------------------------------------------ stats

    def stats(self) -> Dict[str, int]:
        """The server's counters (ServerStats) by field name."""
        response = self._unary(self._stub.GetStats, pb.GetStatsRequest())
        return {field.name: getattr(response, field.name)
                for field in response.DESCRIPTOR.fields}


def _strategy_format(name: str) -> int:
    if name == "json":
        return pb.STRATEGY_FORMAT_JSON
    if name == "binary":
        return pb.STRATEGY_FORMAT_BINARY
    raise InvalidArgument(f"strategy format must be 'json' or 'binary', got {name!r}")


def _source_file_label(path: str) -> str:
    """"rank_<r>/<file>" when the file sits in a rank directory, else its name: identifies it in
    `describe` without exposing the client's absolute paths (as the C++ client)."""
    parent = os.path.basename(os.path.dirname(path))
    name = os.path.basename(path)
    return f"{parent}/{name}" if parent.startswith("rank_") else name
