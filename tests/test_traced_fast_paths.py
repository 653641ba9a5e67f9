"""``traced`` takes the common cases in C (``_fast.Traced``: a call, a leaf, a chain) and
routes the rest through the recorder's methods: both must record the same trees, counts,
errors and timing dicts."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import resettrace
from helpers import compiled_only
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.tracing.api import traced
from resettrace.tracing.layout import R_COUNT, R_ERROR, R_PARENT, R_PHASE
from resettrace.tracing.recorder import Recorder
from resettrace.tracing.session import Tracing


class _Routed(Recorder):
    """A recorder the compiled path leaves to the general one (it takes ``Recorder`` only)."""


def _shape(trace: list[list[int]]) -> list[tuple[str, int, int, int]]:
    return [(C.CATALOG[r[R_PHASE]].span, r[R_PARENT], r[R_COUNT], r[R_ERROR])
            for r in trace]


class Boom(RuntimeError):
    pass


leaf = traced("set_state.forward_kinematic", within="set_state")(math.sqrt)
data_reset = traced("set_state.data_reset", within="set_state")(math.floor)


@traced("set_state", count=1, parents=True)
def sub_reset(fail: bool = False) -> float:
    data_reset(2.5)
    if fail:
        raise Boom("reset failed")
    return leaf(16.0)


@traced("dr_reset", count="env_ids")
def dr_reset(env_ids: Any) -> None:
    sub_reset()


class Env:
    num_envs = 8

    @traced("env_step", env_count="self.num_envs")
    def step(self, resets: int, fail: bool = False) -> int:
        leaf(4.0)  # not inside set_state: not recorded
        for _ in range(resets):
            sub_reset()
        if fail:
            sub_reset(fail=True)
        return resets


def _scenarios() -> list[tuple[str, Callable[[], Any]]]:
    env = Env()
    return [
        ("step without a reset", lambda: env.step(0)),
        ("step with three resets", lambda: env.step(3)),
        ("a reset outside a step", lambda: sub_reset()),
        ("a count read from an argument", lambda: dr_reset(np.array([True, False, True]))),
        ("a count that is an int", lambda: dr_reset(5)),
        ("a reset that raises inside a step", lambda: env.step(1, fail=True)),
    ]


def _record(make: Callable[[], Recorder] | None) -> list[tuple[str, Any, dict[str, float]]]:
    """Each scenario's trace and the last set_state timing dict, with the session's own
    recorder (``make`` None: the fast paths) or a bound one of ``make()``."""
    out = []
    session = Tracing(Config(mode="timing"))
    try:
        with resettrace.use_tracing(session):
            rec = session.thread_recorder() if make is None else make()
            for name, run in _scenarios():
                with resettrace.bind(rec) if make is not None else _nothing():
                    try:
                        run()
                    except Boom:
                        pass
                out.append((name, _shape(rec._last),
                            rec.scope(C.SET_STATE).timing().keys()))
        stats = session.stats()
    finally:
        session.shutdown()
    out.append(("stats", {k: (v.count, v.total_ms > 0) for k, v in stats.items()}, {}))
    return out


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_fast_paths_record_what_the_general_routing_records() -> None:
    fast = _record(None)
    routed = _record(lambda: _Routed(resettrace.get_tracing().recorder()._sinks))
    for (name, a, ta), (_, b, tb) in zip(fast, routed, strict=True):
        assert a == b, name
        assert list(ta) == list(tb), name
    steps = dict((n, t) for n, t, _ in fast)
    # the tree of a step with resets: each reset reset_done down to set_state, count 1
    tree = steps["step with three resets"]
    assert tree[0] == ("env_step", -1, -1, 0)
    assert [s for s, *_ in tree[1:7]] == [
        "reset_done", "reset_done.reset_call", "dr_reset", "set_state",
        "set_state.data_reset", "set_state.forward_kinematic"]
    assert [p for _, p, _, _ in tree[1:7]] == [0, 1, 2, 3, 4, 4]
    assert len(tree) == 1 + 3 * 6
    assert steps["a count read from an argument"][0] == ("dr_reset", -1, 2, 0)
    assert steps["a count that is an int"][0] == ("dr_reset", -1, 5, 0)
    failed = steps["a reset that raises inside a step"]
    codes = {s: e for s, _, _, e in failed[7:]}
    assert codes["set_state"] and codes["reset_done"] and not codes["set_state.data_reset"]
    assert failed[0][3] != 0  # it left the step too
    # reset_done calls: three in a step, one outside, two in the failing step
    assert steps["stats"][C.RESET_DONE_COUNT] == (3 + 1 + 2, True)


def test_fast_paths_keep_each_thread_on_its_own_recorder() -> None:
    """A step on another thread records on that thread's recorder, whole."""
    session = Tracing(Config(mode="timing"))
    env = Env()
    try:
        with resettrace.use_tracing(session):
            env.step(1)
            done = []

            def other() -> None:
                with resettrace.use_tracing(session):
                    env.step(2)
                    done.append(_shape(session.thread_recorder()._last))

            t = threading.Thread(target=other)
            t.start()
            t.join()
            mine = _shape(session.thread_recorder()._last)
        assert len(mine) == 7 and len(done[0]) == 13
        assert session.stats()[C.RESET_DONE_COUNT].total_ms == 3
    finally:
        session.shutdown()


