"""Span export loss modes (each failed before its fix): counted exactly, written nowhere else."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from helpers import compiled_only, record_traces
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.tracing.session import Tracing


def test_report_after_a_timed_out_shutdown_writes_to_no_reused_fd(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    session = Tracing(Config(mode="trace", exporters=(f"file:{tmp_path / 'spans.jsonl'}",),
                             queue_size=100_000))
    record_traces(session, 1)
    proc = session.process
    assert proc is not None and proc._proc is not None
    os.kill(proc._proc.pid, signal.SIGSTOP)  # a child that reads nothing more
    try:
        record_traces(session, 20_000)  # more than the pipe holds: frames wait in this process
        assert proc.pending_spans > 0
        old_fd = proc._in
        session.shutdown(timeout_s=0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed by the shutdown when late
            os.kill(proc._proc.pid, signal.SIGCONT)
    victim = tmp_path / "unrelated.bin"
    fds = []
    while not fds or fds[-1] < old_fd:  # take the lowest free fds up to the pipe's number
        fds.append(os.open(victim, os.O_WRONLY | os.O_CREAT))
    try:
        assert fds[-1] == old_fd  # the closed pipe's number, now another file's
        with caplog.at_level(logging.ERROR, logger="resettrace"):
            first = session.export_report()
            second = session.export_report()
    finally:
        for fd in fds:
            os.close(fd)
    assert victim.stat().st_size == 0
    assert "died" not in caplog.text
    produced = 3 * 20_001
    assert first["spans_sent"] + first["spans_dropped"] == produced
    assert second["spans_dropped"] == first["spans_dropped"] > 0  # never counted twice
    assert first["spans_pending"] == 0


def test_a_shut_down_session_keeps_no_traces_and_the_exporter_no_recorders(
        tmp_path: Path) -> None:
    import gc

    session = Tracing(Config(mode="trace", exporters=(f"file:{tmp_path / 'spans.jsonl'}",)))
    for _ in range(300):  # recorders come and go (one per env, per test, ...)
        record_traces(session, 1)
    gc.collect()
    proc = session.process
    assert proc is not None and len(proc._rids) <= 1 and len(proc._sent_attrs) <= 1
    survivor = session.recorder()
    session.shutdown()
    processor = session.aggregator
    assert processor is not None
    seen = processor.traces_seen
    for _ in range(2000):  # an env that outlives its session
        with survivor.scope(C.DR_RESET):
            pass
    assert processor.pending() == 0 and processor.traces_seen == seen
    assert processor.stats()["dr_reset_total_ms"].count == 300  # what it had stays readable
    report = session.export_report()
    assert report["spans_sent"] + report["spans_dropped"] == 300 * 3 + 2000


FORK_SCRIPT = """
import json, multiprocessing as mp, os, sys
import resettrace
from resettrace import catalog as C

session = resettrace.configure(mode="trace", exporters=("otlp",), otlp_endpoint=sys.argv[1])

def traces(n):
    rec = resettrace.current_recorder()
    for _ in range(n):
        with rec.scope(C.DR_RESET, 2):
            with rec.scope(C.DR_RESET_PLAN):
                pass
            with rec.scope(C.SET_STATE):
                pass

def worker(out):
    os.environ["RESETTRACE_WORKER_RANK"] = "3"  # set in the worker, after the fork
    traces(300)
    st = resettrace.stats()
    with open(out, "w") as f:
        json.dump({"dr_reset": st["dr_reset_total_ms"].count, "pid": os.getpid()}, f)

