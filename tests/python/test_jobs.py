"""Transform jobs submitted and watched from Python; their output against the C++ client's.

The module's ckptd writes file outputs beneath its --export-root (the `export_root` fixture); job
paths are relative to it."""

import os

import numpy as np
import pytest

import ckptd
import ckptd_testing as T


@pytest.fixture(scope="module")
def export_root(tmp_path_factory):
    return tmp_path_factory.mktemp("export-root")


@pytest.fixture(scope="module")
def server(tmp_path_factory, export_root):
    """This module's ckptd (overriding conftest's): with --export-root."""
    s = T.Server(tmp_path_factory.mktemp("ckptd") / "data",
                 ["--export-root", str(export_root)]).start()
    yield s
    s.kill()


@pytest.fixture(scope="module")
def demo_server(server, sample_dir):
    T.ctl(server, "strategy", "put", "src", sample_dir / "src_strategy.ckpt")
    T.ctl(server, "strategy", "put", "d3", sample_dir / "dst_strategy.json")
    T.ctl_upload_dir(server, "demo", "src", sample_dir / "checkpoint")
    return server


def files_under(directory):
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out


def test_export_job_watched_from_python_equals_the_cpp_exports(demo_server, client, tmp_path,
                                                                export_root):
    target = export_root / "py-export"
    job = client.submit_transform("demo", dst_strategy="d3", export_dir="py-export",
                                  job_id="py-export")
    assert job.created is True and job.id == "py-export"
    assert (job.checkpoint_id, job.dst_strategy, job.export_dir) == ("demo", "d3", "py-export")
    updates = list(client.watch_job(job.id))
    assert updates and updates[-1].state == ckptd.JobState.SUCCEEDED and updates[-1].done
    assert all(not u.done for u in updates[:-1])
    final = updates[-1]
    assert final.progress.ranks_done == final.progress.ranks_total == 3
    assert final.progress.bytes_done == final.progress.bytes_total > 0
    assert client.get_job(job.id) == final

    mine = files_under(target)
    assert sorted(mine) == [f"rank_{r}/checkpoint_{r}.ckpt" for r in range(3)]
    client_side = tmp_path / "ctl-export"
    T.ctl_export(demo_server, "demo", "d3", client_side)
    assert files_under(client_side) == mine
    T.ctl_transform_export(demo_server, "demo", "d3", "ctl-transform")
    assert files_under(export_root / "ctl-transform") == mine
    # And each rank file is what fetch_to_file writes for that rank.
    for rank in range(3):
        path = tmp_path / f"fetched-{rank}.ckpt"
        client.fetch_to_file("demo", "d3", rank, path=path)
        assert path.read_bytes() == mine[f"rank_{rank}/checkpoint_{rank}.ckpt"]


def test_resubmission_is_idempotent_and_listed(demo_server, client, export_root):
    target = "again"
    first = client.submit_transform("demo", dst_strategy="d3", export_dir=target, ranks=[1],
                                    prefix="ms_", job_id="again")
    final = client.wait_job(first.id)
    assert final.succeeded and final.ranks == [1] and final.prefix == "ms_"
    assert sorted(files_under(export_root / target)) == ["rank_1/ms_1.ckpt"]
    second = client.submit_transform("demo", dst_strategy="d3", export_dir=target, ranks=[1],
                                     prefix="ms_", job_id="again")
    assert second.created is False and second.id == "again"
    with pytest.raises(ckptd.AlreadyExists):
        client.submit_transform("demo", dst_strategy="d3", export_dir=target, ranks=[2],
                                job_id="again")
    assert "again" in [j.id for j in client.list_jobs()]
    # Cancelling a finished job leaves it as it was; removing it drops its record.
    assert client.cancel_job("again").state == ckptd.JobState.SUCCEEDED
    client.delete_job("again")
    assert "again" not in [j.id for j in client.list_jobs()]
    with pytest.raises(ckptd.NotFound):
        client.delete_job("again")


