"""The exception hierarchy: server errors by gRPC code, a chunk corrupted in the store, a server
killed mid-fetch, an unreachable server, bad arguments; TLS and token options."""

import os
import re
import subprocess
import time
from concurrent import futures

import grpc
import numpy as np
import pytest

import ckptd
import ckptd_testing as T
from ckptd._proto import ckpt_pb2 as pb
from ckptd._proto import ckpt_pb2_grpc


@pytest.fixture(scope="module")
def demo_server(server, sample_dir):
    T.ctl(server, "strategy", "put", "src", sample_dir / "src_strategy.ckpt")
    T.ctl(server, "strategy", "put", "d3", sample_dir / "dst_strategy.json")
    T.ctl_upload_dir(server, "demo", "src", sample_dir / "checkpoint")
    return server


def test_every_error_is_a_ckptd_error_named_after_its_code():
    classes = [ckptd.Cancelled, ckptd.Unknown, ckptd.InvalidArgument, ckptd.DeadlineExceeded,
               ckptd.NotFound, ckptd.AlreadyExists, ckptd.PermissionDenied,
               ckptd.ResourceExhausted, ckptd.FailedPrecondition, ckptd.Aborted,
               ckptd.OutOfRange, ckptd.Unimplemented, ckptd.Internal, ckptd.Unavailable,
               ckptd.DataLoss, ckptd.Unauthenticated]
    assert {c.code for c in classes} == set(grpc.StatusCode) - {grpc.StatusCode.OK}
    for cls in classes:
        assert issubclass(cls, ckptd.Error)
        assert cls.__name__.lower() == cls.code.name.replace("_", "").lower()
        error = cls("the message")
        assert error.message == "the message" and str(error) == f"{cls.code.name}: the message"


def test_unknown_checkpoint_is_not_found_with_the_servers_message(demo_server, client, tmp_path):
    with pytest.raises(ckptd.NotFound) as error:
        client.fetch("no-such-checkpoint", "d3", 0)
    assert "no-such-checkpoint" in error.value.message
    with pytest.raises(ckptd.NotFound):
        client.fetch_to_file("no-such-checkpoint", merged=True, path=tmp_path / "x.ckpt")
    assert os.listdir(tmp_path) == []
    with pytest.raises(ckptd.NotFound):
        list(client.iter_fetch("no-such-checkpoint", merged=True))
    with pytest.raises(ckptd.NotFound):
        client.describe("no-such-checkpoint")
    with pytest.raises(ckptd.NotFound):
        client.dependencies("no-such-checkpoint", "d3")
    with pytest.raises(ckptd.NotFound):
        client.fetch("demo", "no-such-strategy", 0)
    with pytest.raises(ckptd.NotFound):
        client.get_job("no-such-job")


def test_rank_outside_the_world_is_out_of_range(demo_server, client):
    with pytest.raises(ckptd.OutOfRange) as error:
        client.fetch("demo", "d3", 3)
    assert error.value.message
    with pytest.raises(ckptd.OutOfRange):
        client.dependencies("demo", "d3", 7)


def test_bad_arguments_are_invalid_argument_before_any_call(tmp_path):
    client = ckptd.Client("127.0.0.1:1")  # never contacted
    with pytest.raises(ckptd.InvalidArgument):
        client.fetch("demo")
    with pytest.raises(ckptd.InvalidArgument):
        client.fetch("demo", "d3")
    with pytest.raises(ckptd.InvalidArgument):
        client.fetch("demo", "d3", 0, merged=True)
    with pytest.raises(ckptd.InvalidArgument):
        client.fetch("demo", "d3", 0, include="layers.*")
    with pytest.raises(ckptd.InvalidArgument):
        client.submit_transform("demo", dst_strategy="d3")
    with pytest.raises(ckptd.InvalidArgument):
        client.dependencies(dst_strategy="d3")
    with pytest.raises(ckptd.InvalidArgument):
        ckptd.Client("127.0.0.1:1", timeout=0)
    with pytest.raises(ckptd.InvalidArgument):
        ckptd.Client("127.0.0.1:1", tls_cert=tmp_path / "cert.pem")
    with pytest.raises(ckptd.InvalidArgument):
        ckptd.Client("127.0.0.1:1", token_file=tmp_path / "missing-token")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ckptd.InvalidArgument):
        ckptd.Client("127.0.0.1:1", token_file=tmp_path / "empty")
    with pytest.raises(ckptd.InvalidArgument):
        client.fetch_to_file("demo", merged=True, path=tmp_path)  # a directory