def test_fast_paths_off_run_the_function_and_record_nothing() -> None:
    session = Tracing(Config(mode="off"))
    try:
        with resettrace.use_tracing(session):
            assert Env().step(2) == 2
            assert sub_reset() == 4.0
        assert session.stats() == {}
    finally:
        session.shutdown()


@pytest.mark.parametrize("clock_step", [7])
def test_fast_chain_levels_share_one_clock_read_each_way(clock, clock_step: int) -> None:
    session = Tracing(Config(mode="timing"))
    try:
        with resettrace.use_tracing(session):
            @traced("env_step")
            def step() -> None:
                clock.now += clock_step
                sub_reset()

            step()
            trace = session.thread_recorder()._last
        levels = trace[1:5]
        assert len({(r[2], r[3]) for r in levels}) == 1
        timing = session.thread_recorder().scope(C.SET_STATE).timing()
        assert timing == pytest.approx({k: 0.0 for k in timing})
    finally:
        session.shutdown()


class _Inner:
    """A stand-in for MotrixLab's perf scope: counts its entries and exits."""

    def __init__(self) -> None:
        self.entered = self.exited = 0

    def __enter__(self) -> None:
        self.entered += 1

    def __exit__(self, *exc: object) -> None:
        self.exited += 1


@pytest.mark.parametrize("profiler_on", [True, False])
def test_motrixlab_bridge_records_its_scopes_and_their_errors_where_they_are_entered(
        profiler_on: bool) -> None:
    """The bridge's one-frame path (a scope in this thread's open trace) records what the
    general routing records. With MotrixLab's profiler off its scope is the shared
    disabled one, and the recorder's own scope is entered instead of both."""
    from resettrace.stacks import motrixlab

    inner = _Inner()
    bridged = motrixlab._bridging(lambda name: inner, None if profiler_on else inner)
    motrixlab._place(C.RESET_DONE, "done_mask")  # registered before the recorder is made
    # the process's first bridged scope of a phase takes the general routing, which finds
    # where it is placed for the one-frame path: done here, whichever test ran first
    scratch = Tracing(Config(mode="timing"))
    with resettrace.use_tracing(scratch):
        with scratch.thread_recorder().scope(C.RESET_DONE, 1), bridged("done_mask"):
            pass
    scratch.shutdown()
    inner.entered = inner.exited = 0
    session = Tracing(Config(mode="timing"))
    try:
        with resettrace.use_tracing(session):
            rec = session.thread_recorder()
            with rec.scope(C.RESET_DONE, 5):
                with bridged("done_mask"):
                    pass
                fast = bridged("done_mask")
                assert (fast.__class__ is motrixlab._Bridged) is profiler_on
                with fast:
                    pass
                with pytest.raises(Boom):
                    with bridged(name="done_mask"):
                        raise Boom("kernel failed")
                assert bridged("physics") is inner  # recorded by a target
            tree = _shape(rec._last)
            assert [s for s, *_ in tree] == ["reset_done"] + ["reset_done.done_mask"] * 3
            assert [p for _, p, _, _ in tree] == [-1, 0, 0, 0]
            assert tree[2][3] == 0 and tree[3][3] != 0  # the last one raised
            # made inside a trace, entered after it closed: a trace of its own
            with rec.scope(C.RESET_DONE, 2):
                late = bridged("done_mask")
            with late:
                pass
            assert [s for s, *_ in _shape(rec._last)] == ["reset_done.done_mask"]
            assert bridged("done_mask") is inner  # no trace open
            # entered beside the recorder's scope while MotrixLab's profiler is on
            assert inner.entered == inner.exited == (4 if profiler_on else 0)
        assert session.stats()["reset_done_done_mask_ms"].count == 4
    finally:
        session.shutdown()


class _DoneEnv:
    """``done`` is a property that runs traced code: the count reader of ``reset_done``."""

    mask = np.array([True, False, True, False])

    @traced("env_step.update_state")
    def compute_done(self) -> np.ndarray:
        return self.mask

    @property
    def done(self) -> np.ndarray:
        return self.compute_done()

    @traced("reset_done", count="self.done")
    def reset_done(self) -> None:
        self.terminal_obs()

    @traced("reset_done.terminal_obs")
    def terminal_obs(self) -> None:
        return None

    @traced("set_state", count="self.done", parents=True)
    def sub_reset(self) -> None:
        data_reset(2.5)

    @traced("env_step")
    def step(self, how: str) -> None:
        if how == "call":
            self.reset_done()
        else:
            self.sub_reset()


