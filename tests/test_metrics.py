"""``RESETTRACE_METRICS``: OTLP metrics to a real gRPC receiver, and a real Prometheus server
(Debian's ``prometheus``; ``make test`` installs it) scraping the endpoint of a traced run,
and the endpoints of every process of a job through ``RESETTRACE_PROMETHEUS_SD``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import resettrace
from helpers import clean_env
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.testing.receivers import GrpcMetricsReceiver
from resettrace.tracing.metrics import PROMETHEUS_SCALE, sd_file_name
from resettrace.tracing.session import Tracing

RESOURCE = {C.ATTR_BACKEND: "mujoco", C.ATTR_TASK: "g1_walk_flat"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(session: Tracing, steps: int = 150) -> None:
    env = resettrace.make_env("g1_walk_flat", backend="mujoco", num_envs=16, seed=0,
                              tracing=session, nthread=1)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        env.step(rng.normal(0.0, 2.0, (16, env.action_dim)))
    env.close()


def _attrs(point: Any) -> dict[str, Any]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in point.attributes}


def test_otlp_metrics_carry_every_call_and_failures_are_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with GrpcMetricsReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", rx.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_INSECURE", "true")
        session = Tracing(Config(mode="timing", metrics=("otlp",), metrics_interval_s=0.2,
                                 resource_attributes=RESOURCE))
        _run(session)
        deadline = time.monotonic() + 10.0  # a periodic push, however fast the run was
        while session.export_report()["metrics"]["otlp_exports"] < 1 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        session.shutdown()  # one last push
        request = rx.last()
    assert request is not None
    stats = session.stats()
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    assert set(metrics) == {C.METRIC_PHASE_DURATION, C.METRIC_RESETS, C.METRIC_ENV_STEPS}
    hist = metrics[C.METRIC_PHASE_DURATION]
    assert hist.unit == "ms"
    points = {_attrs(p)[C.ATTR_PHASE]: p for p in hist.exponential_histogram.data_points}
    point = points["set_state"]
    attrs = _attrs(point)
    assert attrs[C.ATTR_BACKEND] == "mujoco" and attrs[C.ATTR_TASK] == "g1_walk_flat"
    assert attrs[C.ATTR_WORKER_RANK] == 0
    want = stats[C.SET_STATE.key]
    assert point.count == want.count > 0 and point.sum == pytest.approx(want.total_ms)
    assert point.max == pytest.approx(want.max_ms)
    assert sum(point.positive.bucket_counts) + point.zero_count == point.count
    assert points["env_step"].count == stats[C.ENV_STEP.key].count == 150
    steps = metrics[C.METRIC_ENV_STEPS].sum.data_points[0].as_int
    resets = metrics[C.METRIC_RESETS].sum.data_points[0].as_int
    assert steps == 150 and resets == round(stats[C.RESET_DONE_COUNT].total_ms) > 0
    report = session.export_report()["metrics"]
    assert report["otlp_exports"] >= 2 and report["otlp_failed"] == 0

    # nobody listening: every push fails, is counted, and nothing blocks or raises; the
    # last push at shutdown costs no more than the shutdown's timeout (the SDK alone would
    # retry for its own 10 s)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"http://127.0.0.1:{_free_port()}")
    # each push may take 60 s: a shutdown that waited on a push (or on the SDK's retries)
    # would take that long; a bounded one takes its own timeout and some scheduling, even
    # on a loaded machine
    down = Tracing(Config(mode="timing", metrics=("otlp",), metrics_interval_s=0.2,
                          metrics_timeout_s=60.0))
    _run(down, steps=20)
    t0 = time.monotonic()
    down.shutdown(timeout_s=1.0)
    assert time.monotonic() - t0 < 20.0
    lost = down.export_report()["metrics"]
    assert lost["otlp_exports"] >= 1 and lost["otlp_failed"] == lost["otlp_exports"]


def _prometheus(tmp_path: Path, target_port: int | None = None, *, sd: Path | None = None
                ) -> tuple[subprocess.Popen[bytes], int]:
    """A Prometheus on 127.0.0.1 scraping every second: one static target, or every file
    of the file_sd folder ``sd``."""
    binary = shutil.which("prometheus")
    # not a skip: the default install (make test) has it; without it, say so
    assert binary, "the metrics test needs Debian's prometheus: `make test` installs it " \
                   "(apt-get install -y prometheus, as root)"
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    targets: dict[str, Any] = {"static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]} \
        if sd is None else {"file_sd_configs": [{"files": [f"{sd}/*.json"],
                                                  "refresh_interval": "1s"}]}
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "resettrace", **targets}]}))
    proc = subprocess.Popen([binary, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def _query(port: int, promql: str) -> list[Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        data = json.loads(r.read())
    assert data["status"] == "success", data
    return list(data["data"]["result"])


def test_prometheus_scrapes_the_run_and_its_p90_matches_resettrace(tmp_path: Path) -> None:
    target = _free_port()
    session = Tracing(Config(mode="trace", exporters=(f"file:{tmp_path / 'spans.jsonl'}",),
                             metrics=(f"prometheus:{target}",), resource_attributes=RESOURCE))
    server, port = _prometheus(tmp_path, target)
    try:
        _run(session)
        ours = session.stats()[C.SET_STATE.key]
        promql = ("histogram_quantile(0.9, resettrace_phase_duration_milliseconds_bucket"
                  '{resettrace_phase="set_state"})')
        deadline = time.monotonic() + 90
        result: list[Any] = []
        while time.monotonic() < deadline:
            try:
                result = _query(port, promql)
                count = _query(port, 'resettrace_phase_duration_milliseconds_count'
                                     '{resettrace_phase="set_state"}')
                if result and count and int(float(count[0]["value"][1])) == ours.count:
                    break  # a scrape after the run
            except OSError:
                pass  # still starting
            time.sleep(0.5)
        assert result, "Prometheus never scraped the run"
        p90 = float(result[0]["value"][1])
        labels = result[0]["metric"]
        assert labels["resettrace_backend_name"] == "mujoco"
        assert labels["resettrace_worker_rank"] == "0"
        bucket_error = 2.0 ** (2.0 ** -PROMETHEUS_SCALE) - 1.0
        assert abs(p90 / ours.p90_ms - 1.0) <= bucket_error + 0.01, (p90, ours.p90_ms)
        steps = _query(port, "resettrace_env_steps_total")
        assert int(float(steps[0]["value"][1])) == 150
    finally:
        server.terminate()
        server.wait(10)
        session.shutdown()


def test_a_forked_worker_of_a_metrics_session_exits_without_waiting(tmp_path: Path) -> None:
    """The child holds a copy of the scrape server and push thread that do not run there:
    its shutdown must not wait on them (it used to block forever in socketserver)."""
    import os

    session = Tracing(Config(mode="timing", metrics=(f"prometheus:{_free_port()}", "otlp"),
                             metrics_interval_s=60))
    pid = os.fork()
    if pid == 0:  # the child: shut the inherited session down and leave
        try:
            session.shutdown(timeout_s=1.0)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in shutdown")
    assert os.waitstatus_to_exitcode(status) == 0
    assert session.metrics.prometheus_port is not None  # the parent still serves
    session.shutdown(timeout_s=1.0)


def test_metric_labels_name_the_backend_and_task_of_user_code(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``make_env(...)`` in a user's own code sets no resource attributes (only the CLI
    does): the labels were ``""`` while the spans carried "mujoco" and "g1_walk_flat"."""
    with GrpcMetricsReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", rx.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_INSECURE", "true")
        session = Tracing(Config(mode="timing", metrics=("otlp",), metrics_interval_s=60.0))
        _run(session, steps=20)
        session.shutdown()  # one last push
        request = rx.last()
    assert request is not None
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    for point in metrics[C.METRIC_PHASE_DURATION].exponential_histogram.data_points:
        attrs = _attrs(point)
        assert attrs[C.ATTR_BACKEND] == "mujoco" and attrs[C.ATTR_TASK] == "g1_walk_flat"


