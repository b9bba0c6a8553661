"""Tuning on a Dask cluster, in CI on the CPU: a local cluster of two process workers, each with a
GPU child process, and a fake measurer (tests/fake_cluster.py, tests/library_fake.py) in place of
NVRTC and the GPU: a search, and a library, which records the same database on two workers as on
one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_cluster import CUBLAS_TFLOPS, FakeMeasurer, tflops_of
from gemmgen.plan.space import expand, point_key
from gemmgen.language.load import parse
from gemmgen.gpu.verify import Case

SPECS = Path(__file__).resolve().parent.parent / "specs"

distributed = pytest.importorskip("distributed", reason="pip install 'gemmgen[distributed]'")

SPACE = """
kernel cluster_space {
  block  {32, 64} x {32, 64} x 8
  thread {4, 8} x 4
}
"""


@pytest.fixture(scope="module")
def client():
    from gemmgen.tuning.distributed import local_cluster
    with local_cluster([0, 0], threads_per_worker=2) as cluster, distributed.Client(cluster) as client:
        yield client


@pytest.fixture
def space():
    spec = parse(SPACE)[0]
    return spec, [point_key(plan.spec) for plan in expand(spec).plans]


def test_the_local_cluster_pins_one_worker_per_gpu_declared_as_a_resource():
    from gemmgen.tuning.distributed import local_cluster
    cluster = local_cluster([3, 5], threads_per_worker=2)
    try:
        specs = [w["options"] for w in cluster.worker_spec.values()]
        assert [o["env"]["CUDA_VISIBLE_DEVICES"] for o in specs] == ["3", "5"]
        assert all(o["resources"] == {"GPU": 1} for o in specs)
    finally:
        cluster.close()


def test_a_search_survives_a_lost_worker_and_a_gpu_fault_and_resumes_measuring_nothing_twice(
        client, space, tmp_path, monkeypatch):
    import gemmgen.tuning.measure
    from gemmgen.tuning.database import load_records
    from gemmgen.tuning.tune import tune

    spec, keys = space
    assert len(keys) >= 6
    lost, faulted, raised = keys[1], keys[2], keys[5]
    log = tmp_path / "measured.log"
    measurer = FakeMeasurer(str(log), kill_worker=[lost], fault=[faulted], raise_in=[raised])
    monkeypatch.setattr(gemmgen.tuning.measure, "default_measurer", lambda: measurer)
    db = tmp_path / "db" / "tune.jsonl"
    db.parent.mkdir()
    shape = Case(256, 256, 256)

    first = tune(spec, shape, db=db, scheduler=client, max_points=4)  # interrupted after 4 points
    assert first.evaluated == 4 and first.gpus == 2
    rest = tune(spec, shape, db=db, scheduler=client)                 # resumed: the others
    assert rest.evaluated == len(keys) - 4

    records = {r["key"]: r for r in rest.records}
    assert set(records) == set(keys)
    assert records[lost]["status"] == "lost" and "was lost while running it" in records[lost]["reason"]
    assert records[faulted]["status"] == "crash" and "exit code 3" in records[faulted]["reason"]
    assert records[raised]["status"] == "crash" and "ILLEGAL_ADDRESS" in records[raised]["reason"]
    survivors = [k for k in keys if k not in (lost, faulted, raised)]
    assert all(records[k]["status"] == "ok" and records[k]["tflops"] == tflops_of(k) for k in survivors)
    assert rest.best["key"] == max(survivors, key=tflops_of)
    assert rest.cublas_tflops == CUBLAS_TFLOPS and rest.scope.startswith("Fake GPU|13.0|256x256x256|")

    measured = [line.split("\t")[0] for line in log.read_text().splitlines()]
    assert sorted(measured) == sorted(keys)                           # each point once, the lost one too
    # The database stays with the client: one line per point and the baseline, nothing beside it.
    assert len(db.read_text().splitlines()) == len(keys) + 1
    assert [p.name for p in db.parent.iterdir()] == ["tune.jsonl"]
    assert load_records(db, rest.scope)["cublas"]["tflops"] == CUBLAS_TFLOPS

    again = tune(spec, shape, db=db, scheduler=client)
    assert again.evaluated == 0 and len(log.read_text().splitlines()) == len(keys)


def test_tune_on_a_cluster_from_the_command_line_needs_no_gpu_here(client, space, tmp_path, monkeypatch):
    from click.testing import CliRunner

    import gemmgen.tuning.measure
    from gemmgen.cli import main

    spec, keys = space
    path = tmp_path / "space.gemm"
    path.write_text(SPACE)
    measurer = FakeMeasurer(str(tmp_path / "measured.log"))
    monkeypatch.setattr(gemmgen.tuning.measure, "default_measurer", lambda: measurer)
    address = client.scheduler.address
    result = CliRunner().invoke(main, ["tune", str(path), "--shapes", "128x128x128", "--scheduler", address,
                                       "--db", str(tmp_path / "tune.jsonl"), "--json", str(tmp_path / "all.json"),
                                       "--save", str(tmp_path / "best.gemm")])
    assert result.exit_code == 0, result.output
    records = json.loads((tmp_path / "all.json").read_text())
    assert sorted(r["key"] for r in records) == sorted(keys) and all(r["status"] == "ok" for r in records)
    best = max(keys, key=tflops_of)
    assert f"Found by gemmgen tune {path} at 128x128x128: {tflops_of(best):.2f} TFLOP/s" in \
        (tmp_path / "best.gemm").read_text()


def _records(db) -> list[str]:
    """A database's records, less the time each was written, in a canonical order."""
    return sorted(json.dumps({k: v for k, v in json.loads(line).items() if k != "time"}, sort_keys=True)
                  for line in db.read_text().splitlines())