traces(2)
resettrace.stats()  # the parent's samples exist before the fork
p = mp.get_context("fork").Process(target=worker, args=(sys.argv[2],))
p.start()
p.join(60)
sys.exit(p.exitcode)
"""


def test_a_session_inherited_over_fork_is_re_armed_in_the_worker(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from resettrace.testing.receivers import GrpcReceiver

    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    out = tmp_path / "worker.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    with GrpcReceiver() as rx:
        r = subprocess.run([sys.executable, str(script), rx.endpoint, str(out)], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        spans = rx.spans()
    worker = json.loads(out.read_text())
    assert worker["dr_reset"] == 300  # its own calls only, not the parent's two
    mine = [s for s in spans if s.resource["process.pid"] == worker["pid"]]
    assert len(mine) == 900  # every span of the worker arrived: flushed as it left
    assert {s.resource["resettrace.worker.rank"] for s in mine} == {3}
    parent = [s for s in spans if s.resource["process.pid"] != worker["pid"]]
    assert len(parent) == 6 and {s.resource["resettrace.worker.rank"] for s in parent} == {0}


def test_two_sessions_given_one_span_file_never_corrupt_it(
        tmp_path: Path) -> None:
    import json

    path = tmp_path / "spans.jsonl"
    a = Tracing(Config(mode="trace", exporters=(f"file:{path}",)))
    b = Tracing(Config(mode="trace", exporters=(f"file:{path}",)))
    for i in range(400):  # interleaved, as two workers would
        record_traces(a if i % 2 else b, 1)
    a.force_flush()
    b.force_flush()
    for s in (a, b):
        s.shutdown()
    files = sorted(tmp_path.glob("spans*.jsonl"))
    assert [f.name for f in files] == ["spans.jsonl", f"spans.p{os.getpid()}.jsonl"]
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    assert len(lines) == 1200  # nothing truncated, nothing interleaved
    written = []
    for s in (a, b):
        report = s.export_report()
        assert report["spans_not_delivered"] == 0 and report["spans_sent"] == 600
        written.append(report["exporters"][f"file:{path}"]["path"])
    assert sorted(written) == [str(f) for f in files]  # each report names the file it wrote


OVERLAP_SCRIPT = """
import json, os, sys, time
from pathlib import Path
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.tracing.session import Tracing

spec, role, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])

def wait_for(name):
    while not (folder / name).exists():
        time.sleep(0.01)

def traces(session, n):
    rec = session.recorder()
    for _ in range(n):
        with rec.scope(C.DR_RESET, 2):
            with rec.scope(C.SET_STATE):
                pass

if role == "second":
    wait_for("first-wrote")
session = Tracing(Config(mode="trace", exporters=(spec,)))
print("set up", file=sys.stderr, flush=True)
if role == "first":
    traces(session, 100)
    assert session.force_flush()  # its 200 spans are in the file
    (folder / "first-wrote").touch()
    wait_for("second-set-up")
else:
    assert session.force_flush()  # its export process is set up, nothing written yet
    (folder / "second-set-up").touch()
    wait_for("first-done")  # the first session has closed the path
    traces(session, 100)
session.shutdown()
print(json.dumps(session.export_report()))
if role == "first":
    (folder / "first-done").touch()
"""


@pytest.mark.parametrize("kind", ["file", "perfetto"])
def test_a_second_process_on_a_live_sessions_span_file_writes_beside_it_and_says_so(
        tmp_path: Path, kind: str) -> None:
    """Two processes given one span path, overlapping: the second used to open the file on
    its first export, after the first had closed it, and truncate it: 200 of 400 spans
    survived and both reported "delivered 200". The path is held from the session's set-up
    to its end: the second process writes ``NAME.pPID.SUFFIX`` and says so at set-up."""
    import json
    import subprocess
    import sys

    from helpers import clean_env

    suffix = {"file": ".jsonl", "perfetto": ".json"}[kind]
    path = tmp_path / f"spans{suffix}"
    spec = f"{kind}:{path}"
    env = dict(clean_env(), PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", OVERLAP_SCRIPT, spec, role, str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for role in ("first", "second")]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    first, second = (json.loads(out.splitlines()[-1]) for out, _ in outs)
    beside = path.with_name(f"spans.p{procs[1].pid}{suffix}")
    assert first["exporters"][spec]["path"] == str(path)
    assert first["exporters"][spec]["delivered"] == 200
    assert second["exporters"][spec]["path"] == str(beside)
    assert second["exporters"][spec]["delivered"] == 200
    assert second["spans_not_delivered"] == first["spans_not_delivered"] == 0

    def pids(file: Path) -> list[int]:
        if kind == "file":
            return [json.loads(x)["resource"]["process.pid"]
                    for x in file.read_text().splitlines()]
        return [e["pid"] for e in json.loads(file.read_text())["traceEvents"]
                if e["ph"] == "X"]

    assert pids(path) == [procs[0].pid] * 200  # the first process's spans all survive
    assert pids(beside) == [procs[1].pid] * 200
    # the second process was told at set-up, in one line
    err = outs[1][1].splitlines()
    told = [i for i, line in enumerate(err) if "being written by another process" in line]
    assert len(told) == 1 and told[0] < err.index("set up"), outs[1][1]
    assert str(path) in err[told[0]] and str(beside) in err[told[0]]


def test_span_file_paths_take_pid_and_rank(tmp_path: Path) -> None:
    session = Tracing(Config(mode="trace", worker_rank=5,
                             exporters=(f"file:{tmp_path / 'spans-{pid}-{rank}.jsonl'}",)))
    record_traces(session, 3)
    session.shutdown()
    assert (tmp_path / f"spans-{os.getpid()}-5.jsonl").read_text().count("\n") == 9


FULL_DISK_SCRIPT = """
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (700_000, 700_000))  # the disk fills mid-run
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.tracing.session import Tracing
session = Tracing(Config(mode="trace", exporters=("file:" + sys.argv[1],)))
rec = session.recorder()
for _ in range(2000):
    with rec.scope(C.DR_RESET, 3):
        with rec.scope(C.DR_RESET_PLAN):
            pass
