"""OTLP export against real receivers on 127.0.0.1: what arrives, and what happens when
the collector is slow, down or unreachable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict

import numpy as np
import pytest

import resettrace
from helpers import stand_rows
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.testing.receivers import (
    BlackholeListener,
    GrpcReceiver,
    HttpReceiver,
    ReceivedSpan,
    refused_endpoint,
)
from resettrace.tracing.recorder import Recorder
from resettrace.tracing.session import ATTR_WORKER_RANK, Tracing

RECEIVERS = {"grpc": GrpcReceiver, "http/protobuf": HttpReceiver}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    env.update(extra)
    return env


def _traces(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    out: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for s in spans:
        out[s.trace_id].append(s)
    return out


@pytest.mark.parametrize("protocol", sorted(RECEIVERS))
def test_spans_arrive_with_links_attributes_and_exact_durations(protocol) -> None:
    with RECEIVERS[protocol]() as rx:
        cfg = Config(mode="trace", exporters=("otlp",), otlp_protocol=protocol,
                     otlp_endpoint=rx.endpoint, worker_rank=3,
                     resource_attributes={"resettrace.task.name": "g1_walk_flat"})
        session = Tracing(cfg)
        b = resettrace.make_backend("mujoco", num_envs=16, tracing=session, task="g1_walk_flat")
        rng = np.random.default_rng(0)
        timings = []
        for k in (1, 4, 9):
            q, v = stand_rows(b, k, rng)
            ids = np.sort(rng.choice(16, k, replace=False))
            timings.append((k, b.set_state(ids, q, v)["timing"]))
        session.shutdown()
        b.close()
        report = session.export_report()
        spans = rx.spans()
    assert report["exporters"]["otlp"]["undelivered"] == 0
    assert report["exporters"]["otlp"]["delivered"] == len(spans)
    traces = sorted(_traces(spans).values(), key=lambda t: min(s.start_ns for s in t))
    assert len(traces) == 3
    for (k, timing), trace in zip(timings, traces, strict=True):
        root = next(s for s in trace if s.parent_span_id is None)
        assert root.name == C.SET_STATE.span
        assert root.resource["service.name"] == "resettrace"
        assert root.resource[ATTR_WORKER_RANK] == 3
        assert root.resource["process.pid"] == os.getpid()
        assert root.resource["resettrace.task.name"] == "g1_walk_flat"
        assert root.scope_name == C.INSTRUMENTATION_SCOPE
        assert root.attributes[C.ATTR_EXPORT_DROPPED] == 0
        for s in trace:
            assert s.name in C.BY_SPAN
            assert s.attributes[C.ATTR_RESET_COUNT] == k
            assert s.attributes[C.ATTR_ENV_COUNT] == 16
            assert s.attributes[C.ATTR_BACKEND] == "mujoco"
            if s is not root:
                assert s.parent_span_id == root.span_id
                # exact timestamps: each phase span lasts what the timing dict says (1 us)
                assert abs(s.duration_ns / 1e6 - timing[C.BY_SPAN[s.name].key]) < 1e-3
        measured = sum(v for key, v in timing.items() if key != "set_state_internal_gap_ms")
        gap = root.duration_ns / 1e6 - sum(s.duration_ns for s in trace if s is not root) / 1e6
        assert abs(gap - timing["set_state_internal_gap_ms"]) < 1e-3
        assert measured > 0


def test_env_step_trace_nests_to_the_set_state_phases() -> None:
    with GrpcReceiver() as rx:
        session = Tracing(Config(mode="trace", exporters=("otlp",), otlp_endpoint=rx.endpoint))
        env = resettrace.make_env("g1_walk_flat", num_envs=16, tracing=session)
        q = np.array(env.backend.get_qpos_rows(np.array([5])))
        q[:, 2] = 0.2  # below the termination height: env 5 resets in the next step
        env.backend.set_state([5], q, np.zeros((1, env.backend.nv)))
        env.step(np.zeros((16, env.action_dim)))
        session.shutdown()
        report = session.export_report()
        env.close()
        delivered = report["exporters"]["otlp"]["delivered"]
        assert delivered >= 15  # the direct set_state's trace and the env step's
        spans = rx.wait_for(delivered)
    step_trace = next(t for t in _traces(spans).values()
                      if any(s.name == C.ENV_STEP.span for s in t))
    by_id = {s.span_id: s for s in step_trace}
    chain = [C.SET_STATE_QPOS_CONVERT.span, C.SET_STATE.span, C.DR_RESET.span,
             C.RESET_DONE_RESET_CALL.span, C.RESET_DONE.span, C.ENV_STEP.span]
    span = next(s for s in step_trace if s.name == chain[0])
    for name in chain[1:]:
        span = by_id[span.parent_span_id]
        assert span.name == name
    assert span.parent_span_id is None
    assert by_id[next(s.span_id for s in step_trace if s.name == C.RESET_DONE.span)] \
        .attributes[C.ATTR_RESET_COUNT] == 1


def _burst(rec: Recorder, n: int) -> None:
    for _ in range(n):
        with rec.scope(C.RESET_DONE, 2):
            for phase in (C.RESET_DONE_TERMINAL_OBS, C.RESET_DONE_OBS_SCATTER):
                with rec.scope(phase):
                    pass


def test_burst_beyond_the_queue_drops_and_counts() -> None:
    """A collector slower than the training loop: traces are dropped, counted, reported
    on the spans that still arrive, and every span is accounted for."""
    with GrpcReceiver(delay_s=0.2) as rx:
        session = Tracing(Config(mode="trace", exporters=("otlp",), otlp_endpoint=rx.endpoint,
                                 queue_size=16))
        rec = session.recorder(backend="mujoco")
        assert isinstance(rec, Recorder)
        _burst(rec, 20_000)  # far more than the pipe and the queue hold
        assert session.dropped_spans > 0
        assert session.force_flush(timeout_s=60)  # the collector catches up
        _burst(rec, 10)  # sent after the drops: they say how many were dropped before them
        assert session.force_flush(timeout_s=60)
        produced = 3 * 20_010
        assert session.stats()[C.RESET_DONE.key].count == 20_010  # timing saw every trace
        session.shutdown()
        report = session.export_report()
        received = rx.spans()
    otlp = report["exporters"]["otlp"]
    assert report["spans_sent"] + report["spans_dropped"] == produced
    assert otlp["delivered"] + otlp["undelivered"] == produced
    assert otlp["undelivered"] == report["spans_dropped"] > 0
    assert len(received) == otlp["delivered"] == report["spans_sent"]
    dropped_seen = [s.attributes[C.ATTR_EXPORT_DROPPED] for s in received
                    if s.parent_span_id is None]
    # traces sent after drops began carry the count of spans dropped before them
    assert 0 < max(dropped_seen) <= report["spans_dropped"]
    assert dropped_seen[0] == 0


def test_sampling_every_k_and_slowest_window() -> None:
    with GrpcReceiver() as rx:
        session = Tracing(Config(mode="trace", exporters=("otlp",), otlp_endpoint=rx.endpoint,
                                 sample_every=4))
        rec = session.recorder()
        _burst(rec, 20)
        session.shutdown()
        assert len(_traces(rx.wait_for(15))) == 5
        assert session.export_report()["spans_sampled_out"] == 45
        assert session.stats()[C.RESET_DONE.key].count == 20
    with GrpcReceiver() as rx:
        session = Tracing(Config(mode="trace", exporters=("otlp",), otlp_endpoint=rx.endpoint,
                                 sample_slowest_window=10))
        rec = session.recorder()
        for i in range(25):
            with rec.scope(C.RESET_DONE, 1):
                time.sleep(0.004 if i in (3, 17, 21) else 0.0)
        session.shutdown()
        spans = rx.wait_for(3)
        assert len(spans) == 3  # windows [0, 10), [10, 20) and the partial [20, 25)
        assert all(s.duration_ns >= 4e6 for s in spans)


EXIT_SCRIPT = """
import sys, time
import resettrace.bench.collector as collector
run = collector.run_collector