def test_new_checkpoint_job_stores_the_resharded_layout(demo_server, client):
    seen = []
    job = client.submit_transform("demo", dst_strategy="d3", new_checkpoint="demo-d3")
    final = client.wait_job(job.id, on_update=seen.append)
    assert final.succeeded and seen[-1] == final and final.new_checkpoint == "demo-d3"
    info = {c.id: c for c in client.list_checkpoints()}["demo-d3"]
    assert info.source_strategy == "d3" and info.ranks == 3
    for rank in range(3):
        a = client.fetch("demo", "d3", rank)
        b = client.fetch("demo-d3", "d3", rank)
        assert list(a) == list(b)
        assert all(a[n].tobytes() == b[n].tobytes() for n in a)


def test_merged_file_job_equals_ckptctl_fetch_merged(demo_server, client, tmp_path, export_root):
    path = export_root / "merged.ckpt"
    final = client.wait_job(client.submit_transform("demo", merged_file="merged.ckpt").id)
    assert final.succeeded and final.merged_file == "merged.ckpt" and final.dst_strategy == ""
    reference = tmp_path / "reference.ckpt"
    T.ctl_fetch(demo_server, "demo", reference, merged=True)
    assert path.read_bytes() == reference.read_bytes()


def test_refused_submissions_raise_the_servers_error(demo_server, client, tmp_path, export_root):
    for escape in ("../x", "/etc/x", str(tmp_path / "x")):
        with pytest.raises(ckptd.PermissionDenied) as error:
            client.submit_transform("demo", dst_strategy="d3", export_dir=escape)
        assert f'"{escape}"' in error.value.message
        assert str(export_root) not in error.value.message
    with pytest.raises(ckptd.InvalidArgument) as error:
        client.submit_transform("demo", merged_file="some-dir/")
    assert "names a directory" in error.value.message
    blocker = export_root / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ckptd.FailedPrecondition) as error:
        client.submit_transform("demo", dst_strategy="d3", export_dir="a-file/out")
    assert "a-file" in error.value.message
    with pytest.raises(ckptd.AlreadyExists):
        client.submit_transform("demo", merged_file="a-file")
    assert blocker.read_text() == "not a directory"
    with pytest.raises(ckptd.NotFound):
        client.submit_transform("no-such", dst_strategy="d3", new_checkpoint="x")


def test_watch_of_unknown_job_is_not_found(demo_server, client):
    with pytest.raises(ckptd.NotFound) as error:
        list(client.watch_job("no-such-job"))
    assert error.value.message.startswith("watching job no-such-job: ")


def test_cancel_of_a_running_job_leaves_no_output(tmp_path):
    root = tmp_path / "export"
    root.mkdir()
    server = T.Server(tmp_path / "data", ["--job-bandwidth-mib", "1",
                                          "--export-root", str(root)]).start()
    try:
        from ckptd._ckpt_file import CkptWriter
        source = tmp_path / "slow.ckpt"
        with open(source, "wb") as f:
            writer = CkptWriter(f)
            values = np.arange(1 << 20, dtype=np.float32)
            for t in range(8):  # 32 MiB: half a minute at the job's 1 MiB/s
                writer.begin_tensor(f"t{t}", "Float32", [1 << 20], values.nbytes)
                writer.append(values.data)
        client = ckptd.Client(server.address)
        client.upload_file("slow", source)
        job = client.submit_transform("slow", merged_file="slow-merged.ckpt", job_id="victim")
        cancelled = None
        for update in client.watch_job(job.id):
            if cancelled is None and update.state == ckptd.JobState.RUNNING and \
                    update.progress.bytes_done > 0:
                cancelled = client.cancel_job(job.id)
            last = update
        assert cancelled is not None
        assert last.state == ckptd.JobState.CANCELLED
        assert client.get_job(job.id).state == ckptd.JobState.CANCELLED
        assert os.listdir(root) == []
    finally:
        server.kill()