session.shutdown()
print(json.dumps(session.export_report()))
"""


def test_a_full_disk_leaves_whole_lines_and_counts_exactly(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    path = tmp_path / "spans.jsonl"
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    r = subprocess.run([sys.executable, str(script), str(path)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.splitlines()[-1])
    text = path.read_text()
    assert text.endswith("\n") and len(text) <= 700_000
    lines = [json.loads(x) for x in text.splitlines()]  # every line whole
    file_report = report["exporters"][f"file:{path}"]
    assert file_report["delivered"] == len(lines) > 0
    assert file_report["undelivered"] == 4000 - len(lines) > 0


def test_jaeger_json_holds_whole_traces_in_jaeger_ui_form(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The document Jaeger's UI upload converts in the browser (no server): whole traces
    even when export calls are cut short (7 spans a call, 3 spans a trace)."""
    import json
    import time

    path = tmp_path / "traces.json"
    t0 = time.time_ns() // 1000
    session = Tracing(Config(mode="trace", exporters=(f"jaeger-json:{path}",),
                             service_name="mylab", export_batch_size=7))
    record_traces(session, 50)
    session.shutdown()
    doc = json.loads(path.read_text())
    assert len(doc["data"]) == 50
    for trace in doc["data"]:
        spans = trace["spans"]
        assert len(spans) == 3 and {s["traceID"] for s in spans} == {trace["traceID"]}
        ids = {s["spanID"] for s in spans}
        root = [s for s in spans if not s["references"]]
        assert len(root) == 1 and root[0]["operationName"] == "dr_reset"
        for s in spans:
            assert s["processID"] in trace["processes"]
            assert t0 <= s["startTime"] <= time.time_ns() // 1000 and s["duration"] >= 0
            for ref in s["references"]:
                assert ref["refType"] == "CHILD_OF" and ref["spanID"] in ids
            tags = {t["key"]: t for t in s["tags"]}
            assert tags["resettrace.reset.count"] == {"key": "resettrace.reset.count",
                                                     "type": "int64", "value": 3}
        process = trace["processes"][root[0]["processID"]]
        assert process["serviceName"] == "mylab"
        assert {t["key"] for t in process["tags"]} >= {"process.pid", "resettrace.worker.rank"}
    assert session.export_report()["spans_not_delivered"] == 0


