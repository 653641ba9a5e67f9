"""TimingSpanProcessor statistics on injected timestamps: exact expected numbers."""

from __future__ import annotations

import copy
import math
import random
from array import array
from typing import Any

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from helpers import FakeClock
from resettrace import catalog as C
from resettrace.tracing.layout import NO_COUNT, RECORD_FIELDS
from resettrace.tracing.processor import TimingSpanProcessor, percentile
from resettrace.tracing.recorder import Recorder

MS = 1_000_000  # ns




def test_percentile_matches_linear_interpolation() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(4.0 + 0.6 * 6.0)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 10.0
    assert percentile([7.0], 99) == 7.0


def _reset(rec: Recorder, clock: FakeClock, *, k: int, plan: int, ss: int, fk: int,
           mask: int, tail: int) -> None:
    """One reset_done trace with scripted durations in ms (set_state = mask + fk + gap)."""
    with rec.scope(C.RESET_DONE, k):
        with rec.scope(C.RESET_DONE_RESET_CALL):
            with rec.scope(C.DR_RESET, k):
                with rec.scope(C.DR_RESET_PLAN):
                    clock.now += plan * MS
                with rec.scope(C.SET_STATE, k) as outer:
                    with rec.scope(C.SET_STATE_MASK):
                        clock.now += mask * MS
                    with rec.scope(C.SET_STATE_FORWARD_KINEMATIC):
                        clock.now += fk * MS
                    clock.now += (ss - mask - fk) * MS
        clock.now += tail * MS
    timing = outer.timing()
    assert timing is not None
    assert list(timing) == list(C.SET_STATE_KEYS)
    assert timing["set_state_mask_ms"] == mask
    assert timing["set_state_forward_kinematic_ms"] == fk
    assert timing["set_state_internal_gap_ms"] == ss - mask - fk
    assert timing["set_state_data_reset_ms"] == 0.0


def test_recorder_traces_aggregate_to_exact_statistics(clock: FakeClock) -> None:
    # the built-in phases only, whatever other tests of this process registered (MotrixLab's
    # bridge adds set_state children to the process's catalog)
    cat = C.builtin_catalog()
    proc = TimingSpanProcessor(catalog=cat)
    rec = Recorder([proc], catalog=cat)
    # five resets: set_state 4, 6, 8, 10, 12 ms; fk 1..5 ms; mask 1 ms; plan 2 ms; tail 3 ms
    for i in range(5):
        _reset(rec, clock, k=10 + i, plan=2, ss=4 + 2 * i, fk=1 + i, mask=1, tail=3)
    st = proc.stats()

    ss = st[C.SET_STATE.key]
    assert ss.count == 5
    assert ss.mean_ms == 8.0 and ss.p50_ms == 8.0 and ss.max_ms == 12.0 and ss.total_ms == 40.0
    assert ss.p90_ms == pytest.approx(11.2) and ss.p99_ms == pytest.approx(11.92)
    fk = st["set_state_forward_kinematic_ms"]
    assert (fk.count, fk.mean_ms, fk.total_ms, fk.max_ms) == (5, 3.0, 15.0, 5.0)
    assert fk.share_of_parent == pytest.approx(15.0 / 40.0)
    gap = st["set_state_internal_gap_ms"]  # ss - mask - fk = 2, 3, 4, 5, 6
    assert gap.total_ms == 20.0 and gap.p50_ms == 4.0
    # every set_state key gets one sample per call, 0.0 where the phase did not run
    for key in C.SET_STATE_KEYS:
        assert st[key].count == 5
    assert st["set_state_data_reset_ms"].total_ms == 0.0
    # closed account one level up: dr_reset = plan + set_state + gap(0)
    assert st[C.DR_RESET.key].total_ms == 10.0 + 40.0
    assert st["dr_reset_internal_gap_ms"].total_ms == 0.0
    # reset_done = reset_call + tail (the tail is the reset_done gap)
    assert st["reset_done_internal_gap_ms"].total_ms == 15.0
    assert st[C.RESET_DONE.key].share_of_parent is None  # env_step never ran
    count = st[C.RESET_DONE_COUNT]
    assert count.count == 5 and count.mean_ms == 12.0 and count.max_ms == 14.0
    assert proc.samples()[C.SET_STATE.key] == [4.0, 6.0, 8.0, 10.0, 12.0]


