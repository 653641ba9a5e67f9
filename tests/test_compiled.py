"""The recorder's hot path in C (``resettrace.tracing._fast``) and its pure-Python twin.

``make test`` builds the extension, so the suite runs the compiled path; these tests check
that it is the one running, and that ``RESETTRACE_PURE_PYTHON=1`` (or an install without
a compiler) records the same: the recorder tests pass under it, and one battery of
scopes, traced calls and MotrixLab perf scopes gives the same records in both."""

from __future__ import annotations

import gc
import json
import math
import re
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import resettrace
from helpers import clean_env, compiled_only
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.tracing import recorder as recorder_module
from resettrace.tracing.api import count_of, traced
from resettrace.tracing.layout import R_COUNT, RECORD_FIELDS
from resettrace.tracing.session import Tracing

ROOT = Path(__file__).resolve().parent.parent

# Every kind of recording, each trace printed as (span, parent, count, error) records.
BATTERY = r'''
import json, math, sys
import numpy as np
import resettrace
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.tracing import recorder as R
from resettrace.tracing.api import traced
from resettrace.tracing.session import Tracing

class Boom(RuntimeError):
    pass

leaf = traced("set_state.forward_kinematic", within="set_state")(math.sqrt)
floor = traced("set_state.data_reset", within="set_state")(math.floor)

@traced("set_state", count=1, parents=True)
def sub_reset(fail=False):
    floor(2.5)
    if fail:
        raise Boom("x")
    return leaf(4.0)

@traced("dr_reset", count="env_ids")
def dr_reset(env_ids, fail=False):
    if fail:
        raise Boom("y")

@traced("set_state", count="self.done")
def masked(self):
    return None

@traced("env_step", env_count="self.n")
def step(self, resets, laps=False):
    leaf(1.0)  # outside set_state: not recorded
    for _ in range(resets):
        sub_reset()
    if laps:
        rec = resettrace.current_recorder()
        with rec.scope("reset_done", 2, lap="reset_done.terminal_obs") as s:
            s.lap(C.RESET_DONE_RESET_CALL)
            s.count = np.array([True, True, False])
    return resets

def callback(x):
    with resettrace.current_recorder().scope(C.SET_STATE_DATA_RESET):
        return -x

adopting = traced("set_state.forward_kinematic", within="set_state")(sorted)

class Env:
    n = 4
    done = np.array([True, False, True, True])

env = Env()
out = []
session = Tracing(Config(mode="timing"))
with resettrace.use_tracing(session):
    rec = session.thread_recorder()
    def keep(name):
        out.append([name, [[C.CATALOG[r[0]].span, r[1], int(r[4]), int(r[5] != 0)]
                           for r in rec._last]])
    step(env, 0); keep("step")
    step(env, 2); keep("step, two resets")
    step(env, 1, laps=True); keep("laps and a count set while open")
    sub_reset(); keep("a reset outside a step")
    dr_reset(np.array([True, False, True])); keep("count: a bool mask")
    dr_reset(np.arange(5)); keep("count: an int array")
    dr_reset(env_ids=7); keep("count: a keyword argument")
    dr_reset(2.0); keep("count: a float")
    dr_reset(np.int64(3)); keep("count: a numpy int")
    masked(env); keep("count: an attribute path")
    try:
        dr_reset(1, fail=True)
    except Boom:
        pass
    keep("an exception")
    try:
        with rec.scope(C.ENV_STEP):
            sub_reset(fail=True)
    except Boom:
        pass
    keep("an exception inside a step")
    with rec.scope(C.SET_STATE, 3):
        adopting([3, 1, 2], key=callback)
    keep("a leaf adopting the scopes its callback opens")
    with rec.scope(C.ENV_STEP):
        rec.scope(C.PHYSICS).__enter__()  # left open: closed with its parent
    keep("a scope left open")
    with rec.scope(C.ENV_STEP):
        with rec.scope(C.PHYSICS):
            pass
        with rec.scope(C.APPLY_ACTION, 5):
            with rec.scope(C.PHYSICS):
                pass
    keep("nested scopes")
    from motrix_env_core import perf
    undo = resettrace.instrument("motrixlab")
    try:
        p = perf.Perf()
        with rec.scope(C.RESET_DONE, 6):
            with p.scope("done_mask"):
                pass
            with perf.active_perf_scope("select_done"):
                pass
            with p.scope("physics"):  # a target's scope: not bridged
                pass
            try:
                with p.scope(name="done_mask"):
                    raise Boom("z")
            except Boom:
                pass
        keep("MotrixLab perf scopes")
    finally:
        undo()
    R.set_max_trace_records(5)
    rec.scope(C.ENV_STEP).__enter__()
    for _ in range(12):
        with rec.scope(C.PHYSICS):
            pass
    keep("an overflow")
    R.set_max_trace_records(100_000)
session.shutdown()
print(json.dumps({"compiled": R.COMPILED, "traces": out}))
'''