def test_a_backlog_after_a_paused_child_is_sent_in_capped_batches_and_counted_right() -> None:
    import time

    from resettrace.testing.receivers import GrpcReceiver

    with GrpcReceiver() as rx:
        session = Tracing(Config(mode="trace", exporters=("otlp",), otlp_endpoint=rx.endpoint,
                                 queue_size=100_000, shutdown_timeout_s=30))
        record_traces(session, 1)
        proc = session.process
        assert proc is not None and proc._proc is not None
        session.force_flush(10)
        os.kill(proc._proc.pid, signal.SIGSTOP)
        try:
            for _ in range(30):  # a backlog builds up in the pipe and in this process
                record_traces(session, 500)
                time.sleep(0.01)
        finally:
            os.kill(proc._proc.pid, signal.SIGCONT)
        assert session.force_flush(30)
        session.shutdown()
        received = len(rx.spans())
        requests = rx.requests
    report = session.export_report()
    produced = 3 * 15_001
    assert report["spans_sent"] + report["spans_dropped"] == produced
    delivered = report["exporters"]["otlp"]["delivered"]
    assert delivered == received  # what the receiver holds, no more, no less
    assert report["exporters"]["otlp"]["undelivered"] == produced - received
    assert requests >= received / 512  # no request above the batch cap
    # the export process says what it cost: start-up apart, then per span received
    assert report["export_cpu_s"] > report["export_setup_cpu_s"] > 0
    assert report["export_cpu_us_per_span"] == pytest.approx(
        1e6 * (report["export_cpu_s"] - report["export_setup_cpu_s"]) / report["spans_sent"])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_whose_answer_timed_out_are_counted_as_timed_out(protocol: str) -> None:
    """The receiver took the request but answered after the client's timeout: the spans
    are not delivered (never acknowledged), and the report says the receiver may hold them."""
    from resettrace.bench.collector import render_export
    from resettrace.testing.receivers import GrpcReceiver, HttpReceiver

    rx = GrpcReceiver(delay_s=1.5) if protocol == "grpc" else HttpReceiver(delay_s=1.5)
    with rx:
        session = Tracing(Config(mode="trace", exporters=("otlp",), otlp_endpoint=rx.endpoint,
                                 otlp_protocol=protocol, otlp_timeout_s=0.3,
                                 shutdown_timeout_s=10))
        record_traces(session, 4)
        assert session.force_flush(10)
        session.shutdown()
        received = len(rx.wait_for(12, timeout=5))
    otlp = session.export_report()["exporters"]["otlp"]
    assert received == 12  # the receiver holds them ...
    assert otlp["delivered"] == 0  # ... but never acknowledged them in time
    assert otlp["failed"] == otlp["timed_out"] == 12
    assert otlp["delivered"] <= received <= otlp["delivered"] + otlp["timed_out"]
    assert "12 of them timed out" in render_export(session.export_report())


def _fill_the_status_pipe(session: Tracing, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A training process that reads none of the export process's status lines (until
    ``monkeypatch.undo()``) while 700 traces make one each: over the 64 KiB a pipe holds."""
    import time

    proc = session.process
    assert proc is not None
    monkeypatch.setattr(proc, "_read_status", lambda: None)
    for _ in range(700):
        record_traces(session, 1)
        time.sleep(0.002)
    return proc


def test_a_long_run_never_stalls_on_the_status_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of export calls, each followed by a status line: the export process must
    never block on a status pipe the training process reads seldom (it used to, after 64
    KiB, and from then on every trace was dropped)."""
    import time

    from resettrace.testing.receivers import GrpcReceiver
    from resettrace.tracing.export import parent as export_process

    monkeypatch.setattr(export_process, "_WRITE_DELAY_S", 0.0)  # a write per trace ...
    with GrpcReceiver(count_only=True) as rx:
        session = Tracing(Config(mode="trace", exporters=("otlp",), otlp_endpoint=rx.endpoint,
                                 shutdown_timeout_s=30,
                                 export_delay_s=0.0))  # ... and an export call per wake-up
        _fill_the_status_pipe(session, monkeypatch)
        # 16,000 more traces, more than the trace pipe and the queue hold together, in
        # chunks the queue holds, each waited for at the receiver: an export process stalled
        # on the status pipe delivers no more, however fast the machine (a chunk is never
        # dropped for want of CPU, so the count below holds on a loaded one)
        for sent in range(1000, 16_001, 1000):
            record_traces(session, 1000)
            deadline = time.monotonic() + 60
            while rx.counted < 3 * (700 + sent) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert rx.counted == 3 * (700 + sent), f"stalled after {rx.counted} spans"
        monkeypatch.undo()
        assert session.force_flush(30)
        session.shutdown()
        received = rx.counted
    report = session.export_report()
    assert report["spans_dropped"] == 0
    assert report["exporters"]["otlp"]["delivered"] == received == 3 * 16_700