def timed_run(*args, **kwargs):  # marks the end of the run, before the exporters' shutdown
    result = run(*args, **kwargs)
    print("END", time.monotonic(), file=sys.stderr, flush=True)
    return result

collector.run_collector = timed_run
sys.argv = ["resettrace", "bench", "collector", "--num-envs", "16", "--warmup", "0",
            "--steps", "40", "--nthread", "1", "--out", sys.argv[1]]
from resettrace.cli import main
sys.exit(main())
"""


def _run_collector_against(endpoint: str, tmp_path, protocol: str = "grpc",
                           netns: bool = False) -> tuple[dict, float, str]:
    out = tmp_path / "run"
    cmd = [sys.executable, "-c", EXIT_SCRIPT, str(out)]
    if netns:  # a network namespace of our own: name resolution fails without traffic
        cmd = ["unshare", "--net", "--"] + cmd
    # one export call may take a minute: an exit that waited on one would take that long
    env = _clean_env(RESETTRACE="trace", RESETTRACE_EXPORTER="otlp",
                     OTEL_EXPORTER_OTLP_PROTOCOL=protocol, OTEL_EXPORTER_OTLP_TIMEOUT="60",
                     RESETTRACE_SHUTDOWN_TIMEOUT="2",
                     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    stdout, stderr = proc.communicate(timeout=120)
    exited = time.monotonic()
    assert proc.returncode == 0, stderr
    end = float(next(line.split()[1] for line in stderr.splitlines() if line.startswith("END")))
    data = json.loads((out / "timing.json").read_text())
    return data, exited - end, stdout


def _run_end(stdout: str) -> None:
    assert "not delivered" in stdout and "env/s" in stdout


@pytest.mark.parametrize("case", ["refused", "blackhole", "unresolvable"])
def test_endpoint_down_run_completes_and_exits_promptly(case, tmp_path) -> None:
    """The run finishes, the process is gone soon after, and the summary and JSON say
    how many spans did not arrive."""
    if case == "refused":
        data, exit_s, stdout = _run_collector_against(refused_endpoint(), tmp_path)
    elif case == "blackhole":
        with BlackholeListener() as hole:
            data, exit_s, stdout = _run_collector_against(hole.endpoint, tmp_path)
    else:
        data, exit_s, stdout = _run_collector_against("http://collector.invalid:4317",
                                                      tmp_path, netns=True)
    _run_end(stdout)
    otlp = data["export"]["exporters"]["otlp"]
    assert otlp["delivered"] == 0
    assert otlp["undelivered"] == data["export"]["spans_sent"] + data["export"]["spans_dropped"]
    assert otlp["undelivered"] > 0
    assert data["stats"][C.ENV_STEP.key]["count"] == 40  # training went on
    # bounded by the 2 s shutdown timeout, not by the 60 s export call; the interpreter's
    # teardown comes after it, and a loaded machine stretches both
    assert exit_s < 15.0, f"process took {exit_s:.2f} s to exit after the run"


WORKER_SCRIPT = """
import multiprocessing as mp, sys
import numpy as np

