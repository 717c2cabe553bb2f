"""The package installs with pip on Debian's packages alone: `pip install --no-build-isolation
./client/python` in a virtual environment that sees the system's python3-grpcio and friends, no
package index, the gRPC stubs generated during the install."""

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", ".."))


def test_pip_installs_the_package_with_generated_stubs(tmp_path):
    # A copy of the two source directories the build reads, so that setuptools' in-tree build
    # leaves the checkout alone.
    tree = tmp_path / "src"
    shutil.copytree(os.path.join(SOURCE, "client", "python"), tree / "client" / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copytree(os.path.join(SOURCE, "proto"), tree / "proto")
    venv = tmp_path / "venv"
    # No pip of its own: the system one (python3-pip), run by the venv's interpreter, installs
    # into the venv.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
                   check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", tree / "client" / "python"],
        capture_output=True, text=True)
    assert install.returncode == 0, install.stdout + install.stderr
    # Outside the build tree: PYTHONPATH must not point at build/python.
    # The pip-installed package has no native module: its fetches take the grpcio path even
    # when the environment asks for the native one.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CKPTD_PY_NATIVE"] = "1"
    probe = subprocess.run(
        [python, "-c",
         "import ckptd, ckptd.mindspore, ckptd._proto.ckpt_pb2_grpc as g, sys;"
         "from ckptd import _native_fetch as n;"
         "print(ckptd.__file__); print(ckptd.__version__);"
         "print(g.CheckpointServiceStub.__name__);"
         "print(n.available(), ckptd.Client('127.0.0.1:1').native_fetch)"],
        capture_output=True, text=True, env=env, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    path, version, stub, available, native = probe.stdout.split()
    assert path.startswith(str(venv)) and version == "0.1.0" and stub == "CheckpointServiceStub"
    assert available == "False" and native == "False"