def test_a_library_tunes_on_two_workers_of_a_cluster_recording_what_one_gpu_records(client, tmp_path, monkeypatch):
    """The library of specs/fp32.gemm tuned on a faked GPU: on this host's one GPU process, then on
    the two GPU workers of a local Dask cluster. Both measure the same jobs and record the same
    database (in another order), from which the same manifest is built."""
    from gemmgen.library.manifest import build_manifest
    from gemmgen.library.resolve import load_libraries
    from gemmgen.library.tune import tune_library
    from library_fake import FakeGpu

    (library,) = load_libraries(SPECS / "fp32.gemm")
    one = FakeGpu(tmp_path / "one.log").install(monkeypatch)
    alone = tune_library(library, db=tmp_path / "one.jsonl")
    two = FakeGpu(tmp_path / "two.log").install(monkeypatch)
    spread = tune_library(library, db=tmp_path / "two.jsonl", scheduler=client)
    assert (alone.gpus, spread.gpus) == (1, 2) and alone.evaluated == spread.evaluated > 0
    assert len({t.worker for t in one.tasks}) == 1 and len({t.worker for t in two.tasks}) == 2  # both worked
    assert _records(tmp_path / "one.jsonl") == _records(tmp_path / "two.jsonl")
    manifests = [build_manifest(library, tmp_path / f"{n}.jsonl").to_json() for n in ("one", "two")]
    assert manifests[0] == manifests[1]
    again = FakeGpu(tmp_path / "again.log").install(monkeypatch)
    assert tune_library(library, db=tmp_path / "two.jsonl", scheduler=client).evaluated == 0 and not again.tasks


def test_a_library_tunes_on_every_gpu_of_this_host_from_the_command_line(tmp_path, monkeypatch):
    """`gemmgen tune LIB.gemm --devices all`: a local cluster of one worker per GPU (two here,
    faked), each measuring on its own GPU; then the library's .cu, header and manifest."""
    from click.testing import CliRunner

    import gemmgen.cli.common
    import gemmgen.gpu.runtime
    from gemmgen.cli import main
    from library_fake import FakeGpu

    gpu = FakeGpu(tmp_path / "measured.log").install(monkeypatch)
    monkeypatch.setattr(gemmgen.gpu.runtime, "device_count", lambda: 2)
    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["tune", str(SPECS / "fp32.gemm"), "--devices", "all",
                                       "--db", str(tmp_path / "fp32.jsonl"), "-o", f"{out}/"])
    assert result.exit_code == 0, result.output
    assert "on 2 GPU(s)" in result.output
    assert {t.device for t in gpu.tasks} == {"0", "1"}
    assert sorted(p.name for p in out.iterdir()) == ["fp32.cu", "fp32.h", "fp32.json"]
    assert json.loads((out / "fp32.json").read_text())["database"] == str(tmp_path / "fp32.jsonl")


def test_without_dask_the_message_says_what_to_install(monkeypatch):
    import sys

    from gemmgen.tuning.distributed import ClusterError, require_dask
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(ClusterError, match=r"pip install 'gemmgen\[distributed\]'"):
        require_dask()


def test_a_scheduler_that_does_not_answer_is_reported_with_how_to_start_one(monkeypatch):
    import socket

    import gemmgen.tuning.distributed
    from gemmgen.tuning.distributed import ClusterError, connect
    with socket.socket() as probe:  # a port of this machine that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(gemmgen.tuning.distributed, "CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(ClusterError, match=r"no Dask scheduler answers at tcp://127.0.0.1:\d+.*dask scheduler"):
        with connect(f"tcp://127.0.0.1:{port}"):
            pass


def test_a_worker_missing_from_the_scheduler_for_a_moment_keeps_its_candidate(monkeypatch):
    """A worker whose heartbeats come late on a loaded host drops out of the scheduler's list and
    comes back: its running candidate is still due, not lost. One missing for LEFT_GRACE_S has
    left: its candidate is cancelled and recorded as lost."""
    import gemmgen.tuning.distributed as cluster

    class Future:
        cancelled = False

        def done(self):
            return False

        def cancel(self):
            self.cancelled = True

    listed = {"tcp://a": {}, "tcp://b": {}}
    clock = [100.0]
    monkeypatch.setattr(cluster, "gpu_workers", lambda client: dict(listed))
    monkeypatch.setattr(cluster.time, "monotonic", lambda: clock[0])
    runner = cluster.ClusterRunner(client=None)
    held = Future()
    running = {held: ("job", "tcp://b")}
    del listed["tcp://b"]
    assert runner._abandoned(running) == []              # missing: a late heartbeat, perhaps
    clock[0] += cluster.LEFT_GRACE_S / 2
    listed["tcp://b"] = {}
    assert runner._abandoned(running) == [] and not held.cancelled  # back: its candidate still due
    del listed["tcp://b"]
    clock[0] += cluster.LEFT_GRACE_S / 2
    assert runner._abandoned(running) == []              # missing again: the grace starts anew
    clock[0] += cluster.LEFT_GRACE_S
    (gone,) = runner._abandoned(running)
    assert gone[0] is held and held.cancelled and gone[1]["status"] == "lost"
    assert "left while running it" in gone[1]["reason"]