def test_a_phase_of_the_sessions_own_catalog_is_named_by_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The phase label came from the process's catalog, not the session's: a phase
    registered in a session's own catalog went out under its key, not its span name."""
    catalog = C.CATALOG.copy()
    mine = catalog.register("dr_reset.my_own_stage", parent="dr_reset")
    with GrpcMetricsReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", rx.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_INSECURE", "true")
        session = Tracing(Config(mode="timing", metrics=("otlp",), metrics_interval_s=60.0),
                          catalog=catalog)
        rec = session.recorder(backend="mine", task="own")
        with rec.scope("dr_reset", 3), rec.scope(mine):
            pass
        session.shutdown()
        request = rx.last()
    assert request is not None
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    phases = {_attrs(p)[C.ATTR_PHASE]
              for p in metrics[C.METRIC_PHASE_DURATION].exponential_histogram.data_points}
    assert "dr_reset.my_own_stage" in phases and mine.key not in phases


# -- every process of a job serves its own endpoint ------------------------------------------

#: a job: a parent that records resets and serves first, then a plain os.fork child, two
#: fork workers, a spawn and a forkserver worker, each recording a known number of resets
#: and waiting (serving) until the parent is told on stdin that Prometheus has them
_JOB = """
import json, multiprocessing as mp, os, sys
import resettrace
from resettrace import catalog as C

def record(n):
    rec = resettrace.recorder(backend="fake", task="job", env_count=8)
    for i in range(n):
        with rec.scope(C.RESET_DONE, 1 + i % 3):
            pass
    session = resettrace.get_tracing()
    metrics = session.export_report()["metrics"]
    return {"pid": os.getpid(), "rank": session.worker_rank,
            "resets": round(session.stats()[C.RESET_DONE_COUNT].total_ms),
            "port": metrics["prometheus_port"], "sd": metrics["prometheus_sd_file"]}

def worker(n, out, release):
    out.put(record(n))
    release.wait(300)

if __name__ == "__main__":
    done = [record(7)]  # the parent serves first: on the configured port
    r, w = os.pipe()
    release_r, release_w = os.pipe()
    child = os.fork()
    if child == 0:  # a plain fork: no multiprocessing
        os.write(w, json.dumps(record(11)).encode() + b"\\n")
        os.read(release_r, 1)
        sys.exit(0)  # a normal exit: the exit hooks run
    workers = []
    for n, method in enumerate(["fork", "fork", "spawn", "forkserver"]):
        ctx = mp.get_context(method)
        out, release = ctx.Queue(), ctx.Event()
        proc = ctx.Process(target=worker, args=(20 + 3 * n, out, release))
        proc.start()
        workers.append((proc, out, release))
    done.append(json.loads(os.fdopen(r).readline()))
    done += [out.get(timeout=300) for _, out, _ in workers]
    print(json.dumps(done), flush=True)
    sys.stdin.readline()  # Prometheus has every value
    os.write(release_w, b"x")
    for proc, _, release in workers:
        release.set()
        proc.join(60)
    os.waitpid(child, 0)
    print(json.dumps([proc.exitcode for proc, _, _ in workers]), flush=True)
"""


