"""The Python client against a ckptd with TLS and bearer tokens (docs/security.md): certificates
and tokens made by deploy/make-test-pki.sh with the openssl CLI, passed as arguments and as the
CKPT_TLS_CA / CKPT_TOKEN_FILE environment variables ckptctl also reads."""

import os
import subprocess

import pytest

import ckptd
import ckptd_testing as T

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
                      "make-test-pki.sh")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki") / "pki"
    subprocess.run(["/bin/bash", SCRIPT, str(directory)], check=True, capture_output=True)
    return directory


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory, pki):
    s = T.Server(tmp_path_factory.mktemp("ckptd-tls") / "data",
                 ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
                  "--auth-tokens", str(pki / "tokens.txt")]).start()
    yield s
    s.stop()


def connect(server, pki, role=None, **kwargs):
    return ckptd.Client(server.address, tls_ca=pki / "ca.pem",
                        token_file=(pki / f"{role}.token") if role else None, **kwargs)


def test_roles_over_tls(tls_server, pki, sample_dir):
    with connect(tls_server, pki, "writer") as writer:
        writer.put_strategy("src", sample_dir / "src_strategy.ckpt")
        writer.upload_dir("demo", "src", sample_dir / "checkpoint")
    with connect(tls_server, pki, "reader") as reader:
        assert [c.id for c in reader.list_checkpoints()] == ["demo"]
        assert reader.fetch("demo", merged=True)
        with pytest.raises(ckptd.PermissionDenied) as denied:
            reader.delete_checkpoint("demo")
        assert "principal reader" in denied.value.message
        assert "needs role admin" in denied.value.message
    with connect(tls_server, pki, None) as anonymous:
        with pytest.raises(ckptd.Unauthenticated) as error:
            anonymous.list_checkpoints()
        assert "demo" not in error.value.message


def test_environment_variables_name_the_ca_and_the_token(tls_server, pki, monkeypatch):
    monkeypatch.setenv("CKPT_TLS_CA", str(pki / "ca.pem"))
    monkeypatch.setenv("CKPT_TOKEN_FILE", str(pki / "admin.token"))
    with ckptd.Client(tls_server.address) as admin:
        assert "fetch_bytes_sent" in admin.stats()
    # The same token file through ckptctl.
    out = subprocess.run([T.CKPTCTL, "--server", tls_server.address, "ls"], check=True,
                         capture_output=True, text=True, env=dict(os.environ)).stdout
    assert "demo" in out


def test_a_plaintext_client_cannot_talk_to_a_tls_server(tls_server, pki):
    with ckptd.Client(tls_server.address, token_file=pki / "admin.token") as plain:
        with pytest.raises(ckptd.Unavailable):
            plain.list_checkpoints()
