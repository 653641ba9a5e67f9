"""``RESETTRACE_METRICS``: OTLP metrics to a real gRPC receiver, and a real Prometheus server
(Debian's ``prometheus``; ``make test`` installs it) scraping the endpoint of a traced run."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import resettrace
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.testing.receivers import GrpcMetricsReceiver
from resettrace.tracing.metrics import PROMETHEUS_SCALE
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


def _prometheus(tmp_path: Path, target_port: int) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("prometheus")
    # not a skip: the default install (make test) has it; without it, say so
    assert binary, "the metrics test needs Debian's prometheus: `make test` installs it " \
                   "(apt-get install -y prometheus, as root)"
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "resettrace",
                            "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}]}))
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
