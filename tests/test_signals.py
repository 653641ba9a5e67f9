"""Real processes, real signals: what a scheduler, a pool's ``terminate()`` or a kill does to
a run. Nothing recorded is lost without being counted, files are written, and no export
process is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from resettrace.testing.receivers import BlackholeListener, GrpcReceiver


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    env.update(extra)
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waits for its parent: it is gone
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, limit_s: float) -> float:
    """Seconds until ``pid`` is gone (``limit_s`` if it is still there then)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and _alive(pid):
        time.sleep(0.05)
    return time.monotonic() - t0


POOL_SCRIPT = """
import multiprocessing as mp, os, sys

TRACES = 10

def work(i):
    import resettrace
    from resettrace import catalog as C
    rec = resettrace.current_recorder()
    for _ in range(TRACES):
        with rec.scope(C.DR_RESET, 2):
            with rec.scope(C.SET_STATE):
                pass
    return os.getpid()

if __name__ == "__main__":
    with mp.get_context(sys.argv[1]).Pool(3) as pool:  # its exit calls terminate()
        pids = pool.map(work, range(30), chunksize=1)
    print(len(set(pids)))
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_pool_used_as_a_context_manager_loses_no_span(start_method: str,
                                                        tmp_path: Path) -> None:
    """``with Pool(3)``: its exit terminates the workers (SIGTERM) just as they flush on
    the way out. 205-286 of 300 traces arrived before; every one must, over OTLP and in
    the span files."""
    script = tmp_path / "pool.py"
    script.write_text(textwrap.dedent(POOL_SCRIPT))
    with GrpcReceiver() as rx:
        env = _clean_env(RESETTRACE="trace",
                         RESETTRACE_EXPORTER=f"otlp,file:{tmp_path}/spans-{{pid}}.jsonl",
                         OTEL_EXPORTER_OTLP_ENDPOINT=rx.endpoint)
        r = subprocess.run([sys.executable, str(script), start_method], env=env,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        held = len(rx.span_keys())
    lines = [line for f in tmp_path.glob("spans-*.jsonl") for line in f.read_text().splitlines()]
    assert len(lines) == 600, r.stderr
    assert held == 600, r.stderr
    assert "not delivered" not in r.stderr


COLLECTOR_TAIL = [sys.executable, "-m", "resettrace.cli", "bench", "collector", "--num-envs",
                  "16", "--warmup", "0", "--nthread", "1"]


def test_sigterm_during_the_collectors_final_flush_still_writes_its_files(
        tmp_path: Path) -> None:
    """The collector is down, the run is over and flushing (for up to the shutdown
    timeout) when SIGTERM comes: timing.json and timing.csv are written, the exit code says
    SIGTERM, and no export process is left (none of it, before)."""
    out = tmp_path / "run"
    with BlackholeListener() as hole:
        env = _clean_env(RESETTRACE="trace", RESETTRACE_EXPORTER="otlp",
                         OTEL_EXPORTER_OTLP_ENDPOINT=hole.endpoint,
                         RESETTRACE_SHUTDOWN_TIMEOUT="3", OTEL_EXPORTER_OTLP_TIMEOUT="1")
        p = subprocess.Popen([*COLLECTOR_TAIL, "--steps", "30", "--out", str(out)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stderr is not None
        for line in p.stderr:  # the last step is done: the final flush begins
            if line.startswith("step 30/30"):
                break
        time.sleep(0.5)
        export_pids = _children(p.pid)
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr and "interrupted by SIGTERM" in stderr
    data = json.loads((out / "timing.json").read_text())
    assert data["stats"]["env_step_total_ms"]["count"] == 30
    assert (out / "timing.csv").read_text().startswith("key,")
    otlp = data["export"]["exporters"]["otlp"]
    assert otlp["undelivered"] == otlp["failed"] + otlp["cut_off"] + data["export"][
        "spans_dropped"] > 0
    assert export_pids and all(_wait_gone(pid, 5) < 5 for pid in export_pids)


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (the export process is one)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


TRAINING_SCRIPT = """
import sys, time
import resettrace
from resettrace import catalog as C
session = resettrace.configure(mode="trace", exporters=("otlp",), otlp_endpoint=sys.argv[1],
                               shutdown_timeout_s=1.0, otlp_timeout_s=5.0)