def _battery(pure: bool) -> dict[str, object]:
    env = clean_env(RESETTRACE_PURE_PYTHON="1") if pure else clean_env()
    r = subprocess.run([sys.executable, "-c", BATTERY], capture_output=True, text=True,
                       timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@compiled_only
def test_the_default_install_records_in_c() -> None:
    """``make test`` builds the extension: a recorder's state is its C base, scopes are
    armed, entered and exited in C, ``traced`` wrappers are shells around its core."""
    from resettrace.tracing import _fast  # type: ignore[attr-defined]

    assert recorder_module.COMPILED
    rec = recorder_module.Recorder()
    assert isinstance(rec, _fast.RecorderBase)
    assert type(rec).scope is _fast.RecorderBase.scope  # no Python frame in the common case
    assert isinstance(rec.scope(C.ENV_STEP), _fast.ScopeBase)
    wrapped = traced("dr_reset", count="env_ids")(lambda env_ids: None)
    cells = [c.cell_contents for c in wrapped.__closure__ or ()]
    assert any(isinstance(c, _fast.Traced) for c in cells)


def test_the_compiled_part_holds_no_frameworks_code() -> None:
    """A framework's instrumentation lives in ``stacks/`` on the public API: the C part
    names no framework, and exports the recorder's core only."""
    from resettrace.tracing import _fast  # type: ignore[attr-defined]

    source = (ROOT / "src/resettrace/tracing/_fast.c").read_text().lower()
    for name in ("motrix", "gymnasium", "mjlab", "stable_baselines", "ray"):
        assert re.search(rf"\b{name}", source) is None, name
    assert sorted(n for n in dir(_fast) if n[0].isupper()) == [
        "RecorderBase", "Records", "ScopeBase", "Slot", "Trace", "TraceLog", "TraceQueue",
        "Traced"]
    # what it looks up on Python objects: public names only (it read the default
    # session's _default, _local, _closed; the Python state it needs it is given)
    text = (ROOT / "src/resettrace/tracing/_fast.c").read_text()
    looked_up = re.findall(r'INTERN\(\w+, "([^"]+)"\)', text)
    looked_up += re.findall(r'PyObject_CallMethod\(\w+, "([^"]+)"', text)
    assert "on_trace" in looked_up and "call_chain" in looked_up
    assert [n for n in looked_up if n.startswith("_") and not n.startswith("__")] == []


def test_compiled_and_pure_python_record_the_same_traces() -> None:
    compiled, pure = _battery(pure=False), _battery(pure=True)
    assert compiled["compiled"] is True and pure["compiled"] is False
    names = [n for n, _ in compiled["traces"]]  # type: ignore[union-attr]
    assert names == [n for n, _ in pure["traces"]]  # type: ignore[union-attr]
    for (name, a), (_, b) in zip(compiled["traces"], pure["traces"],  # type: ignore[arg-type]
                                 strict=True):
        assert a == b, name
    got = dict(compiled["traces"])  # type: ignore[arg-type]
    # each case did record what it is about (a battery of empty traces would agree too)
    assert got["step, two resets"][1:5] == [["reset_done", 0, 1, 0],
                                            ["reset_done.reset_call", 1, 1, 0],
                                            ["dr_reset", 2, 1, 0], ["set_state", 3, 1, 0]]
    assert [r[2] for r in got["laps and a count set while open"] if r[0] == "reset_done"
            ] == [1, 2]
    assert got["count: a bool mask"] == [["dr_reset", -1, 2, 0]]
    assert got["count: an int array"] == [["dr_reset", -1, 5, 0]]
    assert got["count: a keyword argument"] == [["dr_reset", -1, 7, 0]]
    assert got["count: a float"] == [["dr_reset", -1, -1, 0]]  # not a count: left out
    assert got["count: a numpy int"] == [["dr_reset", -1, 3, 0]]
    assert got["count: an attribute path"] == [["set_state", -1, 3, 0]]
    assert got["an exception"] == [["dr_reset", -1, 1, 1]]
    assert [s for s, *_ in got["a leaf adopting the scopes its callback opens"]] == [
        "set_state", "set_state.forward_kinematic"] + ["set_state.data_reset"] * 3
    assert [r[1] for r in got["a leaf adopting the scopes its callback opens"][2:]] == [1] * 3
    assert got["MotrixLab perf scopes"] == [["reset_done", -1, 6, 0],
                                            ["reset_done.done_mask", 0, -1, 0],
                                            ["reset_done.select_done", 0, -1, 0],
                                            ["reset_done.done_mask", 0, -1, 1]]
    assert len(got["an overflow"]) <= 5


def test_pure_python_fallback_passes_the_recorder_tests() -> None:
    """The recorder, API and fast-path tests, run again with the compiled path off."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", "tests/test_traced_fast_paths.py",
                        "tests/test_public_api.py", "tests/test_processor.py"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env=clean_env(RESETTRACE_PURE_PYTHON="1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout


@pytest.mark.parametrize("value", [
    0, 7, -1, 2**40, np.array([True, False, True]), np.zeros(1031, bool),
    np.random.default_rng(0).random(1031) < 0.3, (np.arange(40) % 3 == 0)[::3],
    np.arange(6), np.zeros((3, 4)), np.array(5), np.zeros((2, 2), bool), np.int64(4), 2.0,
    [1, 2], (1,), b"abc", np.array([], bool), -5, 2**63, 10**400, np.uint64(2**64 - 1),
    np.float32(2.0), None])
def test_counts_read_in_c_are_count_of(value: object) -> None:
    """What the C reader counts (``_fast.count``; None: left to ``count_of``) is what
    ``api.count_of`` counts."""
    from resettrace.tracing import _fast

    c = _fast.count(value)
    if c is not None:
        assert c == count_of(value) and type(c) is int
    elif isinstance(value, np.ndarray):
        assert value.ndim != 1 or value.dtype != bool  # the 1-D masks are counted in C


@compiled_only
def test_a_finished_trace_is_one_object_out_of_the_cyclic_gc() -> None:
    """A finished trace is handed over as one block of int64 fields (no Python object per
    record), left out of the cyclic GC: traces waiting to be aggregated neither slow
    collections nor grow the old generations, and dropping one frees one object."""
    from resettrace.tracing import _fast

    session = Tracing(Config(mode="timing"))
    try:
        with resettrace.use_tracing(session):
            rec = session.thread_recorder()
            with rec.scope(C.ENV_STEP):
                with rec.scope(C.PHYSICS):
                    pass
            trace = rec._last
            assert isinstance(trace, _fast.Trace) and not gc.is_tracked(trace)
            assert len(trace) == 2 and trace[1][0] == C.PHYSICS.index
            flat = np.frombuffer(trace.data, dtype=np.int64).reshape(-1, 6)
            assert flat[:, 0].tolist() == [C.ENV_STEP.index, C.PHYSICS.index]
            assert flat[1, 1] == 0 and flat[0, 1] == -1
    finally:
        session.shutdown()


def test_the_compiled_path_keeps_no_recorder_alive() -> None:
    """The C code caches the last recorder's lists per call site's lookups: it must not
    keep that recorder (nor, through it, its sinks and traces) alive once dropped."""
    import weakref

    wrapped = traced("dr_reset", count="env_ids")(lambda env_ids: None)
    rec = recorder_module.Recorder()
    with resettrace.bind(rec), rec.scope(C.ENV_STEP):
        wrapped(3)  # inside the open trace: the compiled path reads rec's lists
    assert [r[0] for r in rec._last] == [C.ENV_STEP.index, C.DR_RESET.index]
    gone = weakref.ref(rec)
    del rec
    gc.collect()
    assert gone() is None


# Code that gives a recorder new lists (copies of its stack and records, its scopes
# rebound to them), between traces and inside one, the old ones dropped: the C paths
# cached the lists of the last recorder seen, borrowed.
REPLACED_LISTS = r'''
import gc, json, math
from array import array
import resettrace
from resettrace import catalog as C
from resettrace.tracing.recorder import Recorder, Records

traces = []

class Keep:
    def on_trace(self, records, rec):
        traces.append([[C.CATALOG[r[0]].span, r[1], r[4]] for r in records])

rec = Recorder([Keep()])

def replace():
    records = Records()
    records += array("q", rec._records)
    rec._stack, rec._records, rec._laps = list(rec._stack), records, list(rec._laps)
    rec._scopes = list(rec._scopes)
    for s in rec._scopes:
        s._stack, s._records, s._laps = rec._stack, rec._records, rec._laps
    gc.collect()
    [[0] * 6 for _ in range(1000)]  # lists made where the old ones were

leaf = resettrace.traced(C.SET_STATE_FORWARD_KINEMATIC, within=C.SET_STATE)(math.sqrt)

@resettrace.traced(C.SET_STATE, count=1, parents=True)
def sub_reset():
    return leaf(4.0)

@resettrace.traced(C.DR_RESET, count="ids")
def dr_reset(ids):
    return len(ids)

with resettrace.bind(rec):
    for _ in range(3):
        with rec.scope(C.ENV_STEP):
            sub_reset()
            dr_reset([1, 2])
        replace()
        with rec.scope(C.ENV_STEP):
            dr_reset([1])
            replace()
            sub_reset()
            with rec.scope(C.RESET_DONE, 2):
                replace()
                dr_reset([1, 2, 3])
        dr_reset([4])
print(json.dumps(traces))
'''


def _in_both_recorders(script: str) -> list[Any]:
    """What ``script`` prints last (JSON), run in a child process by the compiled recorder
    and by the pure-Python one: the two must agree (a crash fails here)."""
    got = []
    for pure in ("0", "1"):
        r = subprocess.run([sys.executable, "-c", script], capture_output=True,
                           text=True, timeout=120, cwd=ROOT,
                           env=clean_env(PYTHONPATH=str(ROOT / "src"),
                                         RESETTRACE_PURE_PYTHON=pure))
        assert r.returncode == 0, (pure, r.returncode, r.stderr[-2000:])
        got.append(json.loads(r.stdout.splitlines()[-1]))
    assert got[0] == got[1]
    return got


def test_a_recorder_given_new_lists_is_followed_not_a_crash() -> None:
    """The C paths kept the last recorder's lists borrowed behind a weak reference to it:
    lists replaced (and freed) meanwhile were still written to. Now they read the lists
    the recorder holds: the records are the pure-Python recorder's (child processes: a
    crash fails here)."""
    got = _in_both_recorders(REPLACED_LISTS)
    assert len(got[0]) == 9 and got[0][1] == [["env_step", -1, -1], ["dr_reset", 0, 1],
                                              ["reset_done", 0, 1],
                                              ["reset_done.reset_call", 2, 1],
                                              ["dr_reset", 3, 1], ["set_state", 4, 1],
                                              ["set_state.forward_kinematic", 5, -1],
                                              ["reset_done", 0, 2], ["dr_reset", 7, 3]]


# A count whose len() closes scopes the traced call did not open: the inner ones it finds
# open (argv "scope"), or the whole trace ("trace"); 300 scopes left open first, so the
# positions on the stack are ints no cache keeps alive.
COUNT_CLOSES = r'''
import sys
import resettrace
from resettrace import catalog as C
resettrace.configure(mode="timing")
rec = resettrace.current_recorder()
keep = 1 if sys.argv[1] == "scope" else 0

class Closing:
    def __len__(self):
        while len(rec._stack) > keep:
            rec._scopes[rec._records[rec._stack[-1]][0]].__exit__(None, None, None)
        return 3

@resettrace.traced(C.DR_RESET, count="ids")
def reset(ids):
    return 7

for _ in range(50):
    with rec.scope(C.RESET_DONE, 3):
        for _ in range(300):
            rec.scope(C.DR_RESET_PLAN).__enter__()
        assert reset(Closing()) == 7
print(resettrace.stats()["dr_reset_total_ms"].count)
'''


@pytest.mark.parametrize("closes", ["scope", "trace"])
def test_a_count_whose_len_closes_open_scopes_is_recorded_not_a_crash(closes: str) -> None:
    """The C traced call took the stack's size, then read the count (``len()`` of the
    object: Python code that closed the open scopes), then the stack's top: SIGSEGV. In a
    child process, so that a crash fails the test: every call is recorded."""
    r = subprocess.run([sys.executable, "-c", COUNT_CLOSES, closes], capture_output=True,
                       text=True, timeout=120, env=clean_env(PYTHONPATH=str(ROOT / "src")),
                       cwd=ROOT)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["50"]


def test_traced_cores_refuse_out_of_range_indices() -> None:
    """``_fast.Traced(index=-5)`` read the recorder's scope at -5 on its first call
    inside a trace: SIGSEGV. Refused when made (a child process: a crash fails here)."""
    code = r'''
from resettrace.tracing import _fast
base = dict(kind=0, fn=abs, general=abs, count_now=abs, static=None, index=3, within=-1,
            envs=False, chains={}, count_at=-1, count_path=())
for bad in ({"index": -5}, {"within": -2}, {"count_at": -7}, {"kind": 3}):
    try:
        _fast.Traced(**dict(base, **bad))
    except ValueError as e:
        print("refused", e)
    else:
        print("accepted", bad)
'''
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=clean_env(PYTHONPATH=str(ROOT / "src")), cwd=ROOT)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["refused"] * 4
    assert "index must be >= 0" in r.stdout


@pytest.mark.parametrize("args", [(), (None,), (None, None), (None, None, None, None)])
def test_a_scopes_exit_takes_exactly_three_arguments(args: tuple[None, ...]) -> None:
    """As Python's ``__exit__(exc_type, exc, tb)``: the C one took any number (and closed
    the scope)."""
    session = Tracing(Config(mode="timing"))
    rec = session.recorder()
    with rec.scope(C.RESET_DONE):
        s = rec.scope(C.DR_RESET)
        s.__enter__()
        with pytest.raises(TypeError):
            s.__exit__(*args)
        s.__exit__(None, None, None)
    session.shutdown()
    assert session.stats()["dr_reset_total_ms"].count == 1


def test_the_c_part_reads_the_record_layout_from_its_one_definition() -> None:
    """``_layout.h`` is what ``layout.py`` writes (so the C part and the Python code index
    a record by the same names), and the C source indexes records by those names only."""
    from resettrace.tracing import layout

    header = ROOT / "src/resettrace/tracing/_layout.h"
    assert header.read_text() == layout.c_header()
    for i, name in enumerate(layout.FIELDS):
        assert f"#define R_{name.upper()} {i}\n" in header.read_text()
    source = (ROOT / "src/resettrace/tracing/_fast.c").read_text()
    assert '#include "_layout.h"' in source
    # no record field read or written by a bare number
    field = r"(set_int|set_item|int_at)\((r|lr|lap|tr|rq|opened\[k\]), [0-9]"
    assert re.search(field, source) is None
    assert re.search(r"PyList_SET_ITEM\(r, [0-9]", source) is None


def test_an_install_without_the_compiled_recorder_records_and_says_so_once(
        tmp_path: Path) -> None:
    """A copy of the package without its built extension (what an install with no C
    compiler leaves): tracing works, and one line says why it runs in pure Python."""
    import shutil

    pkg = tmp_path / "resettrace"
    shutil.copytree(ROOT / "src/resettrace", pkg,
                    ignore=shutil.ignore_patterns("_fast*.so", "__pycache__"))
    code = ("import resettrace\nfrom resettrace import catalog as C\n"
            "from resettrace.tracing import recorder as R\n"
            "s = resettrace.configure(mode='timing')\n"
            "rec = resettrace.recorder(backend='x')\n"
            "for _ in range(3):\n    with rec.scope(C.RESET_DONE, 2):\n"
            "        with rec.scope(C.DR_RESET, 2):\n            pass\n"
            "resettrace.configure(mode='timing')\n"
            "print(R.COMPILED, s.stats()['dr_reset_total_ms'].count)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=clean_env(PYTHONPATH=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "3"]
    said = [line for line in r.stderr.splitlines() if "compiled recorder" in line]
    assert len(said) == 1 and "not in this install" in said[0], r.stderr


class _Raising:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.seen = 0

    def on_trace(self, records: Any, recorder: Any) -> None:
        self.seen += 1
        raise self.exc


def test_a_sink_that_fails_is_logged_and_one_that_exits_ends_the_with_block(
        caplog: pytest.LogCaptureFixture) -> None:
    """A trace closed in C hands it to the sinks as the Python recorder does: a sink's
    Exception is logged and the next sink still gets the trace; SystemExit (a SIGTERM
    handler's, raised inside a sink) leaves the ``with`` block instead of being logged."""
    failing, after = _Raising(ValueError("sink broke")), _Raising(ValueError("second"))
    rec = recorder_module.Recorder([failing, after])
    with caplog.at_level("ERROR", logger="resettrace"):
        with rec.scope(C.RESET_DONE, 2):
            with rec.scope(C.DR_RESET, 2):
                pass
    assert failing.seen == after.seen == 1
    assert sum("a trace sink failed" in r.message for r in caplog.records) == 2
    assert [r[0] for r in rec._last] == [C.RESET_DONE.index, C.DR_RESET.index]
    assert recorder_module.CURRENT.get() is None and not rec._stack and not rec._records
    exiting = recorder_module.Recorder([_Raising(SystemExit(143))])
    with pytest.raises(SystemExit):
        with exiting.scope(C.RESET_DONE, 2):
            pass
    assert recorder_module.CURRENT.get() is None and not exiting._stack


def test_the_timing_dict_read_in_c_is_the_python_one(clock: Any) -> None:
    """``Scope.timing`` in C (inside the open trace, and from the finished trace after it
    closed) gives the dict the Python method gives: every child key, 0.0 for what did
    not run, the gap; and a fresh one each call."""
    rec = recorder_module.Recorder()
    python_timing = recorder_module._ScopeCore.timing
    with rec.scope(C.RESET_DONE, 3):
        clock.now += 1
        with rec.scope(C.SET_STATE, 3, C.SET_STATE_QPOS_CONVERT) as outer:
            clock.now += 20_000  # ns
            outer.lap(C.SET_STATE_DATA_RESET)
            clock.now += 300_000
            outer.lap(None)
            clock.now += 4_000_000
            with rec.scope(C.SET_STATE_SET_DOF_POS):
                clock.now += 50_000_000
            with rec.scope(C.DR_RESET):  # no key of set_state's: stays in the gap
                clock.now += 600_000_000
            clock.now += 7_000
        inside = [outer.timing(), outer.timing()]  # the first sets the layout (Python)
        assert inside[0] == inside[1] == python_timing(outer)
        assert inside[0] is not inside[1]
    after = outer.timing()
    assert after == python_timing(outer) == inside[0]
    assert set(after) == {p.key for p in C.CATALOG.children(C.SET_STATE)} | {
        C.SET_STATE.gap_key}
    assert math.isclose(after[C.SET_STATE_QPOS_CONVERT.key], 0.02)  # ms
    assert math.isclose(after[C.SET_STATE_DATA_RESET.key], 0.3)
    assert math.isclose(after[C.SET_STATE_SET_DOF_POS.key], 50.0)
    assert after[C.SET_STATE_MASK.key] == 0.0
    assert math.isclose(after[C.SET_STATE.gap_key], 4.0 + 600.0 + 0.007)
    assert math.isclose(sum(after.values()), (rec._last[1][3] - rec._last[1][2]) * 1e-6)


@compiled_only
def test_a_trace_closed_in_c_goes_straight_into_its_sinks_queue_below_its_limit() -> None:
    """A sink with a ``trace_queue`` (a queue of objects, or a log of int64s) gets the
    traces the compiled recorder closes appended to it, with no call of ``on_trace``,
    while it holds fewer than its ``limit``; then (and with limit 0) through ``on_trace``.
    The aggregator counts every one either way."""
    from resettrace.tracing import _fast
    from resettrace.tracing.aggregate import Aggregator

    class Sink:
        def __init__(self, queue: Any) -> None:
            self.trace_queue = queue
            self.trace_queue.limit = 2
            self.calls = 0

        def on_trace(self, records: Any, recorder: Any) -> None:
            self.calls += 1

    sink = Sink(_fast.TraceQueue())
    rec = recorder_module.Recorder([sink])
    for _ in range(5):
        with rec.scope(C.RESET_DONE, 1):
            pass
    assert len(sink.trace_queue) == 2 and sink.calls == 3
    assert sink.trace_queue.popleft()[0][0] == C.RESET_DONE.index
    sink = Sink(_fast.TraceLog())
    rec = recorder_module.Recorder([sink])
    for i in range(5):
        with rec.scope(C.RESET_DONE, i), rec.scope(C.DR_RESET, 7):
            pass
    assert len(sink.trace_queue) == 2 and sink.calls == 3
    fields, lens = sink.trace_queue.take()
    assert len(sink.trace_queue) == 0 and array("q", lens).tolist() == [2, 2]
    got = array("q", fields).tolist()
    assert [got[f * RECORD_FIELDS:(f + 1) * RECORD_FIELDS][R_COUNT] for f in range(4)] == [
        0, 7, 1, 7]  # each trace's records, in order
    assert sink.trace_queue.take() == (b"", b"")
    agg = Aggregator(max_pending=10)
    assert isinstance(agg.trace_queue, _fast.TraceLog) and agg.trace_queue.limit == 10
    rec = recorder_module.Recorder([agg])
    for _ in range(25):  # past the limit: on_trace wakes the thread, drops past 10
        with rec.scope(C.RESET_DONE, 1):
            pass
    assert agg.stats()["reset_done_ms"].count + agg.dropped_traces == 25
    agg.shutdown()
    assert agg.trace_queue.limit == 0
    with rec.scope(C.RESET_DONE, 1):
        pass
    assert len(agg.trace_queue) == 0  # a shut-down aggregator keeps nothing


def test_scope_and_lap_take_their_arguments_by_keyword_too() -> None:
    """The C methods take what the Python ones take: ``scope(phase, count=, lap=)`` and
    ``lap(phase, count=)`` by keyword record what the positional calls record."""
    shapes = []
    for keywords in (False, True):
        rec = recorder_module.Recorder()
        with rec.scope(C.RESET_DONE, 3):
            if keywords:
                outer = rec.scope(phase=C.SET_STATE, count=2, lap=C.SET_STATE_MASK)
            else:
                outer = rec.scope(C.SET_STATE, 2, C.SET_STATE_MASK)
            with outer:
                if keywords:
                    outer.lap(C.SET_STATE_DATA_RESET, count=4)
                    outer.lap(phase=None)
                else:
                    outer.lap(C.SET_STATE_DATA_RESET, 4)
                    outer.lap(None)
        shapes.append([(C.CATALOG[r[0]].span, r[1], r[4]) for r in rec._last])
    assert shapes[0] == shapes[1] == [
        ("reset_done", -1, 3), ("set_state", 0, 2), ("set_state.mask", 1, -1),
        ("set_state.data_reset", 1, 4)]


def test_an_open_trace_holds_no_python_object_per_record() -> None:
    """Each record was a list of six ints (two of them new int objects) until its trace
    closed: ~4 Python objects per record, in both recorders. Records are now int64s in a
    block the recorder keeps across its traces: a trace of 5,000 scopes, recorded again
    (the block already grown), holds no more objects at its end than at its start; and
    what the sinks get is the same records."""
    got: list[Any] = []

    class Keep:
        def on_trace(self, records: Any, rec: Any) -> None:
            got.append([tuple(r) for r in records])

    rec = recorder_module.Recorder([Keep()])
    assert type(rec._records) is recorder_module.Records
    grown: list[int] = []
    for _ in range(2):
        with rec.scope(C.ENV_STEP):
            gc.collect()
            before = sys.getallocatedblocks()
            for i in range(5000):
                with rec.scope(C.DR_RESET, i):
                    pass
            grown.append(sys.getallocatedblocks() - before)
    assert grown[1] < 200, grown  # (a list per record: more than 10,000)
    assert len(got) == 2 and len(got[1]) == 5001
    assert [r[4] for r in got[1][1:]] == list(range(5000))
    assert all(r[1] == 0 and r[2] <= r[3] for r in got[1][1:])


@compiled_only
def test_a_closed_trace_is_published_to_the_aggregator_as_int64s_not_as_an_object() -> None:
    """A closing trace was copied into a new ``Trace`` object, queued for the aggregation
    thread (20,000 traces waiting: 20,000 objects, 17 MB, written cold). The aggregator's
    ``trace_queue`` is now a log of int64s the compiled recorder appends the trace to,
    and the recorder's last trace object is written again in place: 3,000 traces
    waiting hold a few blocks, not one each, and aggregate to every call; past the batch
    that wakes the thread, a trace costs no Python call while the thread is held up."""
    import tracemalloc

    from resettrace.tracing.aggregate import Aggregator

    agg = Aggregator(max_pending=10**6)
    agg._start_worker = lambda: None  # type: ignore[method-assign]  # (they wait)
    rec = recorder_module.Recorder([agg])

    def traces(n: int) -> None:
        for i in range(n):
            with rec.scope(C.RESET_DONE, i % 7 + 1), rec.scope(C.DR_RESET, 2):
                pass

    traces(100)  # (the blocks grown)
    agg.stats()
    calls = []
    take = agg.on_trace
    agg.on_trace = lambda *a: (calls.append(1), take(*a))  # type: ignore[method-assign]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        traces(3000)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(d.count_diff for d in after.compare_to(before, "lineno") if d.count_diff > 0)
    assert agg.pending() == 3000 and grown < 50, grown  # (an object each: over 3,000)
    # the thread held up: one call, the wake-up at the batch mark (was one per trace past it)
    assert len(calls) == 1
    st = agg.stats()
    assert st[C.RESET_DONE.key].count == 3100 and st[C.DR_RESET.key].count == 3100
    assert agg.stats()[C.RESET_DONE_COUNT].total_ms == sum(i % 7 + 1 for i in range(100)) + sum(
        i % 7 + 1 for i in range(3000))
    agg.shutdown()


@compiled_only
def test_a_trace_another_sink_holds_is_logged_by_reference_and_taken_in_order() -> None:
    """In ``trace`` mode the export sink's queue holds each trace object: the aggregator's
    log then keeps a reference to it rather than a second copy of its int64s (the
    recorder's own last trace, written again in place, is copied). Taken, the traces come
    out in order whichever way each was kept, and the references are let go."""
    from resettrace.tracing import _fast
    from resettrace.tracing.aggregate import Aggregator

    class Export:
        def __init__(self) -> None:
            self.trace_queue = _fast.TraceQueue()
            self.trace_queue.limit = 3

        def on_trace(self, records: Any, recorder: Any) -> None:
            pass  # (past its limit it keeps none: those traces are logged as copies)

    export, agg = Export(), Aggregator(max_pending=100)
    rec = recorder_module.Recorder([agg, export])
    for i in range(6):
        with rec.scope(C.RESET_DONE, i), rec.scope(C.DR_RESET, 10 + i):
            pass
    held = [export.trace_queue.popleft() for _ in range(3)]  # the first three
    assert [t[0][4] for t in held] == [0, 1, 2]
    refs = [sys.getrefcount(t) for t in held]
    first, lens_first = agg.trace_queue.take(2)  # a batch: the rest kept
    assert [sys.getrefcount(t) for t in held] == [r - (i < 2) for i, r in enumerate(refs)]
    assert len(agg.trace_queue) == 4
    fields, lens = agg.trace_queue.take()
    assert [sys.getrefcount(t) for t in held] == [r - 1 for r in refs]  # let go
    got = array("q", first + fields).tolist()
    assert array("q", lens_first + lens).tolist() == [2] * 6
    assert [got[j * RECORD_FIELDS + R_COUNT] for j in range(12)] == [
        x for i in range(6) for x in (i, 10 + i)]


def test_a_recorders_last_trace_is_reused_only_when_nothing_else_holds_it() -> None:
    """The next trace of the same length is written into the recorder's last trace object
    (no allocation per trace); one that code holds (a sink kept it, a test reads it) is
    never written again: the holder sees the trace it got."""
    rec = recorder_module.Recorder([])
    with rec.scope(C.DR_RESET, 1):
        pass
    first_id = id(rec._last)
    with rec.scope(C.DR_RESET, 2):
        pass
    if recorder_module.COMPILED:
        assert id(rec._last) == first_id  # written in place
    held = rec._last
    with rec.scope(C.DR_RESET, 3):
        pass
    assert held[0][4] == 2 and rec._last[0][4] == 3 and rec._last is not held
    with rec.scope(C.DR_RESET, 4), rec.scope(C.DR_RESET_PLAN):
        pass  # another length: a new object
    assert [r[4] for r in rec._last] == [4, -1] and held[0][4] == 2


def test_a_trace_past_thousands_of_records_gives_its_memory_back_when_it_closes() -> None:
    """The records' block is kept across traces, up to 4,096 records: a trace of 50,000
    scopes (a scope never exited, say) leaves no 2.4 MB block behind."""
    import tracemalloc

    rec = recorder_module.Recorder([])
    tracemalloc.start()
    try:
        with rec.scope(C.ENV_STEP):
            for _ in range(50_000):
                with rec.scope(C.DR_RESET, 1):
                    pass
            held = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            with rec.scope(C.ENV_STEP):
                pass
        rec._last = None  # (the trace handed over)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held - after > 2_000_000, (held, after)


# 150 phases (more than the C's table of remembered phases: entries collide and are
# replaced), each opened by its Phase and by a span name built at run time (equal, not the
# same object), with phases registered after the recorder was made; the records must be
# the pure-Python recorder's.
MANY_PHASES = r'''
import gc, json, weakref
from resettrace.catalog import Catalog
from resettrace.tracing.recorder import Recorder

cat = Catalog()
root = cat.register("job", parent=None)
early = [cat.register(f"job.p{i}", parent=root) for i in range(100)]
traces = []

class Keep:
    def on_trace(self, records, rec):
        traces.append([[cat[r[0]].span, r[1], r[4]] for r in records])

rec = Recorder([Keep()], catalog=cat)
late = [cat.register(f"job.q{i}", parent=root) for i in range(50)]
for rnd in range(3):
    with rec.scope(root):
        for i, p in enumerate(early + late):
            with rec.scope(p, i % 7):
                pass
            with rec.scope("".join(["job.", p.span[4:]]), rnd):
                pass
gone = weakref.ref(rec)
del rec
gc.collect()
print(json.dumps([traces, gone() is None]))
'''


def test_scopes_found_by_phase_identity_record_what_pure_python_does() -> None:
    """The compiled scope() remembers each phase object's scope in a table of 64 entries:
    colliding phases, span names equal but not identical, and phases registered after the
    recorder record as the pure-Python recorder does, and the table keeps no recorder
    alive (child processes: a crash fails here)."""
    got = _in_both_recorders(MANY_PHASES)
    traces, collected = got[0]
    assert collected and len(traces) == 3
    first = traces[0]
    assert len(first) == 1 + 2 * 150 and first[0] == ["job", -1, -1]
    assert first[1:5] == [["job.p0", 0, 0], ["job.p0", 0, 0], ["job.p1", 0, 1],
                          ["job.p1", 0, 0]]
    assert first[-2:] == [["job.q49", 0, 149 % 7], ["job.q49", 0, 0]]
    assert traces[2][-1] == ["job.q49", 0, 2]
