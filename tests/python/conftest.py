"""pytest fixtures of the Python client's tests: real ckptd servers and the ckptctl sample."""

import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckptd_testing as T  # noqa: E402

import ckptd  # noqa: E402

# Destination strategies registered next to the sample's own 3-rank one (d3): world sizes.
DST_WORLDS = {"d3": 3, "d2col": 2, "d6opt": 6}


def _sample_layouts():
    two_d = ["embedding.word_embedding.embedding_table", "layers.0.attention.dense.weight",
             "layers.0.output.weight", "layers.1.attention.dense.weight"]
    d2col = {n: T.layout([2], [-1, 0]) for n in two_d}
    d2col["layers.1.ffn.weight"] = T.layout([2], [-1, 0])
    d2col["layers.0.attention.dense.bias"] = T.layout([2], [0])
    d2col["layers.0.norm.gamma"] = T.layout([2], [-1])
    d2col["layers.1.norm.gamma"] = T.layout([2], [-1])
    # 6 devices as 3 x 2: rows over 3 and columns over 2; the ffn weight's rows over 3,
    # replicated over 2 and optimizer-sharded across those 2.
    d6opt = {n: T.layout([3, 2], [1, 0]) for n in two_d}
    d6opt["layers.1.ffn.weight"] = T.layout([3, 2], [1, -1], opt_shard_size=2)
    d6opt["layers.0.attention.dense.bias"] = T.layout([3, 2], [1])
    d6opt["layers.0.norm.gamma"] = T.layout([3, 2], [0])
    d6opt["layers.1.norm.gamma"] = T.layout([3, 2], [-1])
    return {"d2col": d2col, "d6opt": d6opt}


# ctest runs the fetching suites once per fetch path: CKPTD_PY_NATIVE=0 (grpcio) and =1 (the
# native module ckptd._native). The native run skips when the module was not built: pytest exits
# with SKIP_EXIT_CODE, which ctest reports as "Skipped" with this message; it fails instead when
# CKPTD_PY_EXPECT_NATIVE=1 (CMake built it: it must import).
NATIVE_RUN = os.environ.get("CKPTD_PY_NATIVE", "1").strip() != "0"
SKIP_EXIT_CODE = 77  # tests/CMakeLists.txt: SKIP_RETURN_CODE of the native runs


def pytest_collection_modifyitems(config, items):
    from ckptd import _native_fetch
    if not NATIVE_RUN or _native_fetch.available():
        return
    if os.environ.get("CKPTD_PY_EXPECT_NATIVE") == "1":
        raise pytest.UsageError("CKPTD_PY_NATIVE=1 but ckptd._native does not import although "
                                "CMake built it")
    pytest.exit("native fetch path: ckptd._native was not built (needs pybind11-dev and "
                "python3-dev); skipping this suite", returncode=SKIP_EXIT_CODE)


@pytest.fixture(scope="session", autouse=True)
def environment():
    T.require_environment()


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory):
    """`ckptctl sample` output: src_strategy.ckpt (8 ranks: 2 stages x 4), dst_strategy.json
    (3 ranks), checkpoint/rank_<r>/sample-1_10.ckpt and whole.ckpt, plus the JSON strategies
    of DST_WORLDS."""
    directory = tmp_path_factory.mktemp("sample") / "demo"
    T.ctl(None, "sample", directory)
    for name, layouts in _sample_layouts().items():
        T.write_strategy(directory / f"{name}.json", layouts)
    return directory


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A fresh ckptd for the module."""
    s = T.Server(tmp_path_factory.mktemp("ckptd") / "data").start()
    yield s
    s.kill()


@pytest.fixture(scope="module")
def demo(server, sample_dir):
    """`server` holding the sample as checkpoint "demo" (uploaded by ckptctl) under source
    strategy "src", with the destination strategies of DST_WORLDS registered."""
    T.ctl(server, "strategy", "put", "src", sample_dir / "src_strategy.ckpt")
    T.ctl(server, "strategy", "put", "d3", sample_dir / "dst_strategy.json")
    for name in _sample_layouts():
        T.ctl(server, "strategy", "put", name, sample_dir / f"{name}.json")
    T.ctl_upload_dir(server, "demo", "src", sample_dir / "checkpoint")
    return types.SimpleNamespace(server=server, sample_dir=sample_dir, worlds=DST_WORLDS)


@pytest.fixture
def client(server):
    with ckptd.Client(server.address) as c:
        yield c