def test_reservoir_keeps_exact_totals_beyond_max_samples(clock: FakeClock) -> None:
    proc = TimingSpanProcessor(max_samples=10)
    rec = Recorder([proc])
    for i in range(100):
        with rec.scope(C.PHYSICS):
            clock.now += (i + 1) * MS
    st = proc.stats()[C.PHYSICS.key]
    assert st.count == 100
    assert st.total_ms == sum(range(1, 101))
    assert st.max_ms == 100.0
    assert len(proc.samples()[C.PHYSICS.key]) == 10


def test_reservoir_stays_a_uniform_sample_of_a_long_run() -> None:
    """Far beyond the reservoir (a long training run), folded values still replace
    kept ones uniformly: every part of the run is represented by its share."""
    from resettrace.tracing.aggregate import _Series

    n, cap = 200_000, 2_000
    series = _Series(cap, random.Random(1))
    values = np.arange(n, dtype=np.float64)
    for chunk in np.array_split(values, 40):
        series.add_many(chunk)
    kept = np.array(series.samples)
    assert series.count == n and series.total == values.sum() and series.max == n - 1
    assert len(kept) == cap and len(set(kept.tolist())) == cap  # each value seen once
    # shares of the first half and of the last tenth: binomial, within 5 sigma
    assert abs((kept < n / 2).mean() - 0.5) < 5 * math.sqrt(0.25 / cap)
    assert abs((kept >= 0.9 * n).mean() - 0.1) < 5 * math.sqrt(0.09 / cap)
    assert abs(kept.mean() / n - 0.5) < 5 * math.sqrt(1 / 12 / cap)


def test_a_fold_past_the_reservoir_keeps_what_the_in_order_rule_keeps() -> None:
    """Past the reservoir, a block of values replaces the slots the rule draws for each
    value in order: a slot drawn twice keeps the later value, and series that have seen
    as many values share the fold's draws (the same places kept, each its own values)."""
    from resettrace.tracing.aggregate import _Draws, _Series

    cap, m = 50, 5_000  # a block far larger than the reservoir: slots repeat
    rng = random.Random(3)
    a, b = _Series(cap, rng), _Series(cap, rng)
    first = np.arange(2 * cap, dtype=np.float64)  # the reservoir full, and a first draw
    a.add_many(first)
    b.add_many(-first)
    seen, before = len(first), list(a.samples)
    b.samples[:] = [-v for v in before]  # (b: a's reservoir, negated; a view of it)
    gen = np.random.default_rng(11)
    state = copy.deepcopy(gen.bit_generator.state)
    draws = _Draws(gen)
    block = np.arange(seen, seen + m, dtype=np.float64)
    a.add_many(block, draws=draws)
    b.add_many(-block, draws=draws)
    # the rule, value by value, from the same uniform numbers
    gen.bit_generator.state = state
    u = gen.random(m)
    expected, replaced = before, 0
    for i, v in enumerate(block.tolist()):
        slot = int(u[i] * (seen + i + 1))
        if slot < cap:
            expected[slot] = v
            replaced += 1
    assert replaced > 2 * cap  # (slots drawn more than once)
    assert list(a.samples) == expected
    assert list(b.samples) == [-v for v in expected]
    assert a.count == b.count == seen + m and a.total == first.sum() + block.sum()