rec = resettrace.current_recorder()
for _ in range(3000):
    with rec.scope(C.DR_RESET, 2):
        with rec.scope(C.SET_STATE):
            pass
session.process.flush(0.2)  # the export process is now stuck sending to the blackhole
print(session.process._proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["SIGKILL", "two SIGTERMs"])
def test_the_export_process_leaves_soon_after_its_training_process_dies(
        how: str, tmp_path: Path) -> None:
    """The collector never answers; the training process is killed (or stopped by two
    SIGTERMs, the second of which kills at once). The export process used to stay 95 s
    (17 s); it must notice and leave within its shutdown timeout (1 s here)."""
    with BlackholeListener() as hole:
        p = subprocess.Popen([sys.executable, "-c", TRAINING_SCRIPT, hole.endpoint],
                             env=_clean_env(), stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None
            child = int(p.stdout.readline())
            assert _alive(child)
            if how == "SIGKILL":
                p.kill()
            else:
                p.send_signal(signal.SIGTERM)
                time.sleep(0.05)
                p.send_signal(signal.SIGTERM)
            p.wait(30)
            gone_after = _wait_gone(child, 30)
        finally:
            if p.poll() is None:
                p.kill()
    assert not _alive(child)
    assert gone_after < 10, f"the export process outlived its parent by {gone_after:.1f} s"


RUN_SCRIPT = """
import time
import resettrace
from resettrace import catalog as C
rec = resettrace.current_recorder()
for _ in range(7):
    with rec.scope(C.DR_RESET, 2):
        pass
print("ready", flush=True)
time.sleep(600)
"""


def test_resettrace_run_writes_its_summary_and_stats_on_sigterm(tmp_path: Path) -> None:
    """``resettrace run`` in timing mode, stopped by a scheduler's SIGTERM: the summary and
    the ``--stats-json`` file are written (SIGTERM ended it in 0.02 s with neither)."""
    script = tmp_path / "train.py"
    script.write_text(RUN_SCRIPT)
    stats = tmp_path / "stats.json"
    p = subprocess.Popen([sys.executable, "-m", "resettrace.cli", "run", "--stats-json",
                          str(stats), "--", sys.executable, str(script)], env=_clean_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    assert "dr_reset_total_ms" in stderr  # the summary table
    data = json.loads(stats.read_text())
    assert data["stats"]["dr_reset_total_ms"]["count"] == 7


def test_held_signals_wait_for_the_block_and_go_to_the_users_handler_after() -> None:
    from resettrace.tracing.exits import holding_signals

    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with holding_signals(redeliver=True) as held:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # Python runs handlers between bytecodes: give it a chance
            assert held.received == [signal.SIGTERM] and seen == []  # held, not delivered
        assert seen == [signal.SIGTERM]  # delivered to the user's handler once it was over
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_ignored_signal_stays_ignored_while_held() -> None:
    from resettrace.tracing.exits import holding_signals

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with holding_signals() as held:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        assert held.received == [] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_second_signal_while_held_ends_the_process_at_once() -> None:
    script = textwrap.dedent("""
        import os, signal, sys, time
        from resettrace.tracing.exits import holding_signals
        with holding_signals() as held:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            print("held", held.received == [signal.SIGTERM], flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        print("not reached", flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, env=_clean_env())
    assert r.stdout.split() == ["held", "True"], r.stderr
    assert r.returncode == -signal.SIGTERM


WATCHED_SCRIPT = """
import multiprocessing as mp, os, sys

def work(_):
    import resettrace
    from resettrace import catalog as C
    from resettrace.tracing import exits
    with resettrace.current_recorder().scope(C.DR_RESET, 1):
        pass
    return exits._WATCH["pid"] == os.getpid()

if __name__ == "__main__":
    with mp.get_context(sys.argv[1]).Pool(1) as pool:
        print(pool.map(work, [0])[0])
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_pool_worker_watches_for_a_sigterm_left_pending(start_method: str,
                                                          tmp_path: Path) -> None:
    """A spawned worker installed its SIGTERM handler after looking for it to watch, so it
    never watched: a terminate() landing just before the worker blocked on its task queue's
    lock hung ``with Pool(...)`` (about one spawn pool exit in ten here)."""
    script = tmp_path / "watched.py"
    script.write_text(textwrap.dedent(WATCHED_SCRIPT))
    env = _clean_env(RESETTRACE="trace", RESETTRACE_EXPORTER=f"file:{tmp_path}/s-{{pid}}.jsonl")
    r = subprocess.run([sys.executable, str(script), start_method], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"]


STUCK_SCRIPT = """
import sys, time
import resettrace
from resettrace import catalog as C
session = resettrace.configure(mode="trace", exporters=("otlp",), otlp_endpoint=sys.argv[1],
                               shutdown_timeout_s=float(sys.argv[2]), otlp_timeout_s=60.0)
rec = resettrace.current_recorder()
for _ in range(300):
    with rec.scope(C.DR_RESET, 2):
        pass
session.process.flush(0.2)  # the export process is now stuck sending to the blackhole
print(session.process._proc.pid, flush=True)
time.sleep(600)
"""


def test_the_export_process_counts_its_shutdown_timeout_from_its_parents_death(
        tmp_path: Path) -> None:
    """The export process is held up (stopped here; on a busy machine, starved of the CPU
    at its lower priority) when its training process is killed. It used to count its
    shutdown timeout from the moment it noticed the death, and so outlived its parent by
    that delay plus the whole timeout (3.9 s against 2 s); it now counts from the last
    moment it saw its parent alive, so once that is over it leaves at once."""
    timeout = 4.0
    with BlackholeListener() as hole:
        p = subprocess.Popen([sys.executable, "-c", STUCK_SCRIPT, hole.endpoint, str(timeout)],
                             env=_clean_env(), stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None
            child = int(p.stdout.readline())
            os.kill(child, signal.SIGSTOP)
            p.kill()
            p.wait(30)
            time.sleep(timeout + 0.5)  # the whole shutdown timeout passes, the child held up
            os.kill(child, signal.SIGCONT)
            gone_after = _wait_gone(child, 20)
        finally:
            if p.poll() is None:
                p.kill()
            if _alive(child):
                os.kill(child, signal.SIGKILL)
    # the old rule: at least the whole timeout again, counted from the SIGCONT
    assert gone_after < timeout, f"the export process stayed {gone_after:.1f} s more"


# A 0.3 ms timer whose handler records a scope, in trace mode with a file exporter: the
# handler lands anywhere, in the recorder's steps, in a trace's hand-over to the export
# sink (which holds its lock) and while the default session is being made.
RECORDING_HANDLER_SCRIPT = """
import json, signal, sys
import resettrace
from resettrace import catalog as C

steps = int(sys.argv[1])
state = {"fired": 0, "recorded": 0}

def handler(signum, frame):
    state["fired"] += 1
    rec = resettrace.current_recorder()
    with rec.scope(C.SET_STATE_SET_DOF_POS, 1):
        pass
    state["recorded"] += rec.enabled

if sys.argv[2] == "after start-up":
    resettrace.get_tracing()
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
session = resettrace.get_tracing()  # at start-up: made while the timer fires
rec = resettrace.current_recorder()

@resettrace.traced(C.DR_RESET, count="ids")
def reset(ids):
    with rec.scope(C.SET_STATE, len(ids)):
        pass

print("started", flush=True)
try:
    for _ in range(steps):
        with rec.scope(C.RESET_DONE, 2):
            reset([0, 1])
finally:  # (a SIGTERM leaves through SystemExit)
    signal.setitimer(signal.ITIMER_REAL, 0)
session.shutdown()
report = session.export_report()
print(json.dumps(dict(state, dropped=report["spans_dropped"],
                      steps=resettrace.stats()["reset_done_ms"].count)))
"""


def _recording_handler_run(tmp_path: Path, pure: bool, steps: int,
                           when: str = "at start-up") -> subprocess.Popen[str]:
    script = tmp_path / "handler.py"
    script.write_text(textwrap.dedent(RECORDING_HANDLER_SCRIPT))
    env = _clean_env(RESETTRACE="trace", RESETTRACE_EXPORTER=f"file:{tmp_path}/spans.jsonl",
                     RESETTRACE_QUEUE_SIZE="1000000", RESETTRACE_PURE_PYTHON=str(int(pure)))
    return subprocess.Popen([sys.executable, str(script), str(steps), when], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p: subprocess.Popen[str], watchdog_s: float) -> tuple[str, str]:
    try:
        return p.communicate(timeout=watchdog_s)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
        pytest.fail(f"still running after {watchdog_s} s (a deadlock?): {stderr[-2000:]}")


@pytest.mark.parametrize("when", ["at start-up", "after start-up"])
@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure-python"])
def test_a_signal_handler_that_records_neither_deadlocks_nor_corrupts_a_trace(
        pure: bool, when: str, tmp_path: Path) -> None:
    """The handler's trace waited for the export sink's lock that its own thread held
    (the main thread blocked until killed; at start-up, the default session's lock), with
    thousands of RecursionErrors; the pure-Python recorder also left ``reset_done`` open
    (-1,734,828 ms). Every step's trace and every handler's scope is written, each span
    inside its parent, none negative."""
    steps = 5000
    p = _recording_handler_run(tmp_path, pure, steps, when)
    stdout, stderr = _finish(p, 120)
    assert p.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "RecursionError" not in stderr
    out = json.loads(stdout.splitlines()[-1])
    assert out["dropped"] == 0 and out["steps"] == steps
    assert out["fired"] > 20 and out["recorded"] > 0
    _assert_steps_and_handler_spans(tmp_path / "spans.jsonl", steps, out["recorded"])


def _assert_steps_and_handler_spans(path: Path, steps: int, recorded: int) -> None:
    """Every step's ``reset_done > dr_reset > set_state`` and every scope the handler
    recorded are in the span file, each span inside its parent, none negative."""
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    names = [s["name"] for s in spans]
    assert names.count("reset_done") == names.count("dr_reset") == names.count(
        "set_state") == steps
    assert names.count("set_state.set_dof_pos") == recorded
    by_id = {s["span_id"]: s for s in spans}
    for s in spans:
        assert s["end_ns"] >= s["start_ns"] > 0, s
        parent = by_id.get(s["parent_id"]) if s["parent_id"] else None
        if s["parent_id"]:
            assert parent is not None, s
            assert parent["start_ns"] <= s["start_ns"] <= s["end_ns"] <= parent["end_ns"], (
                parent, s)
        else:
            assert s["name"] in ("reset_done", "set_state.set_dof_pos"), s


# A collection of the cyclic GC runs Python code (gc callbacks, finalizers, weakref
# callbacks), and with it any signal handler that is due; the compiled recorder allocates
# its records from the GC. Here a gc callback records, at every allocation (threshold 1):
# where a recording signal handler can land inside the recorder's own steps.
GC_RECORDING_SCRIPT = """
import gc, json, sys
import resettrace
from resettrace import catalog as C

steps = int(sys.argv[1])
state = {"recorded": 0, "busy": False}

def recording(phase, info):
    if phase != "start" or state["busy"]:
        return
    state["busy"] = True
    try:
        rec = resettrace.current_recorder()
        with rec.scope(C.SET_STATE_SET_DOF_POS, 1):
            pass
        state["recorded"] += rec.enabled
    finally:
        state["busy"] = False

session = resettrace.get_tracing()
rec = resettrace.current_recorder()

@resettrace.traced(C.DR_RESET, count="ids")
def reset(ids):
    with rec.scope(C.SET_STATE, len(ids)):
        pass

gc.callbacks.append(recording)
gc.set_threshold(1)
for _ in range(steps):
    with rec.scope(C.RESET_DONE, 2):
        reset([0, 1])
gc.set_threshold(700)
gc.callbacks.remove(recording)
session.shutdown()
print(json.dumps(dict(state, dropped=session.export_report()["spans_dropped"],
                      steps=resettrace.stats()["reset_done_ms"].count)))
"""


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure-python"])
def test_python_code_run_by_a_collection_inside_the_recorder_leaves_its_traces_exact(
        pure: bool, tmp_path: Path) -> None:
    """The compiled recorder read the position of a new record, then allocated it: a
    collection there ran a gc callback (or a signal handler due) that recorded, and the
    record went on the stack at the handler's position: its scope was never closed (a
    ``set_state`` ending 5 s before it began, under load) and the handler's stayed open."""
    steps = 300
    script = tmp_path / "gc_recording.py"
    script.write_text(textwrap.dedent(GC_RECORDING_SCRIPT))
    env = _clean_env(RESETTRACE="trace", RESETTRACE_EXPORTER=f"file:{tmp_path}/spans.jsonl",
                     RESETTRACE_QUEUE_SIZE="1000000", RESETTRACE_PURE_PYTHON=str(int(pure)))
    p = subprocess.Popen([sys.executable, str(script), str(steps)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = _finish(p, 120)
    assert p.returncode == 0, stderr[-3000:]
    out = json.loads(stdout.splitlines()[-1])
    assert out["dropped"] == 0 and out["steps"] == steps
    assert out["recorded"] > steps  # it landed in the steps' own scopes
    _assert_steps_and_handler_spans(tmp_path / "spans.jsonl", steps, out["recorded"])


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure-python"])
def test_sigterm_ends_a_process_whose_signal_handler_records(pure: bool,
                                                             tmp_path: Path) -> None:
    """With the handler's trace blocked on the sink's lock, SIGTERM was put off for ever."""
    p = _recording_handler_run(tmp_path, pure, 10**8)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "started"
    time.sleep(1.0)  # the loop runs, the timer fires
    p.send_signal(signal.SIGTERM)
    stdout, stderr = _finish(p, 60)
    assert p.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "RecursionError" not in stderr


# The same timer, its handler's scope landing in traced calls of every kind: an
# extension's function traced within a phase (a leaf), a reset's four levels opened at
# once (a chain), laps, and a scope left open that its parent's exit closes. Every trace
# is printed, records as the recorder holds them.
RECORDING_HANDLER_KINDS_SCRIPT = """
import json, math, signal, sys
import resettrace
from resettrace import catalog as C
from resettrace.tracing.recorder import Recorder

traces = []

class Keep:
    def on_trace(self, records, rec):
        traces.append([list(r) for r in records])

rec = Recorder([Keep()])
fired = [0]

def handler(signum, frame):
    fired[0] += 1
    with resettrace.current_recorder().scope(C.SET_STATE_SET_DOF_POS, 1):
        pass

leaf = resettrace.traced(C.SET_STATE_FORWARD_KINEMATIC, within=C.SET_STATE)(math.sqrt)

@resettrace.traced(C.SET_STATE, count=1, parents=True)
def sub_reset():  # under an env step: reset_done down to set_state, four levels at once
    return leaf(4.0)

@resettrace.traced(C.ENV_STEP)
def step():
    sub_reset()
    with rec.scope(C.RESET_DONE, 3, lap=C.RESET_DONE_TERMINAL_OBS) as s:
        s.lap(C.RESET_DONE_RESET_CALL, 2)
        s.lap(None)
        s.lap(C.RESET_DONE_TERMINAL_OBS, 4)
    with rec.scope(C.PHYSICS, 5):
        rec.scope(C.APPLY_ACTION, 6).__enter__()  # left open: closed with its parent

with resettrace.bind(rec):
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
    try:
        for _ in range(int(sys.argv[1])):
            step()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    with rec.scope(C.ENV_STEP):  # the last trace is handed over by the next one's opening
        pass
print(json.dumps({"fired": fired[0], "traces": traces}))
"""


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure-python"])
def test_a_recording_handler_lands_in_leaves_chains_and_laps_and_leaves_them_exact(
        pure: bool, tmp_path: Path) -> None:
    """A handler's scope that landed in a lap, in a scope closed by its parent's exit, or
    (pure Python) in a traced leaf or chain ended after the record it went under: about
    120 records in 5,000 steps outside their parent, in both recorders (laps and unwinds
    are Python in both). Every record now closed, none negative, each inside its parent,
    and every step's records and counts as given, whatever the handler added."""
    script = tmp_path / "kinds.py"
    script.write_text(textwrap.dedent(RECORDING_HANDLER_KINDS_SCRIPT))
    steps = 5000
    p = subprocess.run([sys.executable, str(script), str(steps)], capture_output=True,
                       text=True, timeout=300,
                       env=_clean_env(RESETTRACE_PURE_PYTHON=str(int(pure))))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["fired"] > 20
    from resettrace import catalog as C

    span = {ph.index: ph.span for ph in C.CATALOG}
    handler = C.SET_STATE_SET_DOF_POS.index
    expected = [("env_step", None, -1), ("reset_done", "env_step", 1),
                ("reset_done.reset_call", "reset_done", 1),
                ("dr_reset", "reset_done.reset_call", 1),
                ("set_state", "dr_reset", 1), ("set_state.forward_kinematic", "set_state", -1),
                ("reset_done", "env_step", 3), ("reset_done.terminal_obs", "reset_done", -1),
                ("reset_done.reset_call", "reset_done", 2),
                ("reset_done.terminal_obs", "reset_done", 4), ("env_step.physics", "env_step", 5),
                ("env_step.apply_action", "env_step.physics", 6)]
    stepped = handled = 0
    for trace in out["traces"]:
        for j, r in enumerate(trace):
            assert r[3] >= r[2] > 0, (span[r[0]], r)
            if r[1] >= 0:
                parent = trace[r[1]]
                assert r[1] < j and parent[2] <= r[2] <= r[3] <= parent[3], (
                    span[parent[0]], parent, span[r[0]], r)
            else:
                assert j == 0
            handled += r[0] == handler
            assert r[0] != handler or r[4] == 1
        mine = [(span[r[0]], span[trace[r[1]][0]] if r[1] >= 0 else None, r[4])
                for r in trace if r[0] != handler]
        if mine and mine[0][0] == "env_step" and len(mine) > 1:
            assert mine == expected
            stepped += 1
    assert stepped == steps
    assert handled == out["fired"]


# A handler's scope of the phase a ``with`` is opening, landing between its
# ``rec.scope(phase, count)`` and its ``__enter__`` (raise_signal: the handler runs as the
# call returns, there): the scope object is shared per phase.
HANDLER_SAME_PHASE_SCRIPT = """
import json, signal
import resettrace
from resettrace import catalog as C
from resettrace.tracing.recorder import Recorder

traces = []

class Keep:
    def on_trace(self, records, rec):
        traces.append([[C.CATALOG[r[0]].span, r[1], r[4]] for r in records])

rec = Recorder([Keep()])

def handler(signum, frame):
    if signum == signal.SIGUSR1:  # its own scope() and enter, another handler between
        h = rec.scope(C.DR_RESET, 1)
        signal.raise_signal(signal.SIGUSR2)
        with h:
            pass
        rec.scope(C.DR_RESET).timing()  # a use that is no ``with``
    elif signum == signal.SIGUSR2:
        with rec.scope(C.DR_RESET, 2):
            pass
    else:  # the same phase without the first lap
        with rec.scope(C.RESET_DONE_RESET_CALL, 3):
            pass

for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
    signal.signal(sig, handler)
with rec.scope(C.RESET_DONE, 8):
    s = rec.scope(C.DR_RESET, 5)
    signal.raise_signal(signal.SIGUSR1)
    with s:
        pass
    rec.scope(C.DR_RESET, 9)  # never entered
    with rec.scope(C.DR_RESET, 6):
        pass
    with rec.scope(C.DR_RESET, 7):
        pass
    s = rec.scope(C.RESET_DONE_RESET_CALL, 4, lap=C.DR_RESET)
    signal.raise_signal(signal.SIGHUP)
    with s:
        pass
print(json.dumps(traces))
"""


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure-python"])
def test_a_handlers_scope_of_the_same_phase_leaves_the_count_of_the_one_it_interrupts(
        pure: bool, tmp_path: Path) -> None:
    """``rec.scope(phase, count)`` stores the count (and first lap) on the phase's one
    scope object: a handler's scope of that phase before the ``with``'s ``__enter__`` gave
    the interrupted scope the handler's count (5 recorded as 1) and dropped its first lap.
    Each scope now records its own, nested handlers and unentered calls included."""
    script = tmp_path / "same_phase.py"
    script.write_text(textwrap.dedent(HANDLER_SAME_PHASE_SCRIPT))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, env=_clean_env(RESETTRACE_PURE_PYTHON=str(int(pure))))
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.splitlines()[-1]) == [[
        ["reset_done", -1, 8],
        ["dr_reset", 0, 2], ["dr_reset", 0, 1], ["dr_reset", 0, 5],  # handlers', then its
        ["dr_reset", 0, 6], ["dr_reset", 0, 7],
        ["reset_done.reset_call", 0, 3], ["reset_done.reset_call", 0, 4], ["dr_reset", 7, -1],
    ]]


FORK_IN_TRACE_SCRIPT = """
import json, multiprocessing as mp, os, sys
import resettrace
from resettrace import catalog as C

def steps(n):
    rec = resettrace.current_recorder()
    for _ in range(n):
        with rec.scope(C.RESET_DONE, 1):
            with rec.scope(C.DR_RESET, 1):
                pass
    return os.getpid()

if __name__ == "__main__":
    rec = resettrace.current_recorder()
    with rec.scope(C.RESET_DONE, 1):  # forks inside an open trace
        pid = os.fork()
        if pid == 0:
            steps(100)
            resettrace.get_tracing().shutdown()
            os._exit(0)
        os.waitpid(pid, 0)
        with mp.get_context("fork").Pool(2) as pool:  # made inside a traced step
            workers = pool.map(steps, [50] * 4, chunksize=1)
            pool.close()
            pool.join()
    print(json.dumps({"child": pid, "workers": workers}))
"""


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure-python"])
def test_a_fork_inside_an_open_trace_leaves_the_childs_steps_recorded(
        pure: bool, tmp_path: Path) -> None:
    """The child of ``os.fork()`` inside a scope recorded 0 of its 100 steps, and the
    workers of a ``Pool`` made inside a traced step 0 of 50 each: their scopes joined the
    parent's open trace, which never closes in them. Each writes its own spans now."""
    script = tmp_path / "fork.py"
    script.write_text(textwrap.dedent(FORK_IN_TRACE_SCRIPT))
    env = _clean_env(RESETTRACE="trace",
                     RESETTRACE_EXPORTER=f"file:{tmp_path}/spans-{{pid}}.jsonl",
                     RESETTRACE_PURE_PYTHON=str(int(pure)))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])

    def steps_of(pid: int) -> int:
        path = tmp_path / f"spans-{pid}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return sum(json.loads(line)["name"] == "reset_done" for line in lines)

    assert steps_of(out["child"]) == 100
    assert sum(steps_of(pid) for pid in set(out["workers"])) == 200


def test_a_trace_closed_at_any_call_inside_the_aggregation_sink_neither_deadlocks_nor_is_lost(
        ) -> None:
    """The aggregation sink woke its thread with a ``threading.Event``, whose ``set()``
    holds a lock of Python's: a signal handler whose trace reached the sink inside it
    waited for that lock for ever (a recording SIGALRM handler hung 4 runs in 120 of a
    process then sent SIGTERM). Here a handler lands at every Python call the sink makes
    while it takes a trace (a profile function, on the recording thread), its own trace
    closing there; the thread's queue is full and its worker not started, so every trace
    goes through the wake-up. Nothing blocks, and every trace is queued or counted
    dropped."""
    import threading

    from resettrace import catalog as C
    from resettrace.tracing.aggregate import Aggregator
    from resettrace.tracing.recorder import Recorder

    agg = Aggregator(max_pending=8)
    agg._start_worker = lambda: None  # type: ignore[method-assign]  # (its queue stays full)
    rec = Recorder([agg])
    state = {"landed": 0, "busy": False}

    def handler() -> None:
        with rec.scope(C.SET_STATE_SET_DOF_POS, 1):
            pass

    def land(frame: object, event: str, arg: object) -> None:
        if event != "call" or state["busy"]:
            return
        f = frame
        while f is not None and f.f_code.co_name != "on_trace":  # type: ignore[attr-defined]
            f = f.f_back  # type: ignore[attr-defined]
        if f is None:
            return
        state["busy"] = True  # (one handler at a time, as a signal's)
        try:
            state["landed"] += 1
            handler()
        finally:
            state["busy"] = False

    def train() -> None:
        sys.setprofile(land)
        try:
            for _ in range(200):
                with rec.scope(C.RESET_DONE, 2):
                    pass
        finally:
            sys.setprofile(None)

    t = threading.Thread(target=train, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the training thread is blocked (a deadlock)"
    assert state["landed"] > 50
    assert agg.pending() + agg.dropped_traces == 200 + state["landed"]
    agg._start_worker = Aggregator._start_worker.__get__(agg)  # type: ignore[method-assign]
    assert agg.stats()["set_state_set_dof_pos_ms"].count >= 1
    agg.shutdown()