def _wait_for(what: str, check: Any, timeout_s: float = 180.0) -> Any:
    """Poll ``check()`` until it returns something true (a condition, never a time bound:
    the limit only stops a test that would never finish)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError:  # Prometheus still starting
            last = None
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def test_every_process_of_a_job_serves_its_own_endpoint_and_prometheus_sums_them(
        tmp_path: Path) -> None:
    """Measured: with 4 workers on one port, one process bound it and three logged
    "Address already in use"; the endpoint served 118 of 466 resets. Now each process
    serves its own endpoint, lists it in the file_sd folder, and Prometheus's sum over
    the endpoints is every reset recorded."""
    sd = tmp_path / "sd"
    port = _free_port()
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    src = Path(resettrace.__file__).resolve().parents[1]  # the tree under test
    env = clean_env(PYTHONPATH=str(src), RESETTRACE="timing",
                    RESETTRACE_METRICS=f"prometheus:{port}", RESETTRACE_PROMETHEUS_SD=str(sd))
    server, prom = _prometheus(tmp_path, sd=sd)
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        job = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path,
                               stdin=subprocess.PIPE, stdout=o, stderr=e)
    try:
        def recorded_all() -> str:
            if job.poll() is not None:
                pytest.fail(f"the job ended early: {err.read_text()}")
            line, newline, _ = out.read_text().partition("\n")
            return line if newline else ""

        processes = json.loads(_wait_for("the job's processes to record", recorded_all))
        recorded = {str(p["pid"]): p["resets"] for p in processes}
        total = sum(recorded.values())
        resets = [sum(1 + i % 3 for i in range(n)) for n in (7, 11, 20, 23, 26, 29)]
        assert [p["resets"] for p in processes] == resets  # each its own, no more
        assert processes[0]["port"] == port  # the first process has the configured port
        assert len({p["port"] for p in processes}) == 6  # every other: its own
        assert sorted(p.name for p in sd.iterdir()) == sorted(
            sd_file_name(socket.gethostname(), int(pid)) for pid in recorded)

        def final() -> list[Any] | None:
            up = _query(prom, 'up{job="resettrace"} == 1')
            series = _query(prom, "resettrace_resets_total")
            got = sum(int(float(s["value"][1])) for s in series)
            return series if len(up) == 6 and len(series) == 6 and got == total else None

        series = _wait_for("Prometheus to scrape every process's final count", final)
        by_pid = {s["metric"]["process_pid"]: s for s in series}
        assert {pid: int(float(s["value"][1])) for pid, s in by_pid.items()} == recorded
        for p in processes:  # the target labels of its file_sd file, and its own labels
            labels = by_pid[str(p["pid"])]["metric"]
            assert labels["pid"] == str(p["pid"]) and labels["host"] == socket.gethostname()
            assert labels["rank"] == labels["resettrace_worker_rank"] == str(p["rank"])
            assert labels["instance"] == f"127.0.0.1:{p['port']}"
        # the parent's rank, its plain-fork child's (the same: no multiprocessing worker),
        # then the workers' by the rank rule (parent rank x 1000 + worker number)
        assert [p["rank"] for p in processes] == [0, 0, 1, 2, 3, 4]
        assert sum(float(s["value"][1]) for s in _query(
            prom, 'sum(resettrace_resets_total)')) == total
        job.stdin.write(b"\n")  # type: ignore[union-attr]
        job.stdin.flush()  # type: ignore[union-attr]
        assert job.wait(120) == 0, err.read_text()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
        server.terminate()
        server.wait(10)
    said = err.read_text()
    assert "Address already in use" not in said, said
    assert json.loads(out.read_text().splitlines()[1]) == [0, 0, 0, 0]
    # each process that did not get the port said so in one line, naming where it serves
    for p in processes[1:]:
        lines = [x for x in said.splitlines() if f"(pid {p['pid']}," in x]
        assert len(lines) == 1 and f"127.0.0.1:{port} is taken" in lines[0], said
        assert f"127.0.0.1:{p['port']} instead" in lines[0] and p["sd"] in lines[0]
    assert str(port) not in "".join(x for x in said.splitlines()
                                    if f"(pid {processes[0]['pid']}," in x)
    assert list(sd.iterdir()) == []  # each process removed its own file when it stopped


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


@pytest.mark.parametrize("listed", [True, False], ids=["sd", "no-sd"])
def test_a_port_held_by_another_program_is_said_in_one_line_and_served_elsewhere(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, listed: bool) -> None:
    sd = tmp_path / "sd" if listed else None
    with socket.socket() as other:  # a listener that is not resettrace's
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = int(other.getsockname()[1])
        with caplog.at_level(logging.INFO, logger="resettrace"):
            session = Tracing(Config(mode="timing", metrics=(f"prometheus:{port}",),
                                     prometheus_sd=None if sd is None else str(sd)))
        try:
            said = [r for r in caplog.records if f":{port}" in r.getMessage()]
            assert len(said) == 1 and said[0].levelno == logging.WARNING, caplog.text
            served = session.export_report()["metrics"]["prometheus_port"]
            assert served not in (None, port)
            line = said[0].getMessage()
            assert f"127.0.0.1:{port} is taken" in line
            assert f"serves its metrics on 127.0.0.1:{served} instead" in line
            rec = session.recorder(backend="fake", env_count=4)
            for _ in range(5):
                with rec.scope(C.RESET_DONE, 2):
                    pass
            session.aggregator.force_flush()  # type: ignore[union-attr]
            text = _scrape(served)
            assert f'process_pid="{os.getpid()}"' in text
            assert [x for x in text.splitlines() if x.startswith("resettrace_resets_total{")
                    and x.endswith(" 10.0")], text
            if sd is None:
                assert "RESETTRACE_PROMETHEUS_SD=DIR" in line
            else:
                path = sd / sd_file_name(socket.gethostname(), os.getpid())
                assert str(path) in line
                [group] = json.loads(path.read_text())
                assert group["targets"] == [f"127.0.0.1:{served}"]
                assert group["labels"]["pid"] == str(os.getpid())
                assert group["labels"]["rank"] == "0"
        finally:
            session.shutdown()
    if sd is not None:
        assert list(sd.iterdir()) == []


def test_port_zero_serves_every_process_on_a_port_the_os_chooses(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert Config.from_env({"RESETTRACE_METRICS": "prometheus:0"}).metrics == ("prometheus:0",)
    with caplog.at_level(logging.INFO, logger="resettrace"):
        listed = Tracing(Config(mode="timing", metrics=("prometheus:0",),
                                prometheus_sd=str(tmp_path)))
        unlisted = Tracing(Config(mode="timing", metrics=("prometheus:127.0.0.1:0",)))
    try:
        ports = [s.export_report()["metrics"]["prometheus_port"] for s in (listed, unlisted)]
        assert 0 not in ports and None not in ports and ports[0] != ports[1]
        for port, level in ((ports[0], logging.INFO), (ports[1], logging.WARNING)):
            said = [r for r in caplog.records if f"127.0.0.1:{port}" in r.getMessage()]
            assert [r.levelno for r in said] == [level], caplog.text
            assert "resettrace_resets_total" in _scrape(port)
    finally:
        listed.shutdown()
        unlisted.shutdown()


def test_the_sd_folder_keeps_other_files_and_loses_those_of_dead_processes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """On start a process removes the file_sd files of this host's dead processes that
    resettrace wrote, and nothing else; its own file is never written through a link."""
    host = socket.gethostname()
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / sd_file_name(host, gone.pid)
    ours = json.dumps([{"targets": ["127.0.0.1:1"],  # what a killed process left
                        "labels": {"pid": str(gone.pid), "__meta_resettrace_pid": str(gone.pid)}}])
    dead.write_text(ours)
    foreign = tmp_path / sd_file_name(host, gone.pid).replace(".json", ".1.json")
    foreign.write_text('[{"targets": ["127.0.0.1:2"], "labels": {}}]\n')  # the user's
    alive = tmp_path / sd_file_name(host, os.getppid())  # a live process's: kept
    alive.write_text(ours)
    outside = tmp_path / "outside.txt"
    outside.write_text("not resettrace's")
    mine = tmp_path / sd_file_name(host, os.getpid())
    mine.symlink_to(outside)
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        session = Tracing(Config(mode="timing", metrics=("prometheus:0",),
                                 prometheus_sd=str(tmp_path)))
    try:
        assert not dead.exists()
        assert foreign.read_text().startswith('[{"targets": ["127.0.0.1:2"]')
        assert alive.read_text() == ours
        assert outside.read_text() == "not resettrace's" and mine.is_symlink()
        port = session.export_report()["metrics"]["prometheus_port"]
        said = [r.getMessage() for r in caplog.records if "symbolic link" in r.getMessage()]
        assert len(said) == 1 and f"127.0.0.1:{port}" in said[0], caplog.text
        assert session.export_report()["metrics"]["prometheus_sd_file"] is None
    finally:
        session.shutdown()
    assert mine.is_symlink() and outside.read_text() == "not resettrace's"