def test_processor_aggregates_sdk_spans_created_by_user_code() -> None:
    proc = TimingSpanProcessor(catalog=C.builtin_catalog())  # (see above)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    tracer = provider.get_tracer("user.code")
    t0 = 1_700_000_000 * 10**9
    for i, (outer, fk) in enumerate([(10, 4), (20, 6), (30, 14)]):
        start = t0 + i * 100 * MS
        parent = tracer.start_span(C.SET_STATE.span, start_time=start,
                                   attributes={C.ATTR_RESET_COUNT: 3})
        ctx = trace.set_span_in_context(parent)
        child = tracer.start_span(C.SET_STATE_FORWARD_KINEMATIC.span, context=ctx,
                                  start_time=start + MS)
        child.end(end_time=start + MS + fk * MS)
        parent.end(end_time=start + outer * MS)
        tracer.start_span("not.a.catalog.span", start_time=start).end(end_time=start + MS)
    st = proc.stats()
    assert st[C.SET_STATE.key].total_ms == 60.0 and st[C.SET_STATE.key].p50_ms == 20.0
    assert st["set_state_forward_kinematic_ms"].total_ms == 24.0
    assert st["set_state_internal_gap_ms"].total_ms == 36.0  # 6 + 14 + 16
    # every set_state key has one sample per call (0.0 for phases not run), and a span
    # name outside the catalog is aggregated under its derived key, and reported
    assert all(st[k].count == 3 for k in C.SET_STATE_KEYS)
    assert st["set_state_mask_ms"].total_ms == 0.0
    assert st["not_a_catalog_span_ms"].count == 3
    assert proc.unregistered_spans() == {"not.a.catalog.span": "not_a_catalog_span_ms"}
    assert len(st) == 16 + 2
    provider.shutdown()


def test_processor_skips_resettrace_own_materialised_spans() -> None:
    proc = TimingSpanProcessor()
    provider = TracerProvider()
    provider.add_span_processor(proc)
    tracer = provider.get_tracer(C.INSTRUMENTATION_SCOPE)
    tracer.start_span(C.SET_STATE.span, start_time=0).end(end_time=MS)
    assert proc.stats() == {}


def test_parent_keys_follow_the_catalog() -> None:
    parent_key = C.CATALOG.parent_key
    assert parent_key("set_state_internal_gap_ms") == C.SET_STATE.key
    assert parent_key("set_state_mask_ms") == C.SET_STATE.key
    assert parent_key(C.SET_STATE.key) == C.DR_RESET.key
    assert parent_key(C.ENV_STEP.key) is None
    assert parent_key("unknown") is None


def test_catalog_is_consistent() -> None:
    assert len(C.SET_STATE_KEYS) == 16 and C.SET_STATE_KEYS[-1] == "set_state_internal_gap_ms"
    assert len(set(C.ALL_KEYS)) == len(C.ALL_KEYS)
    for phase in C.PHASES:
        assert phase.key.endswith("_ms")
        assert phase.parent is None or phase.parent in C.BY_SPAN
    assert C.SET_STATE.key == "dr_reset_set_state_ms"


def test_traces_of_several_shapes_keep_arrival_order_and_exact_totals(clock: FakeClock) -> None:
    """Traces are folded in bulk per shape; samples still come out in arrival order,
    and count / total / max stay exact beyond the reservoir."""
    proc = TimingSpanProcessor(max_samples=1000)
    small = TimingSpanProcessor(max_samples=50)
    rec = Recorder([proc, small])
    expected = []
    for i in range(300):
        with rec.scope(C.ENV_STEP):
            clock.now += (i + 1) * MS
            if i % 3 == 0:  # another shape: a reset inside the step
                with rec.scope(C.RESET_DONE, i):
                    clock.now += MS
                expected.append(i + 2.0)
            else:
                expected.append(i + 1.0)
    st = proc.stats()
    env = st[C.ENV_STEP.key]
    assert env.count == 300 and env.total_ms == sum(expected) and env.max_ms == max(expected)
    assert proc.samples()[C.ENV_STEP.key] == expected  # every one, in arrival order
    few = small.stats()[C.ENV_STEP.key]
    assert few.count == 300 and few.total_ms == env.total_ms and few.max_ms == env.max_ms
    kept = small.samples()[C.ENV_STEP.key]
    assert len(kept) == 50 and set(kept) <= set(expected)
    assert st["reset_done_count"].count == 100
    assert st["reset_done_count"].total_ms == sum(range(0, 300, 3))
    assert st["env_step_other_ms"].total_ms == sum(expected) - 100.0