def test_a_flush_acknowledged_into_a_full_status_pipe_still_arrives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export process acknowledges a flush on its status pipe without blocking; when the
    pipe is full then, the acknowledgement must follow once the training process reads
    again, with no further frame to prompt it (it used to wait for one: a flush then timed
    out although everything was exported)."""
    import time

    from resettrace.tracing.export import parent as export_process

    monkeypatch.setattr(export_process, "_WRITE_DELAY_S", 0.0)  # a write per trace ...
    session = Tracing(Config(mode="trace", exporters=(f"file:{tmp_path / 's.jsonl'}",),
                             export_delay_s=0.0))  # ... and an export call per wake-up
    proc = _fill_the_status_pipe(session, monkeypatch)
    assert not proc.flush(1.0)  # acknowledged into the full pipe, which nobody reads
    monkeypatch.undo()  # the parent reads again and sends nothing more
    deadline = time.monotonic() + 10
    while int(proc._status.get("flush", 0)) < proc._flush_seq and time.monotonic() < deadline:
        proc._read_status()
        time.sleep(0.02)
    assert int(proc._status.get("flush", 0)) == proc._flush_seq
    assert proc._status["exported"] == {f"file:{tmp_path / 's.jsonl'}": 3 * 700}
    session.shutdown()


def test_a_flush_returns_once_acknowledged(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush waits for the export process's acknowledgement, and not a moment after it: it
    used to sleep one more 50 ms poll after reading it, so every flush took 50 ms."""
    import select

    session = Tracing(Config(mode="trace", exporters=(f"file:{tmp_path / 's.jsonl'}",)))
    record_traces(session, 3)
    proc = session.process
    assert proc is not None
    real = select.select
    late: list[int] = []

    def watched(*args: Any) -> Any:
        if int(proc._status.get("flush", 0)) >= proc._flush_seq > 0:
            late.append(proc._flush_seq)  # a wait with the acknowledgement already read
        return real(*args)

    monkeypatch.setattr(select, "select", watched)
    for _ in range(3):
        assert session.force_flush(10)
        record_traces(session, 1)
    monkeypatch.undo()
    session.shutdown()
    assert proc._flush_seq == 3 and late == []