def work(rank, endpoint):
    import resettrace
    resettrace.configure(mode="trace", exporters=("otlp",), otlp_endpoint=endpoint,
                         worker_rank=rank)
    b = resettrace.make_backend("mujoco", num_envs=8, nthread=1)
    q = np.tile(b.keyframe_qpos, (2, 1))
    for _ in range(5):
        b.set_state([rank, 7 - rank], q, np.zeros((2, b.nv)))

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    ps = [ctx.Process(target=work, args=(r, sys.argv[2])) for r in (0, 1)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
    sys.exit(max(p.exitcode for p in ps))
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_processes_tag_their_rank_and_lose_nothing(start_method, tmp_path) -> None:
    script = tmp_path / "workers.py"
    script.write_text(textwrap.dedent(WORKER_SCRIPT))
    with GrpcReceiver() as rx:
        r = subprocess.run([sys.executable, str(script), start_method, rx.endpoint],
                           env=_clean_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        spans = rx.spans()
    by_rank: dict[int, list[ReceivedSpan]] = defaultdict(list)
    for s in spans:
        by_rank[s.resource[ATTR_WORKER_RANK]].append(s)
    assert sorted(by_rank) == [0, 1]
    for rank, got in by_rank.items():
        roots = [s for s in got if s.parent_span_id is None]
        assert len(roots) == 5, (rank, len(roots))  # every set_state of the worker arrived
        assert len({s.resource["process.pid"] for s in got}) == 1
        sizes = {len(t) for t in _traces(got).values()}
        # whole traces: set_state and each phase that runs in it (lazy MuJoCo:
        # qpos_convert, whose pass checks the ids and writes the rows)
        assert sizes == {2}, sizes
    assert by_rank[0][0].resource["process.pid"] != by_rank[1][0].resource["process.pid"]


SIGTERM_SCRIPT = """
import sys
import numpy as np
import resettrace
resettrace.configure(mode="trace", exporters=("otlp",), otlp_endpoint=sys.argv[1])
b = resettrace.make_backend("mujoco", num_envs=8, nthread=1)
q = np.tile(b.keyframe_qpos, (1, 1))
i = 0
while True:
    b.set_state([i % 8], q, np.zeros((1, b.nv)))
    i += 1
    print(i, flush=True)
"""


def test_sigterm_flushes_before_exit() -> None:
    with GrpcReceiver() as rx:
        proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, rx.endpoint],
                                env=_clean_env(), stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        while int(proc.stdout.readline()) < 50:
            pass
        proc.send_signal(signal.SIGTERM)
        printed = proc.stdout.read().split()
        proc.wait(timeout=30)
        done = int(printed[-1]) if printed else 50
        assert proc.returncode == 128 + signal.SIGTERM  # SystemExit(143), after the flush
        roots = [s for s in rx.spans() if s.parent_span_id is None]
    # every call that completed arrived, and the one the signal interrupted, if any
    assert done <= len(roots) <= done + 1


# SIGTERM at a chosen line of the code that hands a trace on: a tracer, armed after 40
# calls, signals this process at the n-th line the target runs
SIGTERM_INSIDE_SCRIPT = """
import os, signal, sys
import numpy as np
import resettrace
from resettrace.tracing.export.parent import ProcessExporter
from resettrace.tracing.recorder import Recorder
resettrace.configure(mode="trace", exporters=("otlp",), otlp_endpoint=sys.argv[1])
b = resettrace.make_backend("mujoco", num_envs=8, nthread=1)
cls, name = sys.argv[2].split(".")
target = getattr({"ProcessExporter": ProcessExporter, "Recorder": Recorder}[cls], name).__code__
nth = int(sys.argv[3])
lines = [0]

def line(frame, event, arg):
    if event == "line":
        lines[0] += 1
        if lines[0] == nth:
            sys.settrace(None)
            frame.f_trace = None
            os.kill(os.getpid(), signal.SIGTERM)
    return line

def call(frame, event, arg):
    return line if frame.f_code is target and lines[0] < nth else None

q = np.tile(b.keyframe_qpos, (1, 1))
i = 0
while True:
    if i == 40:
        sys.settrace(call)
    b.set_state([i % 8], q, np.zeros((1, b.nv)))
    i += 1
    print(i, flush=True)
"""


@pytest.mark.parametrize("target,nth", [
    ("ProcessExporter._pack_held", 6),  # between a trace's bytes and its frame entry
    ("ProcessExporter._pump", 5),  # written to the pipe, not yet taken off the buffer
    ("ProcessExporter.on_trace", 5),  # held, not yet counted
])
def test_sigterm_inside_the_trace_hand_over_loses_and_repeats_nothing(target, nth) -> None:
    """A SIGTERM that lands while a trace is handed on waits until it is: the export's
    counts stay whole, every trace arrives once (none dropped, none sent twice)."""
    with GrpcReceiver() as rx:
        proc = subprocess.run([sys.executable, "-c", SIGTERM_INSIDE_SCRIPT, rx.endpoint,
                               target, str(nth)], env=_clean_env(), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
        done = int(proc.stdout.split()[-1])
        spans = rx.spans()
    assert done >= 40  # the signal came from inside the target, once the tracer was armed
    assert "not delivered" not in proc.stderr, proc.stderr
    assert len({s.span_id for s in spans}) == len(spans)  # none sent twice
    roots = [s for s in spans if s.parent_span_id is None]
    assert done <= len(roots) <= done + 1


#: 20 traces of one span each, in a process of its own (its stderr is all it printed)
TWENTY_SPANS = """
import resettrace
from resettrace import catalog as C

rec = resettrace.recorder(backend="b", task="t")
for _ in range(20):
    with rec.scope(C.RESET_DONE, 2):
        pass
"""


def _twenty_spans(endpoint: str, protocol: str, **env: str) -> subprocess.CompletedProcess:
    from helpers import clean_env

    return subprocess.run(
        [sys.executable, "-c", TWENTY_SPANS], capture_output=True, text=True, timeout=120,
        env=clean_env(RESETTRACE="trace", RESETTRACE_EXPORTER="otlp",
                      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint,
                      OTEL_EXPORTER_OTLP_PROTOCOL=protocol, **env))


SECRET = "s3cr3t-t0ken-4711"


@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_HEADERS",
                                  "OTEL_EXPORTER_OTLP_TRACES_HEADERS"])