@pytest.mark.parametrize("how", ["call", "chain"])
def test_a_count_reader_that_runs_traced_code_leaves_the_scope_it_counts_whole(
        how: str) -> None:
    """``traced(count="self.done")`` where ``done`` calls a traced helper: the scope's
    position was taken before the count was read, so the helper's record took it; every
    ``reset_done_ms`` sample came out about -4.16 M ms, ``env_step_other_ms`` +4.16 M ms
    and the scopes inside filed under the helper. The count is read first."""
    session = Tracing(Config(mode="timing"))
    env = _DoneEnv()
    try:
        with resettrace.use_tracing(session):
            rec = session.thread_recorder()
            for _ in range(20):
                env.step(how)
                trace = rec._last
                for r in trace:
                    assert 0 < r[2] <= r[3], _shape(trace)  # opened and closed, in order
                assert _shape(trace) == {
                    "call": [("env_step", -1, -1, 0), ("env_step.update_state", 0, -1, 0),
                             ("reset_done", 0, 2, 0), ("reset_done.terminal_obs", 2, -1, 0)],
                    "chain": [("env_step", -1, -1, 0), ("env_step.update_state", 0, -1, 0),
                              ("reset_done", 0, 2, 0), ("reset_done.reset_call", 2, 2, 0),
                              ("dr_reset", 3, 2, 0), ("set_state", 4, 2, 0),
                              ("set_state.data_reset", 5, -1, 0)]}[how]
        st = session.stats()
        assert st["env_step_total_ms"].count == 20
        for key, s in st.items():
            if key.endswith("_ms"):
                assert s.max_ms >= s.p50_ms >= 0 and s.total_ms >= 0, key
                assert s.max_ms <= st["env_step_total_ms"].max_ms, key
    finally:
        session.shutdown()


@compiled_only
def test_a_traced_call_that_reads_the_env_count_stays_compiled_once_it_is_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A traced method with ``env_count`` sets the recorder's env count on its first call,
    then runs in C: the recorder's Python ``call`` is never reached again (its attributes
    are a dict subclass, read as a dict)."""
    calls: list[str] = []
    general = Recorder.call
    monkeypatch.setattr(Recorder, "call", lambda self, *a: (calls.append("call"),
                                                             general(self, *a))[1])

    class Env:
        num_envs = 12

        @traced("reset_done", count="mask", env_count="self.num_envs")
        def reset_done(self, mask: np.ndarray) -> int:
            return int(mask.sum())

    session = Tracing(Config(mode="timing"))
    env, mask = Env(), np.zeros(12, dtype=bool)
    mask[[1, 5]] = True
    with resettrace.use_tracing(session):
        rec = session.thread_recorder()
        for _ in range(5):
            with rec.scope(C.ENV_STEP):
                assert env.reset_done(mask) == 2
        assert rec.attributes[C.ATTR_ENV_COUNT] == 12
        assert len(calls) <= 1  # the first call sets the env count in Python
        assert rec._last[1][R_PHASE] == C.RESET_DONE.index and rec._last[1][R_COUNT] == 2
    session.shutdown()


@compiled_only
def test_a_traced_call_with_no_trace_open_stays_compiled_and_follows_the_default_session(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled core read the default session through its private attributes; it is
    now told each thread's default recorder, and forgets it when the default session
    changes: a root call runs in C after the first, records in the session that is the
    default at the time, and in none once that one is shut down."""
    calls: list[Any] = []
    general = Recorder.call
    monkeypatch.setattr(Recorder, "call", lambda self, *a: (calls.append(self),
                                                             general(self, *a))[1])

    @traced("reset_done", count="ids")
    def reset_done(ids: list[int]) -> int:
        return len(ids)

    a, b = Tracing(Config(mode="timing")), Tracing(Config(mode="timing"))
    with resettrace.use_tracing(a):
        for _ in range(50):
            assert reset_done([1, 2]) == 2
        assert len(calls) == 1  # the first: resolved in Python, then in C
        with resettrace.use_tracing(b):
            for _ in range(30):
                reset_done([1])
        for _ in range(20):
            reset_done([1, 2, 3])
        assert len(calls) <= 3  # (at most once after each change)
        assert a.stats()["reset_done_ms"].count == 70
        assert b.stats()["reset_done_ms"].count == 30
        assert a.stats()["reset_done_count"].total_ms == 50 * 2 + 20 * 3
        a.shutdown()
        for _ in range(30):
            assert reset_done([1]) == 1  # untraced: a shut-down session records nothing
        assert len(calls) <= 3
    b.shutdown()