def test_a_closed_account_of_ones_own_is_one_catalog_flag(clock: FakeClock) -> None:
    """``closed=True`` makes a phase of one's own a closed account like ``set_state``'s:
    each call samples every registered child's key (0.0 when it did not run) and the gap,
    from recorder traces and SDK spans alike."""
    cat = C.CATALOG.copy()
    top = cat.register("my_reset", parent=None, gap_key="my_reset_gap_ms", closed=True)
    a = cat.register("my_reset.a", parent=top)
    cat.register("my_reset.b", parent=top)
    assert top.closed and not a.closed
    assert cat.timing_keys(top) == ("my_reset_a_ms", "my_reset_b_ms", "my_reset_gap_ms")
    with pytest.raises(ValueError, match="closed account needs a gap_key"):
        cat.register("my_other", parent=None, closed=True)
    with pytest.raises(ValueError, match="closed False"):
        cat.register("my_reset", parent=None, gap_key="my_reset_gap_ms")

    proc = TimingSpanProcessor(catalog=cat)
    rec = Recorder([proc], catalog=cat)
    for ms in (3, 5):
        with rec.scope(top):
            with rec.scope(a):
                clock.now += ms * MS
            clock.now += MS
    provider = TracerProvider()
    sdk = TimingSpanProcessor(catalog=cat)
    provider.add_span_processor(sdk)
    tracer = provider.get_tracer("user.code")
    parent = tracer.start_span("my_reset", start_time=0)
    child = tracer.start_span("my_reset.a", context=trace.set_span_in_context(parent),
                              start_time=MS)
    child.end(end_time=4 * MS)
    parent.end(end_time=5 * MS)
    for st, calls, a_ms, gap_ms in ((proc.stats(), 2, 8.0, 2.0), (sdk.stats(), 1, 3.0, 2.0)):
        assert {k: st[k].count for k in cat.timing_keys(top)} == dict.fromkeys(
            cat.timing_keys(top), calls)
        assert st["my_reset_a_ms"].total_ms == a_ms and st["my_reset_b_ms"].total_ms == 0.0
        assert st["my_reset_gap_ms"].total_ms == gap_ms
    assert rec.scope(top).timing() == {"my_reset_a_ms": 5.0, "my_reset_b_ms": 0.0,
                                       "my_reset_gap_ms": 1.0}
    provider.shutdown()


def test_one_fork_hook_resets_every_tracked_part_in_order() -> None:
    """Each part with per-process state tracks itself with the one at-fork hook
    (``tracing.lifecycle``); a forked child resets them in the order they were made, and
    an engine forked with traces queued counts only its own."""
    import os

    from resettrace.tracing import lifecycle
    from resettrace.tracing.aggregate import Aggregator

    order: list[str] = []

    class Part:
        def __init__(self, name: str) -> None:
            self.name = name
            lifecycle.track(self)

        def _after_fork_in_child(self) -> None:
            order.append(self.name)

    parts = [Part("first"), Part("second"), Part("third")]
    engine = Aggregator()
    rec = Recorder([engine])
    with rec.scope(C.ENV_STEP):
        pass
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once
        try:
            with rec.scope(C.ENV_STEP):
                pass
            seen = engine.stats()["env_step_total_ms"].count
            os.write(w, f"{','.join(order)};{seen}".encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1000).decode()
    os.waitpid(pid, 0)
    os.close(r)
    assert got == "first,second,third;1"
    assert engine.stats()["env_step_total_ms"].count == 1 and len(parts) == 3


_EXIT_SCRIPT = '''
import multiprocessing as mp
import os
import sys

from resettrace.tracing import lifecycle

LOG = sys.argv[1] if len(sys.argv) > 1 else os.environ["EXIT_LOG"]


def step(name):
    def run():
        with open(LOG, "a") as f:
            f.write(f"{os.getpid()} {name}\\n")
    return run


def fail():
    raise RuntimeError("a step that fails")


steps = {stage: step(stage) for stage in lifecycle.EXIT_STAGES}
for stage in reversed(list(lifecycle.EXIT_STAGES)):  # given in the reverse order
    lifecycle.at_exit(stage, steps[stage])
    lifecycle.at_exit(stage, steps[stage])  # twice: runs once
lifecycle.at_exit("spans", fail)


def work():
    assert lifecycle.arm_worker_exit()


if __name__ == "__main__":
    os.environ["EXIT_LOG"] = LOG
    assert not lifecycle.arm_worker_exit()  # not a worker: nothing armed
    for method in ("fork", "spawn"):
        p = mp.get_context(method).Process(target=work)
        p.start()
        p.join()
        assert p.exitcode == 0, p.exitcode
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()} main\\n")
'''