@pytest.mark.parametrize("protocol", sorted(RECEIVERS))
def test_a_malformed_headers_variable_never_prints_its_secret(name, protocol) -> None:
    """A header value the OpenTelemetry SDK cannot parse is said in one line that names
    the variable, not its value; the SDK never sees it (it would print it) and the spans
    still go out. OTLP metrics (made in the training process) read the same variable."""
    malformed = f"authorization=Bearer {SECRET};v=1,x-tenant=a"  # ';': not a header
    with RECEIVERS[protocol]() as rx:
        r = _twenty_spans(rx.endpoint, protocol, RESETTRACE_METRICS="otlp",
                          **{name: malformed})
        assert len(rx.wait_for(20, timeout=30)) >= 20, r.stderr
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert SECRET not in out and "Bearer" not in out, out
    said = [line for line in r.stderr.splitlines() if name in line]
    assert len(said) == 1 and "malformed" in said[0], r.stderr
    assert all(headers == {} or "authorization" not in headers for headers in rx.headers)


@pytest.mark.parametrize(("protocol", "name", "raw"), [
    ("grpc", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "abc"),
    ("grpc", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", ""),
    ("grpc", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "\udcff\udcfe"),  # bytes not UTF-8
    ("grpc", "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES", "NOT_A_CODE"),
    ("http/protobuf", "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER", "nope"),
], ids=["timeout-abc", "timeout-empty", "timeout-not-utf8", "retryable-codes",
        "http-credential-provider"])
def test_an_sdk_variable_resettrace_refuses_never_stops_the_exporter(protocol, name,
                                                                     raw) -> None:
    """Every OTEL_* variable the SDK reads itself is checked first: a bad one is said
    once and left out of what the SDK sees, so the exporter is made and the spans go."""
    with RECEIVERS[protocol]() as rx:
        r = _twenty_spans(rx.endpoint, protocol, **{name: raw})
        assert len(rx.wait_for(20, timeout=30)) == 20, r.stderr
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if name in line]
    assert len(said) == (1 if raw else 0), r.stderr
    assert "Traceback" not in r.stderr, r.stderr
