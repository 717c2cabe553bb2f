"""Builds the `ckptd` package with its gRPC stubs generated from proto/ckpt.proto.

The stubs are never checked in: build_py runs protoc with Debian's grpc_python_plugin into the
build directory, mapping proto/ to ckptd/_proto/ so that the generated modules import each other
as ckptd._proto.ckpt_pb2 (the same layout the CMake build makes in build/python).
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))


def _tool(name, env):
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise SystemExit(f"ckptd: {name} not found (install protobuf-compiler and "
                         f"protobuf-compiler-grpc, or set ${env})")
    return path


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        proto = os.path.join(PROTO_DIR, "ckpt.proto")
        if not os.path.isfile(proto):
            raise SystemExit(f"ckptd: {proto} not found: build from the ckptd source tree")
        out = os.path.abspath(self.build_lib)
        os.makedirs(os.path.join(out, "ckptd", "_proto"), exist_ok=True)
        subprocess.check_call([
            _tool("protoc", "PROTOC"),
            f"--proto_path=ckptd/_proto={PROTO_DIR}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--plugin=protoc-gen-grpc_python={_tool('grpc_python_plugin', 'GRPC_PYTHON_PLUGIN')}",
            "ckptd/_proto/ckpt.proto",
        ], cwd=out)


setup(cmdclass={"build_py": BuildPyWithStubs})