def test_unreachable_server_is_unavailable_naming_it():
    client = ckptd.Client("127.0.0.1:1", timeout=5)
    with pytest.raises(ckptd.Unavailable) as error:
        client.list_checkpoints()
    assert "ckptd at 127.0.0.1:1" in error.value.message
    with pytest.raises(ckptd.Unavailable):
        client.fetch("demo", merged=True)


def test_address_defaults_to_ckpt_server(monkeypatch, demo_server):
    monkeypatch.setenv("CKPT_SERVER", demo_server.address)
    assert ckptd.Client().address == demo_server.address
    assert "demo" in [c.id for c in ckptd.Client().list_checkpoints()]
    monkeypatch.delenv("CKPT_SERVER")
    assert ckptd.Client().address == ckptd.DEFAULT_ADDRESS


# ---------------------------------------------------------------------------- corruption


def _flip_a_stored_byte(data_dir):
    """Flips one byte of chunk data in the largest segment file of a stopped server's store (a
    byte that is not zero: segment files are chunks back to back, with zero-filled holes)."""
    segments = os.path.join(data_dir, "segments")
    files = [os.path.join(segments, f) for f in os.listdir(segments) if f.endswith(".seg")]
    path = max(files, key=os.path.getsize)
    with open(path, "r+b") as f:
        content = bytearray(f.read())
        nonzero = np.flatnonzero(np.frombuffer(bytes(content), np.uint8))
        at = int(nonzero[len(nonzero) // 2])
        content[at] ^= 0x5A
        f.seek(0)
        f.write(content)


def test_chunk_corrupted_in_the_store_raises_data_loss(tmp_path):
    # One whole tensor: a merged fetch reads its stored chunks as they are and sends them with
    # their stored checksums, so only the client can notice the flipped byte.
    from ckptd._ckpt_file import CkptWriter
    rng = np.random.default_rng(3)
    values = rng.integers(1, 2**32, size=(512, 2048), dtype=np.uint32)
    source = tmp_path / "one.ckpt"
    with open(source, "wb") as f:
        writer = CkptWriter(f)
        writer.begin_tensor("weight", "UInt32", [512, 2048], values.nbytes)
        writer.append(values.data)
    server = T.Server(tmp_path / "data").start()
    try:
        T.ctl(server, "upload", "one", "--file", source)
        assert server.stop() == 0
        _flip_a_stored_byte(server.data_dir)
        server.start()
        client = ckptd.Client(server.address)
        with pytest.raises(ckptd.DataLoss) as error:
            client.fetch("one", merged=True)
        match = re.search(r"checkpoint one tensor weight: bytes \[(\d+), (\d+)\) failed their "
                          r"XXH3-64 checksum", error.value.message)
        assert match, error.value.message
        assert 0 <= int(match.group(1)) < int(match.group(2)) <= values.nbytes
        out = tmp_path / "out"
        out.mkdir()
        with pytest.raises(ckptd.DataLoss):
            client.fetch_to_file("one", merged=True, path=out / "merged.ckpt")
        assert os.listdir(out) == []
        with pytest.raises(ckptd.DataLoss):
            for _ in client.iter_fetch("one", merged=True):
                pass
        # The channel is still good for other calls.
        assert client.describe("one").info.id == "one"
    finally:
        server.kill()


# ---------------------------------------------------------------------------- server killed


def _big_whole_file(path, tensors=4, rows=1024, cols=8192):
    from ckptd._ckpt_file import CkptWriter
    row = np.arange(cols, dtype=np.float32)
    with open(path, "wb") as f:
        writer = CkptWriter(f)
        for t in range(tensors):
            writer.begin_tensor(f"t{t}", "Float32", [rows, cols], rows * cols * 4)
            for _ in range(0, rows, 64):
                writer.append(np.tile(row + t, 64).data)
        writer.finish()


def test_server_killed_mid_fetch_raises_unavailable_and_leaves_no_file(tmp_path):
    server = T.Server(tmp_path / "data").start()
    try:
        source = tmp_path / "big.ckpt"
        _big_whole_file(source)  # 128 MiB
        T.ctl(server, "upload", "big", "--file", source)
        client = ckptd.Client(server.address)
        out = tmp_path / "out"
        out.mkdir()
        killed = []

        def kill_on_first_bytes(done, total):
            if done > 0 and not killed:
                killed.append(done)
                server.kill()

        with pytest.raises(ckptd.Unavailable) as error:
            client.fetch_to_file("big", merged=True, path=out / "big.ckpt",
                                 progress=kill_on_first_bytes)
        assert killed and server.address in error.value.message
        assert os.listdir(out) == []
    finally:
        server.kill()


def test_server_killed_mid_iter_fetch_raises_unavailable(tmp_path):
    server = T.Server(tmp_path / "data").start()
    try:
        source = tmp_path / "big.ckpt"
        _big_whole_file(source)
        T.ctl(server, "upload", "big", "--file", source)
        client = ckptd.Client(server.address)
        stream = client.iter_fetch("big", merged=True)
        name, _ = next(stream)
        server.kill()
        with pytest.raises(ckptd.Unavailable):
            for _ in stream:
                pass
    finally:
        server.kill()


# ---------------------------------------------------------------------------- TLS and tokens


class _RecordingService(ckpt_pb2_grpc.CheckpointServiceServicer):
    """Answers ListStrategies when the caller presents `token`; records the metadata seen."""

    def __init__(self, token):
        self.token = token
        self.seen = []

    def ListStrategies(self, request, context):
        metadata = dict(context.invocation_metadata())
        self.seen.append(metadata.get("authorization"))
        if metadata.get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "bad or missing token")
        return pb.ListStrategiesResponse(strategies=[pb.StrategyInfo(name="tls-ok")])


def _certificate(directory):
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return key, cert


def test_tls_and_token_options_and_their_environment_variables(tmp_path, monkeypatch):
    key, cert = _certificate(tmp_path)
    service = _RecordingService("s3cret")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    ckpt_pb2_grpc.add_CheckpointServiceServicer_to_server(service, server)
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())],
                                              root_certificates=cert.read_bytes(),
                                              require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        address = f"127.0.0.1:{port}"
        token = tmp_path / "token"
        token.write_text("s3cret\n")
        client = ckptd.Client(address, tls_ca=cert, tls_cert=cert, tls_key=key,
                              token_file=token)
        assert [s.name for s in client.list_strategies()] == ["tls-ok"]
        assert service.seen[-1] == "Bearer s3cret"

        # The same through the environment.
        monkeypatch.setenv("CKPT_SERVER", address)
        monkeypatch.setenv("CKPT_TLS_CA", str(cert))
        monkeypatch.setenv("CKPT_TLS_CERT", str(cert))
        monkeypatch.setenv("CKPT_TLS_KEY", str(key))
        monkeypatch.setenv("CKPT_TOKEN_FILE", str(token))
        assert [s.name for s in ckptd.Client().list_strategies()] == ["tls-ok"]

        wrong = tmp_path / "wrong"
        wrong.write_text("guess")
        with pytest.raises(ckptd.PermissionDenied) as error:
            ckptd.Client(address, token_file=wrong).list_strategies()
        assert error.value.message == "bad or missing token"

        # Without the client certificate the handshake fails: the server is unreachable.
        monkeypatch.delenv("CKPT_TLS_CERT")
        monkeypatch.delenv("CKPT_TLS_KEY")
        with pytest.raises(ckptd.Unavailable):
            ckptd.Client(timeout=5).list_strategies()
    finally:
        server.stop(None)