@pytest.mark.parametrize("encoder", ["records", "sdk"])
def test_export_calls_carry_full_batches_until_the_delay_or_a_flush(
        encoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans that arrive a few at a time go out in full batches: the rest of a wake-up's
    spans waits for more (each call costs sender and receiver ~0.3 ms of CPU) until its
    delay is up or a flush comes. It used to go out with every wake-up, as a small call."""
    import time

    from resettrace.testing.receivers import GrpcReceiver
    from resettrace.tracing.export import parent as export_process

    monkeypatch.setattr(export_process, "_WRITE_DELAY_S", 0.0)  # a pipe write per trace
    with GrpcReceiver() as rx:
        session = Tracing(Config(mode="trace", exporters=("otlp",), otlp_endpoint=rx.endpoint,
                                 export_batch_size=10,  # 3 whole traces of 3
                                 export_delay_s=60.0, span_encoder=encoder))
        for _ in range(10):
            record_traces(session, 1)
            time.sleep(0.02)  # the export process reads each write on its own
        rx.wait_for(27, timeout=10)  # three full calls, then 3 spans wait ...
        assert session.force_flush(10)  # ... until the flush
        session.shutdown()
        assert rx.request_spans == [9, 9, 9, 3]
    assert session.export_report()["exporters"]["otlp"]["delivered"] == 30


def test_held_traces_are_pending_until_packed_and_a_flush_delivers_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from resettrace.tracing.export import parent as X

    monkeypatch.setattr(X, "_WRITE_DELAY_S", 1e9)  # only the trace count packs
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{out}",)))
    record_traces(session, X._HOLD_TRACES - 1)
    proc = session.process
    assert proc is not None
    # the compiled recorder queued all but the first: pending, and held once counted
    assert proc.pending_spans == proc._held_spans == 3 * (X._HOLD_TRACES - 1)
    report = session.export_report()  # a report packs what is held: nothing is unaccounted
    assert proc._held_spans == 0
    assert report["spans_sent"] == 3 * (X._HOLD_TRACES - 1)
    rec = session.recorder(backend="other")  # another recorder: the held go out first
    record_traces(session, 2)
    with rec.scope(C.ENV_STEP):
        pass
    assert proc._held_spans == 1  # the other recorder's trace only
    assert session.force_flush(10)
    assert proc._held_spans == 0
    session.shutdown()
    spans = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(spans) == 3 * (X._HOLD_TRACES + 1) + 1
    assert [s["attributes"].get(C.ATTR_BACKEND) for s in spans[-1:]] == ["other"]
    [file_report] = session.export_report()["exporters"].values()
    assert file_report["delivered"] == len(spans)


def test_a_killed_export_child_counts_every_held_and_queued_span(tmp_path: Path) -> None:
    import time

    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{out}",), shutdown_timeout_s=5))
    record_traces(session, 100)
    proc = session.process
    assert proc is not None and proc._proc is not None
    assert session.force_flush(10)
    os.kill(proc._proc.pid, signal.SIGKILL)
    proc._proc.wait(5)
    for _ in range(20):  # some go to the dead pipe, some are held when it is found dead
        record_traces(session, 50)
        time.sleep(0.02)
    session.shutdown()
    report = session.export_report()
    produced = 3 * 1100
    assert report["spans_sent"] + report["spans_dropped"] == produced
    assert report["spans_pending"] == 0
    lines = out.read_text().splitlines()
    [file_report] = report["exporters"].values()
    assert file_report["delivered"] == len(lines) == 300
    assert file_report["undelivered"] == produced - 300


def test_closing_the_export_leaves_no_fd_to_be_closed_twice() -> None:
    """The pipes were closed with ``os.close`` on their numbers while their file objects
    stayed open: collecting those objects later closed the numbers again, by then maybe
    another fd (a new ``subprocess.Popen`` pipe failed with EBADF that way)."""
    import gc
    import os

    session = Tracing(Config(mode="trace", exporters=("otlp",),
                             otlp_endpoint="http://127.0.0.1:9"))
    proc = session.process
    assert proc is not None and proc._proc is not None
    streams = [proc._proc.stdin, proc._proc.stdout]
    numbers = [s.fileno() for s in streams if s is not None]
    session.shutdown(1.0)
    reused = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]  # take the freed numbers
    assert set(numbers) <= set(reused)
    del streams
    gc.collect()
    for fd in reused:
        os.fstat(fd)  # still ours: nothing closed it
        os.close(fd)



def _spans(path: Path) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


@compiled_only
def test_the_compiled_recorder_hands_the_export_its_traces_in_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Traces reach the export's queue with no call each: on_trace runs once per
    _HOLD_TRACES traces (it was once per trace, ~20 us each right after the engine step),
    and every span still arrives, counted."""
    from resettrace.tracing.export import parent as X

    monkeypatch.setattr(X, "_WRITE_DELAY_S", 1e9)  # only the trace count hands over
    calls = []
    on_trace = X.ProcessExporter.on_trace
    monkeypatch.setattr(X.ProcessExporter, "on_trace",
                        lambda self, t, r: (calls.append(len(t)), on_trace(self, t, r)))
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{out}",)))
    record_traces(session, 10 * X._HOLD_TRACES)
    assert 10 <= len(calls) <= 11  # the first (it starts the deadline), then one per batch
    session.shutdown()
    assert len(_spans(out)) == 30 * X._HOLD_TRACES
    report = session.export_report()
    assert report["spans_sent"] == 30 * X._HOLD_TRACES and report["spans_not_delivered"] == 0