def test_one_exit_path_runs_its_stages_once_in_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Exit is one hook too: the main process runs every stage once, in the order of
    ``EXIT_STAGES`` whatever order they were given in, past a step that fails; a
    multiprocessing worker (fork or spawn; it leaves through ``os._exit``) runs the
    stages marked for workers, from multiprocessing's exit path."""
    import subprocess
    import sys

    from resettrace.tracing import lifecycle

    script = tmp_path / "exits.py"
    script.write_text(_EXIT_SCRIPT)
    log = tmp_path / "log"
    proc = subprocess.run([sys.executable, str(script), str(log)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("the spans step at exit failed") == 3  # each process, once
    lines = [line.split(" ", 1) for line in log.read_text().splitlines()]
    by_pid: dict[str, list[str]] = {}
    for pid, what in lines:
        by_pid.setdefault(pid, []).append(what)
    main = [p for p, w in by_pid.items() if "main" in w]
    assert len(main) == 1 and len(by_pid) == 3
    assert by_pid.pop(main[0]) == ["main", *lifecycle.EXIT_STAGES]
    workers = [s for s, in_workers in lifecycle.EXIT_STAGES.items() if in_workers]
    assert list(by_pid.values()) == [workers, workers]
    with pytest.raises(ValueError, match="unknown exit stage 'nope'"):
        lifecycle.at_exit("nope", lambda: None)


_UNSHUT_SCRIPT = '''
import sys
import numpy as np
import resettrace
from resettrace.config import Config
from resettrace.tracing import lifecycle
from resettrace.tracing.session import Tracing

t = Tracing(Config(mode="trace", exporters=("memory",)))
b = resettrace.make_backend("mujoco", num_envs=8, tracing=t, nthread=1)
q = np.tile(b.keyframe_qpos, (1, 1))
for i in range(10):
    b.set_state([i % 8], q, np.zeros((1, b.nv)))

def count() -> None:  # after the exit flush (the stage before this one)
    spans = t.exporters[0].get_finished_spans()
    print(sum(s.parent is None for s in spans), flush=True)

lifecycle.at_exit("run record", count)
'''


def test_a_session_left_open_builds_its_queued_spans_at_exit() -> None:
    """A session never shut down is flushed at exit: the traces still queued for its own
    SDK provider are built and exported then (the SDK's exit hook, which runs first,
    would shut the provider and refuse them, one warning per span)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _UNSHUT_SCRIPT], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "already shutdown" not in proc.stderr
    assert proc.stdout.split() == ["10"]


def test_a_full_aggregation_queue_drops_and_counts_traces_exactly(
        caplog: pytest.LogCaptureFixture) -> None:
    """Traces that come faster than the aggregation thread folds them used to queue without
    bound (1M traces: 526 MiB). The queue holds ``aggregate_queue`` traces at most; beyond
    it each trace is dropped and counted, in the session, its run record and at shutdown."""
    import logging

    from resettrace.config import Config
    from resettrace.record import record_of_session
    from resettrace.tracing.session import Tracing

    session = Tracing(Config.from_env({"RESETTRACE": "timing",
                                       "RESETTRACE_AGGREGATE_QUEUE": "1500"}))
    assert session.config.aggregate_queue == 1500
    agg = session.aggregator
    assert agg is not None
    rec = session.recorder()

    def traces(n: int) -> None:
        for _ in range(n):
            with rec.scope(C.DR_RESET, 2), rec.scope(C.DR_RESET_PLAN):
                pass

    traces(1024)  # the aggregation thread starts
    with agg.lock:  # and is held up: training outpaces it
        traces(10_000)
        assert agg.pending() == 1500  # memory stays bounded
    produced = 11_024
    aggregated = session.stats()[C.DR_RESET.key].count
    assert 1500 <= aggregated <= 1500 + 1024
    assert session.dropped_traces == produced - aggregated
    assert record_of_session(session).traces_dropped == produced - aggregated
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        session.shutdown()
    said = [r.getMessage() for r in caplog.records if "not aggregated" in r.getMessage()]
    assert len(said) == 1 and f"{produced - aggregated} traces" in said[0]


def test_a_bad_aggregation_queue_setting_is_replaced_by_the_default(
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from resettrace.config import Config

    with caplog.at_level(logging.WARNING):
        config = Config.from_env({"RESETTRACE_AGGREGATE_QUEUE": "0"})
    assert config.aggregate_queue == Config().aggregate_queue == 100_000
    assert sum("RESETTRACE_AGGREGATE_QUEUE" in r.getMessage() for r in caplog.records) == 1


def test_recorder_traces_aggregate_as_the_same_records_handed_over_one_by_one() -> None:
    """The recorders' traces are aggregated from the aggregator's log in a few numpy
    passes a batch (shapes told apart per length): the statistics, samples, distributions and
    cost-model sums are those of the same records handed over as tuples, which go record
    by record, for batches of one shape, of several shapes of one length, and of several
    lengths, nested recursion and counts included."""
    from resettrace.tracing.aggregate import Aggregator

    traces: list[Any] = []

    class Keep:
        def on_trace(self, records: Any, rec: Any) -> None:
            traces.append(records)

    rng = random.Random(5)
    rec = Recorder([Keep()])
    for i in range(3000):
        kind = rng.randrange(5)
        with rec.scope(C.ENV_STEP):
            if kind == 0:
                continue  # an env step that reset nothing
            with rec.scope(C.RESET_DONE, rng.randrange(1, 64)) as s:
                s.lap(C.RESET_DONE_TERMINAL_OBS if kind != 1 else C.RESET_DONE_RESET_CALL)
                s.lap(None)
                with rec.scope(C.DR_RESET, rng.randrange(1, 64)):
                    with rec.scope(C.SET_STATE, 3 if kind == 2 else NO_COUNT):
                        if kind == 3:
                            with rec.scope(C.SET_STATE):  # inside itself
                                pass
                        with rec.scope(C.SET_STATE_SET_DOF_POS):
                            pass
        if kind == 4 and i % 7 == 0:
            with rec.scope(C.SET_STATE, 2):  # a set_state on its own: another root
                pass
    assert len({len(t) for t in traces}) == 3  # 1, 6 (two shapes) and 7 records
    packed, one_by_one = Aggregator(max_pending=10**6), Aggregator(max_pending=10**6)
    packed._start_worker = lambda: None  # type: ignore[method-assign]  # (read by stats())
    for k in range(0, len(traces), 700):  # batches of several shapes and lengths
        for t in traces[k:k + 700]:
            packed.on_trace(t)  # (into its log)
        one_by_one._aggregate([[tuple(r) for r in t] for t in traces[k:k + 700]])
        packed.stats()
    one_shape = [t for t in traces if len(t) == len(traces[1]) and
                 [r[:2] for r in t] == [r[:2] for r in traces[1]]]
    for t in one_shape:
        packed.on_trace(t)
    one_by_one._aggregate([[tuple(r) for r in t] for t in one_shape])
    a, b = packed.stats(), one_by_one.stats()
    assert a.keys() == b.keys() and len(a) > 10
    for key in a:
        assert (a[key].count, a[key].max_ms) == (b[key].count, b[key].max_ms), key
        # (sums of floats, folded at other points: the batches differ)
        assert math.isclose(a[key].total_ms, b[key].total_ms, rel_tol=1e-12), key
        assert a[key].p50_ms == b[key].p50_ms and a[key].p99_ms == b[key].p99_ms, key
    assert packed.samples() == one_by_one.samples()
    assert {k: d.counts for k, d in packed.distributions().items()} == {
        k: d.counts for k, d in one_by_one.distributions().items()}
    assert packed.traces_seen == one_by_one.traces_seen == len(traces) + len(one_shape)
    assert packed.records_seen == one_by_one.records_seen
    fields = ("n", "sk", "skk", "sy", "sky", "syy", "kmin", "kmax")
    fits, others = packed.fit_sums(), one_by_one.fit_sums()
    assert fits and fits.keys() == others.keys()
    for key, fit in fits.items():  # (sums of floats: the order of folding may differ)
        for x in fields:
            assert math.isclose(getattr(fit, x), getattr(others[key], x), rel_tol=1e-12), (
                key, x)
    packed.shutdown()
    one_by_one.shutdown()
    fresh = Aggregator()  # (the packed path takes a batch of traces with records)
    fields = np.concatenate([np.frombuffer(t.data, dtype=np.int64) for t in traces[:50]])
    fields = fields.reshape(-1, RECORD_FIELDS)
    assert fresh._packed(fields, np.array([len(t) for t in traces[:50]]))
    fresh.shutdown()
    # through the aggregator's log (their int64s, taken in chunks): the same again, and so
    # for more shapes in one batch than the plans hold (300 lengths: record by record)
    rec = Recorder([Keep()])
    for depth in range(1, 301):
        with rec.scope(C.ENV_STEP):
            for _ in range(depth):
                with rec.scope(C.DR_RESET, depth):
                    pass
    many = traces[-300:]
    for batch in (traces + one_shape, many):
        logged, by_hand = Aggregator(max_pending=10**6), Aggregator(max_pending=10**6)
        logged._start_worker = by_hand._start_worker = lambda: None  # type: ignore
        for t in batch:
            logged.on_trace(t)
            by_hand.on_trace([tuple(r) for r in t])
        assert logged.pending() == len(batch) and len(logged.trace_queue) == len(batch)
        a, b = logged.stats(), by_hand.stats()
        assert a.keys() == b.keys()
        for key in a:
            assert (a[key].count, a[key].total_ms, a[key].max_ms, a[key].p50_ms) == (
                b[key].count, b[key].total_ms, b[key].max_ms, b[key].p50_ms), key
        assert logged.samples() == by_hand.samples()
        assert logged.traces_seen == by_hand.traces_seen == len(batch)
        assert logged.pending() == 0
        logged.shutdown()
        by_hand.shutdown()


def test_a_trace_log_hands_over_its_traces_in_order_a_batch_at_a_time() -> None:
    """The aggregator's log of int64s: ``take(most)`` gives the first traces (their fields
    one after another, each one's record count) and keeps the rest, whatever was appended
    between two takes, in both recorders; ``take()`` gives all, and the log keeps no
    trace it handed over."""
    from resettrace.tracing.recorder import TraceLog

    traces: list[Any] = []

    class Keep:
        def on_trace(self, records: Any, recorder: Any) -> None:
            traces.append(records)

    rec = Recorder([Keep()])
    for i in range(40):
        with rec.scope(C.ENV_STEP):
            for _ in range(i % 3):
                with rec.scope(C.DR_RESET, i):
                    pass
    log = TraceLog()
    got_fields, got_lens = array("q"), array("q")
    for k in range(0, 40, 7):  # appends and takes interleaved, the log growing between
        for t in traces[k:k + 7]:
            log.append(t)
        fields, lens = log.take(5)
        got_fields.frombytes(fields)
        got_lens.frombytes(lens)
        assert len(log) == min(k + 7, 40) - len(got_lens)
    fields, lens = log.take()
    got_fields.frombytes(fields)
    got_lens.frombytes(lens)
    assert len(log) == 0 and log.take() == (b"", b"")
    assert got_lens.tolist() == [len(t) for t in traces]
    assert got_fields.tolist() == [x for t in traces for r in t for x in r]


def test_a_keys_percentiles_are_read_without_sorting_every_sample_to_the_last_bit() -> None:
    """``stats()`` sorted each key's samples and made a float object of each (most of a
    read's cost: 1.3 us per 17-record trace for 20,000 traces); now the order statistics
    the percentiles read are partitioned out: the same values, bit for bit, as
    :func:`percentile` over the sorted samples."""
    from array import array

    from resettrace.tracing.aggregate import _exact_percentiles

    rng = np.random.default_rng(11)
    for n in (1, 2, 3, 7, 100, 1001, 20_000):
        for values in (rng.lognormal(-1, 1, n), np.round(rng.uniform(0, 3, n), 1)):
            got = _exact_percentiles(array("d", values.tolist()), (50, 90, 99, 0, 100, 33.3))
            ordered = sorted(values.tolist())
            assert got == [percentile(ordered, q) for q in (50, 90, 99, 0, 100, 33.3)], n
    assert all(math.isnan(v) for v in _exact_percentiles(array("d"), (50, 99)))