def test_dropping_an_unfinished_iter_fetch_cancels_its_stream(tmp_path):
    server = T.Server(tmp_path / "data").start()
    try:
        source = tmp_path / "big.ckpt"
        _big_whole_file(source)
        T.ctl(server, "upload", "big", "--file", source)
        client = ckptd.Client(server.address)
        stream = client.iter_fetch("big", merged=True)
        next(stream)
        assert client.stats()["fetch_streams"] == 1
        del stream  # no close(): the last reference goes
        deadline = time.monotonic() + 10
        while client.stats()["fetch_streams"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.stats()["fetch_streams"] == 0
    finally:
        server.kill()


def test_a_fetch_holds_its_arrays_and_a_bounded_remainder(tmp_path):
    """Peak memory of a fetch (measured by the bench script in its own process): the arrays
    returned plus a bounded amount, not a buffer growing with the server's lead."""
    import json
    import sys
    server = T.Server(tmp_path / "data").start()
    try:
        source = tmp_path / "big.ckpt"
        _big_whole_file(source)  # 128 MiB
        T.ctl(server, "upload", "big", "--file", source)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench",
                              "python_fetch_bench.py")
        run = subprocess.run([sys.executable, script, "--server", server.address,
                              "--checkpoint", "big", "--merged", "--passes", "1"],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        assert report["max_rank_bytes"] == 128 << 20
        growth = report["peak_rss_bytes"] - report["baseline_rss_bytes"]
        assert growth <= 1.1 * report["max_rank_bytes"] + (32 << 20), report
    finally:
        server.kill()


# ---------------------------------------------------------------------------- crafted streams


def _xxh3(data):
    import xxhash
    return xxhash.xxh3_64_intdigest(bytes(data))


def _header(name, shape):
    nbytes = int(np.prod(shape)) * 4
    return pb.FetchResponse(tensor=pb.FetchTensorHeader(
        name=name, dtype="Float32", local_shape=shape, global_shape=shape,
        box_lo=[0] * len(shape), box_hi=shape, total_bytes=nbytes))


def _rows(array):
    data = array.tobytes()
    return pb.FetchResponse.FromString(
        T.fetch_data(data, part_bytes=[len(data)], part_checksums=[_xxh3(data)]))


def _tiles(array, boxes, band_rows, corrupt_tile=None):
    """A message of tiles of `array` (the slice); tile `corrupt_tile` has a byte flipped after
    its checksum was taken."""
    data, sizes, sums, coords = b"", [], [], []
    for i, (lo, hi) in enumerate(boxes):
        tile = bytearray(array[tuple(slice(l, u) for l, u in zip(lo, hi))].tobytes())
        sums.append(_xxh3(tile))
        if i == corrupt_tile:
            tile[len(tile) // 2] ^= 0x5A
        data += bytes(tile)
        sizes.append(len(tile))
        coords += list(lo) + list(hi)
    return pb.FetchResponse.FromString(T.fetch_data(
        data, part_bytes=sizes, part_checksums=sums, tile_box=coords, band_rows=band_rows))


class _CraftedFetch(ckpt_pb2_grpc.CheckpointServiceServicer):
    """Answers every Fetch with `messages`, then (with `stall`) sends nothing more until the
    call ends, recording when it did."""

    def __init__(self, messages, stall=False):
        import threading
        self.messages = messages
        self.stall = stall
        self.ended = threading.Event()

    def Fetch(self, request, context):
        context.add_callback(self.ended.set)
        yield from self.messages
        if self.stall:
            self.ended.wait(60)


def _crafted_server(service):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    ckpt_pb2_grpc.add_CheckpointServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def _three_tensors():
    rng = np.random.default_rng(11)
    return {"a": rng.standard_normal((4, 6), dtype=np.float32),
            "b": rng.standard_normal((8, 6), dtype=np.float32),
            "c": rng.standard_normal((2, 6), dtype=np.float32)}


def _crafted_stream(tensors, corrupt):
    """Tensor a as rows, b as two bands of 4 rows of two column tiles each (the second band's
    second tile corrupted when `corrupt`), c as rows."""
    a, b, c = tensors["a"], tensors["b"], tensors["c"]
    total = a.nbytes + b.nbytes + c.nbytes
    return [pb.FetchResponse(summary=pb.FetchPlanSummary(tensor_count=3, total_bytes=total,
                                                         source_ranks=[0])),
            _header("a", [4, 6]), _rows(a),
            _header("b", [8, 6]),
            _tiles(b, [([0, 0], [4, 3]), ([0, 3], [4, 6])], 4),
            _tiles(b, [([4, 0], [8, 3]), ([4, 3], [8, 6])], 4, corrupt_tile=1 if corrupt else None),
            _header("c", [2, 6]), _rows(c)]


def test_a_crafted_stream_of_rows_and_tiles_arrives_exactly():
    tensors = _three_tensors()
    server, address = _crafted_server(_CraftedFetch(_crafted_stream(tensors, corrupt=False)))
    try:
        client = ckptd.Client(address)
        fetched = client.fetch("ck", merged=True)
        assert sorted(fetched) == ["a", "b", "c"]
        for name, array in tensors.items():
            np.testing.assert_array_equal(fetched[name], array)
        assert [name for name, _ in client.iter_fetch("ck", merged=True)] == ["a", "b", "c"]
    finally:
        server.stop(None)


def test_a_corrupt_tile_raises_data_loss_naming_its_bytes_and_delivers_nothing_wrong():
    tensors = _three_tensors()
    server, address = _crafted_server(_CraftedFetch(_crafted_stream(tensors, corrupt=True)))
    try:
        client = ckptd.Client(address)
        # The second band starts 4 rows (96 bytes) into b; its second tile is the message's
        # bytes [48, 96).
        expected = r"^checkpoint ck tensor b: bytes \[144, 192\) failed their XXH3-64 checksum"
        with pytest.raises(ckptd.DataLoss) as error:
            client.fetch("ck", merged=True)
        assert re.search(expected, error.value.message), error.value.message
        delivered = []
        with pytest.raises(ckptd.DataLoss) as error:
            for name, array in client.iter_fetch("ck", merged=True):
                delivered.append(name)
                np.testing.assert_array_equal(array, tensors[name])
        assert re.search(expected, error.value.message), error.value.message
        assert delivered == ["a"]
    finally:
        server.stop(None)


def test_closing_an_iter_fetch_ends_a_stalled_stream_promptly():
    """close() ends the call within a fraction of a second even when the server sends nothing
    more (here: the rest of tensor b never comes)."""
    tensors = _three_tensors()
    service = _CraftedFetch(_crafted_stream(tensors, corrupt=False)[:5], stall=True)
    server, address = _crafted_server(service)
    try:
        client = ckptd.Client(address)
        stream = client.iter_fetch("ck", merged=True)
        name, array = next(stream)
        assert name == "a"
        np.testing.assert_array_equal(array, tensors["a"])
        time.sleep(0.2)  # the stream is stalled inside tensor b
        assert not service.ended.is_set()
        start = time.monotonic()
        stream.close()
        assert service.ended.wait(5), "the server's call did not end after close()"
        assert time.monotonic() - start < 2
        with pytest.raises(StopIteration):
            next(stream)
    finally:
        server.stop(None)
