"""The public recording API on a user's own code: open catalog, scopes by name, bind,
traced, misuse that never raises, SDK spans, and phases exported by name.

Phases that would change the set_state timing dict are registered in a copy of the
catalog (``CATALOG.copy()``) handed to the session, so no other test sees them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

import resettrace
from helpers import FakeClock
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.tracing import recorder as recorder_module
from resettrace.tracing.layout import R_COUNT
from resettrace.tracing.session import Tracing

MS = 1_000_000




@pytest.fixture
def catalog() -> C.Catalog:
    return C.CATALOG.copy()


@pytest.fixture
def session(catalog: C.Catalog) -> Iterator[Tracing]:
    s = Tracing(Config(mode="timing"), catalog=catalog)
    yield s
    s.shutdown()
    assert s.aggregator is not None and s.processor is s.aggregator  # (its former name)
    s.aggregator.shutdown()


# -- the open catalog ------------------------------------------------------------------------
def test_register_phase_defaults_and_idempotence(catalog: C.Catalog) -> None:
    p = catalog.register("dr_reset.plan.terrain_sample", parent="dr_reset.plan")
    assert p.key == "dr_reset_plan_terrain_sample_ms" and p.parent == "dr_reset.plan"
    assert catalog.register("dr_reset.plan.terrain_sample", parent=C.DR_RESET_PLAN) is p
    assert catalog.resolve("dr_reset.plan.terrain_sample") is p
    assert catalog[p.index] is p and p.index == len(catalog) - 1
    # the built-ins are untouched, and the process catalog did not change
    assert C.CATALOG.get("dr_reset.plan.terrain_sample") is None


def test_register_phase_conflicts_name_the_problem(catalog: C.Catalog) -> None:
    catalog.register("user.phase", parent="env_step", key="user_ms")
    with pytest.raises(ValueError, match=r"already registered.*parent 'dr_reset'"):
        catalog.register("user.phase", parent="dr_reset", key="user_ms")
    with pytest.raises(ValueError, match=r"key 'user_ms' is already the timing key of phase "
                                         r"'user.phase'"):
        catalog.register("user.other", parent="env_step", key="user_ms")
    with pytest.raises(ValueError, match="set_state_mask_ms"):
        catalog.register("user.third", parent="env_step", key="set_state_mask_ms")
    with pytest.raises(ValueError, match=r"unknown phase 'set_stat'.*set_state"):
        catalog.register("user.fourth", parent="set_stat")
    with pytest.raises(ValueError, match="non-empty"):
        catalog.register("", parent="env_step")


BAD_TEXT = [("custom\udcff.phase", "lone surrogate '\\udcff' at index 6"),
            ("custom\n.phase", "control character '\\n' at index 6"),
            ("custom\x7f.phase", "control character '\\x7f'")]


@pytest.mark.parametrize(("text", "problem"), BAD_TEXT)
def test_register_phase_refuses_text_no_exporter_can_write(catalog: C.Catalog, text: str,
                                                           problem: str) -> None:
    """A span name, key or gap key with a lone surrogate (as ``os.fsdecode`` makes of
    undecodable bytes) or a control character is refused at registration: once in the
    catalog, every later trace failed to export."""
    size = len(catalog)
    for kwargs in ({"span": text}, {"span": "user.ok", "key": text},
                   {"span": "user.ok", "gap_key": text}):
        span = kwargs.pop("span")
        with pytest.raises(ValueError) as info:
            catalog.register(span, parent="dr_reset", **kwargs)
        assert problem in str(info.value) and repr(text) in str(info.value)
        str(info.value).encode("utf-8")  # the message itself prints anywhere
    assert len(catalog) == size
    with pytest.raises(ValueError, match="lone surrogate"):
        resettrace.register_phase("custom\udcff.phase", parent="dr_reset")
    assert C.CATALOG.get("custom\udcff.phase") is None


@pytest.mark.parametrize("mode", ["off", "timing"])
def test_attributes_no_exporter_can_write_are_refused_where_given(mode: str) -> None:
    session = Tracing(Config(mode=mode))
    cases = [({"attributes": {"mylab.note\udcff": 1}}, "key 'mylab.note\\udcff'"),
             ({"attributes": {"mylab.note": "a\udcffb"}}, "'mylab.note': its value"),
             ({"attributes": {"mylab.tags": ["ok", "b\x00"]}}, "'mylab.tags': its value"),
             ({"attributes": {"": 1}}, "key '' is empty"),
             ({"backend": "mylab\udcff"}, f"{C.ATTR_BACKEND!r}: its value"),
             ({"task": "walk\n"}, f"{C.ATTR_TASK!r}: its value")]
    for kwargs, named in cases:
        with pytest.raises(ValueError) as info:
            resettrace.recorder(tracing=session, **kwargs)
        assert named in str(info.value), kwargs
    rec = resettrace.recorder(tracing=session, backend="mylab", attributes={
        "mylab.note": "", "mylab.tags": ["a", "b"], "mylab.n": 3})  # an empty value is fine
    assert rec.enabled is (mode == "timing")
    with pytest.raises(ValueError, match=r"count 'env_ids\\udcff' has a lone surrogate"):
        resettrace.traced("dr_reset", count="env_ids\udcff")(lambda env_ids: None)
    with pytest.raises(ValueError, match=r"env_count 'self\\x1b' has a control character"):
        resettrace.traced("dr_reset", env_count="self\x1b")(lambda self: None)
    with pytest.raises(ValueError, match="unknown phase 'dr_reset\\\\udcff'"):
        resettrace.traced("dr_reset\udcff")
    session.shutdown()


def _exported_names(path: Path, kind: str) -> list[str]:
    if kind == "file":
        return [json.loads(line)["name"] for line in path.read_text().splitlines()]
    return [span["name"] for line in path.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
            for span in ss["spans"]]


@pytest.mark.parametrize("kind", ["file", "otlp-json"])
def test_a_refused_registration_leaves_trace_export_whole(tmp_path: Path, kind: str) -> None:
    """The reproducer: a surrogate phase name, once accepted, made every later trace fail
    to export (and ``shutdown()`` raise). Refused at registration, nothing is lost."""
    out = tmp_path / "spans.json"
    session = Tracing(Config(mode="trace", exporters=(f"{kind}:{out}",)))
    with pytest.raises(ValueError, match="lone surrogate"):
        resettrace.register_phase("custom\udcff.phase", parent="dr_reset")
    with pytest.raises(ValueError, match="lone surrogate"):
        session.recorder(backend="mylab", attributes={"mylab.run": "r\udcff"})
    rec = session.recorder(backend="mylab")
    for _ in range(40):
        with rec.scope(C.DR_RESET, 2):
            with rec.scope(C.DR_RESET_PLAN):
                pass
    session.shutdown()  # raised UnicodeEncodeError
    assert session.aggregator is not None
    session.aggregator.shutdown()
    names = _exported_names(out, kind)
    assert names.count("dr_reset") == 40 and names.count("dr_reset.plan") == 40
    report = session.export_report()
    assert report["spans_not_delivered"] == 0 and report["spans_dropped"] == 0


def test_process_catalog_register_phase_is_public() -> None:
    p = resettrace.register_phase("test_public_api.rollout", parent=None,
                                  description="a root phase of a test")
    assert resettrace.CATALOG.resolve("test_public_api.rollout") is p
    assert p.key in resettrace.CATALOG.all_keys()
    with pytest.raises(ValueError, match="description"):
        resettrace.register_phase("test_public_api.rollout", parent=None, description="other")


def test_registered_set_state_child_is_in_the_closed_timing_dict(
        session: Tracing, catalog: C.Catalog, clock: FakeClock) -> None:
    catalog.register("set_state.contact_cache_clear", parent="set_state")
    rec = resettrace.recorder(tracing=session, backend="mylab")
    with rec.scope("set_state", 3) as outer:  # a span name, as a user backend would
        with rec.scope("set_state.mask"):
            clock.now += 2 * MS
        with rec.scope("set_state.contact_cache_clear"):
            clock.now += 3 * MS
        clock.now += 1 * MS
    timing = outer.timing()
    # the canonical keys first, then registered children (other tests of the process may
    # have registered some in the catalog this one copies), this one last, then the gap
    keys = list(timing)
    assert keys[:len(C.SET_STATE_KEYS) - 1] == list(C.SET_STATE_KEYS[:-1])
    assert keys[-2:] == ["set_state_contact_cache_clear_ms", "set_state_internal_gap_ms"]
    assert timing["set_state_contact_cache_clear_ms"] == 3.0
    assert timing["set_state_mask_ms"] == 2.0 and timing["set_state_internal_gap_ms"] == 1.0
    assert sum(timing.values()) == 6.0
    st = session.stats()
    assert st["set_state_contact_cache_clear_ms"].total_ms == 3.0
    assert all(st[k].count == 1 for k in timing)


def test_a_child_registered_after_a_timing_dict_was_read_is_in_the_next(
        session: Tracing, catalog: C.Catalog, clock: FakeClock) -> None:
    """The scope's timing layout is made once and kept: a phase registered later (in the
    recorder's catalog) makes it anew."""
    rec = resettrace.recorder(tracing=session, backend="mylab")

    def run(lap: str | None) -> dict[str, float]:
        with rec.scope("set_state", 3, "set_state.mask") as outer:
            clock.now += 2 * MS
            if lap is not None:
                outer.lap(lap)
                clock.now += 3 * MS
        return outer.timing()

    first = run(None)
    assert "set_state_tile_clear_ms" not in first and first["set_state_mask_ms"] == 2.0
    catalog.register("set_state.tile_clear", parent="set_state")
    second = run("set_state.tile_clear")
    assert second["set_state_tile_clear_ms"] == 3.0 and second["set_state_mask_ms"] == 2.0
    assert list(second)[-2:] == ["set_state_tile_clear_ms", "set_state_internal_gap_ms"]
    assert sum(second.values()) == 5.0


def test_unknown_scope_name_lists_the_closest(session: Tracing) -> None:
    rec = resettrace.recorder(tracing=session)
    with pytest.raises(ValueError, match=r"unknown phase 'dr_reset.plann'.*dr_reset.plan"):
        rec.scope("dr_reset.plann")
    with pytest.raises(TypeError, match="Phase or a span name"):
        rec.scope(3)  # type: ignore[arg-type]


def test_phase_registered_after_the_recorder_was_made(session: Tracing,
                                                      catalog: C.Catalog) -> None:
    rec = resettrace.recorder(tracing=session)
    late = catalog.register("env_step.late_phase", parent="env_step")
    with rec.scope(C.ENV_STEP):
        with rec.scope(late):
            pass
    assert session.stats()["env_step_late_phase_ms"].count == 1


# -- misuse never raises, statistics stay right ---------------------------------------------
def test_unexpected_nesting_keeps_accounts_closed(session: Tracing, clock: FakeClock,
                                                  caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder_module, "_NOTED", set())  # surprises are logged once
    rec = resettrace.recorder(tracing=session)
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        with rec.scope(C.DR_RESET, 4) as dr:
            with rec.scope(C.DR_RESET_PLAN):
                clock.now += 1 * MS
            with rec.scope(C.SET_STATE_FORWARD_KINEMATIC):  # a set_state phase, misplaced
                clock.now += 5 * MS
    timing = dr.timing()
    assert timing["dr_reset_plan_ms"] == 1.0 and timing["dr_reset_internal_gap_ms"] == 5.0
    assert sum(timing.values()) == 6.0
    st = session.stats()
    assert st["set_state_forward_kinematic_ms"].total_ms == 5.0  # counted, not lost
    assert st["dr_reset_internal_gap_ms"].total_ms == 5.0
    assert "set_state.forward_kinematic" in caplog.text


def test_recursion_counts_the_outermost_call_once(session: Tracing, clock: FakeClock) -> None:
    rec = resettrace.recorder(tracing=session)
    with rec.scope(C.DR_RESET):
        with rec.scope(C.DR_RESET_PLAN):
            clock.now += 1 * MS
            with rec.scope(C.DR_RESET_PLAN):  # re-entered
                clock.now += 2 * MS
    st = session.stats()
    assert st["dr_reset_plan_ms"].count == 1 and st["dr_reset_plan_ms"].total_ms == 3.0
    assert st["dr_reset_total_ms"].total_ms == 3.0
    assert st["dr_reset_internal_gap_ms"].total_ms == 0.0


def test_scope_left_by_an_exception_and_unbalanced_exits(session: Tracing,
                                                         clock: FakeClock) -> None:
    rec = resettrace.recorder(tracing=session)
    for _ in range(2):
        with pytest.raises(KeyError), rec.scope(C.RESET_DONE, 2):
            with rec.scope(C.RESET_DONE_TERMINAL_OBS):
                clock.now += 1 * MS
                raise KeyError("user bug")
    scope = rec.scope(C.RESET_DONE_OBS_SCATTER)
    scope.__exit__(None, None, None)  # never entered: ignored
    st = session.stats()
    assert st["reset_done_ms"].count == 2 and st["reset_done_terminal_obs_ms"].total_ms == 2.0
    assert rec.scope(C.RESET_DONE).timing()["reset_done_terminal_obs_ms"] == 1.0


def test_a_recorder_used_from_two_threads_keeps_each_trace_whole(session: Tracing) -> None:
    rec = resettrace.recorder(tracing=session)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(200):
                with rec.scope(C.DR_RESET, 2):
                    with rec.scope(C.DR_RESET_PLAN):
                        pass
                    with rec.scope(C.SET_STATE, 2):
                        with rec.scope(C.SET_STATE_MASK):
                            pass
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    st = session.stats()
    assert st["dr_reset_total_ms"].count == 400
    assert st["set_state_mask_ms"].count == 400 and st["dr_reset_plan_ms"].count == 400
    assert all(st[k].count == 400 for k in C.SET_STATE_KEYS)
    # each account closes: a gap is never negative
    assert st["dr_reset_internal_gap_ms"].p50_ms >= 0.0


# -- laps: phases that follow one another, one call each ------------------------------------
class _CountingClock(FakeClock):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.now


def _spans(session: Tracing) -> dict[str, list]:
    assert session.force_flush()
    out: dict[str, list] = {}
    for s in session.exporters[0].get_finished_spans():
        out.setdefault(s.name, []).append(s)
    return out


def test_laps_are_back_to_back_children_on_one_clock_read_each(
        trace_session: Tracing) -> None:
    clock = _CountingClock()
    recorder_module.use_clock(clock)
    try:
        rec = resettrace.recorder(tracing=trace_session)
        with rec.scope(C.SET_STATE, 3, C.SET_STATE_QPOS_CONVERT) as outer:
            clock.now += 2 * MS
            outer.lap(C.SET_STATE_DATA_RESET)
            clock.now += 3 * MS
            with rec.scope(C.SET_STATE_RESET_RAND):  # a scope during a lap: its child
                clock.now += 1 * MS
            outer.lap(None)
            clock.now += 4 * MS  # in no phase: the gap
            with rec.scope(C.SET_STATE_SET_DOF_POS):  # after lap(None): a sibling
                clock.now += 5 * MS
            outer.lap("set_state.actuator_ctrl")  # by span name; runs to the end
            clock.now += 6 * MS
        # the outer scope and its first lap: 2 reads; a lap or lap(None): 1; a scope: 2
        assert clock.reads == 2 + 1 + 2 + 1 + 2 + 1
    finally:
        recorder_module.use_clock(None)
    t = outer.timing()
    assert t["set_state_qpos_convert_ms"] == 2.0
    assert t["set_state_data_reset_ms"] == 4.0  # its own 3 ms and its child's 1 ms
    assert t["set_state_reset_rand_ms"] == 0.0  # not a direct child of set_state
    assert t["set_state_set_dof_pos_ms"] == 5.0
    assert t["set_state_actuator_ctrl_ms"] == 6.0
    assert t["set_state_internal_gap_ms"] == 4.0
    assert sum(t.values()) == 21.0
    spans = _spans(trace_session)
    (root,) = spans[C.SET_STATE.span]
    (qc,) = spans[C.SET_STATE_QPOS_CONVERT.span]
    (reset,) = spans[C.SET_STATE_DATA_RESET.span]
    (rand,) = spans[C.SET_STATE_RESET_RAND.span]
    (ctrl,) = spans[C.SET_STATE_ACTUATOR_CTRL.span]
    for s in (qc, reset, spans[C.SET_STATE_SET_DOF_POS.span][0], ctrl):
        assert s.parent.span_id == root.context.span_id
    assert rand.parent.span_id == reset.context.span_id
    assert qc.start_time == root.start_time and qc.end_time == reset.start_time
    assert ctrl.end_time == root.end_time
    assert qc.attributes[C.ATTR_RESET_COUNT] == 3  # the parent's count


def test_a_lap_left_by_an_exception_carries_it_and_misplaced_laps_are_ignored(
        trace_session: Tracing, clock: FakeClock, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder_module, "_NOTED", set())
    rec = resettrace.recorder(tracing=trace_session)
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        with pytest.raises(KeyError), rec.scope(C.SET_STATE, 1) as outer:
            outer.lap(C.SET_STATE_DATA_RESET)
            clock.now += 1 * MS
            raise KeyError("engine")
        outer.lap(C.SET_STATE_ACTUATOR_CTRL)  # the scope is closed: ignored
        with rec.scope(C.DR_RESET) as dr:
            with rec.scope(C.DR_RESET_PLAN):
                dr.lap(C.DR_RESET_PAYLOAD_FILTER)  # not the innermost open scope: ignored
                clock.now += 1 * MS
    assert caplog.text.count("which is not open") == 1
    assert caplog.text.count("inside it is open") == 1
    assert dr.timing()["dr_reset_plan_ms"] == 1.0
    assert dr.timing()["dr_reset_payload_filter_ms"] == 0.0
    spans = _spans(trace_session)
    (reset,) = spans[C.SET_STATE_DATA_RESET.span]
    (root,) = spans[C.SET_STATE.span]
    assert not reset.status.is_ok and not root.status.is_ok
    assert "KeyError" in (reset.status.description or "")
    assert C.DR_RESET_PAYLOAD_FILTER.span not in spans
    assert C.SET_STATE_ACTUATOR_CTRL.span not in spans


def test_an_unwound_scope_ends_the_laps_inside_it(session: Tracing, clock: FakeClock
                                                  ) -> None:
    rec = resettrace.recorder(tracing=session)
    with rec.scope(C.DR_RESET) as dr:
        plan = rec.scope(C.DR_RESET_PLAN)
        plan.__enter__()
        with rec.scope(C.SET_STATE, 1) as outer:
            outer.lap(C.SET_STATE_DATA_RESET)
            clock.now += 1 * MS
            plan.__exit__(None, None, None)  # exits with set_state and its lap inside
        clock.now += 1 * MS
        dr.lap(C.DR_RESET_PAYLOAD_FILTER)  # the unwound laps are gone: this is dr_reset's own
        clock.now += 2 * MS
    t = dr.timing()
    assert t["dr_reset_plan_ms"] == 1.0 and t["dr_reset_payload_filter_ms"] == 2.0
    assert t["dr_reset_internal_gap_ms"] == 1.0


def test_laps_with_tracing_off_cost_one_call_and_still_catch_typos() -> None:
    off = recorder_module.NOOP_RECORDER
    with off.scope(C.SET_STATE, 1, C.SET_STATE_QPOS_CONVERT) as outer:
        assert outer.lap(C.SET_STATE_DATA_RESET) is None
        assert outer.lap(None) is None
        with pytest.raises(ValueError, match="set_state.data_reset"):
            outer.lap("set_state.data_rest")
    with pytest.raises(ValueError, match="set_state.data_reset"):
        off.scope(C.SET_STATE, 1, "set_state.data_rest")


# -- bind and current_recorder --------------------------------------------------------------
def test_bind_nests_objects_with_their_own_recorders_into_one_trace(session: Tracing) -> None:
    env_rec = resettrace.recorder(tracing=session, task="mine")
    backend_rec = resettrace.recorder(tracing=session, backend="mine")

    def set_state() -> None:
        rec = resettrace.current_recorder(backend_rec)
        with rec.scope(C.SET_STATE, 1):
            pass

    assert resettrace.current_recorder(backend_rec) is backend_rec  # nothing bound
    with resettrace.bind(env_rec):
        assert resettrace.current_recorder(backend_rec) is env_rec
        with env_rec.scope(C.DR_RESET):
            set_state()
        with resettrace.bind(backend_rec):
            assert resettrace.current_recorder() is backend_rec
        assert resettrace.current_recorder() is env_rec
    assert resettrace.current_recorder(backend_rec) is backend_rec
    assert session.aggregator is not None
    session.aggregator.force_flush()
    assert session.aggregator.traces_seen == 1  # set_state inside dr_reset, not apart
    with pytest.raises(TypeError):
        resettrace.bind("not a recorder")  # type: ignore[arg-type]


def test_scopes_on_another_recorder_join_the_open_trace(session: Tracing,
                                                        clock: FakeClock) -> None:
    """A user backend that times itself with its own recorder, called from code that
    is traced with another one (here: ``traced`` with the thread's default recorder)."""
    backend_rec = resettrace.recorder(tracing=session, backend="mine")

    class Backend:
        def set_state(self, ids: list[int]) -> dict[str, float]:
            with backend_rec.scope("set_state", len(ids)) as outer:
                with backend_rec.scope("set_state.forward_kinematic"):
                    clock.now += 2 * MS
            return outer.timing()

    @resettrace.traced("dr_reset", count="ids")
    def reset(ids: list[int]) -> dict[str, float]:
        clock.now += 1 * MS
        return Backend().set_state(ids)

    with resettrace.use_tracing(session):
        timing = reset([1, 2, 3])
        assert resettrace.current_recorder() is session.thread_recorder()
    assert timing["set_state_forward_kinematic_ms"] == 2.0
    assert session.aggregator is not None
    session.aggregator.force_flush()
    assert session.aggregator.traces_seen == 1
    st = session.stats()
    assert st["dr_reset_total_ms"].total_ms == 3.0
    assert st["dr_reset_internal_gap_ms"].total_ms == 1.0  # set_state is dr_reset's child
    # alone, the backend's recorder opens its own trace
    Backend().set_state([0])
    session.aggregator.force_flush()
    assert session.aggregator.traces_seen == 2


def test_current_recorder_defaults_to_the_sessions_thread_recorder(session: Tracing) -> None:
    with resettrace.use_tracing(session):
        main = resettrace.current_recorder()
        assert main is resettrace.current_recorder() and main.enabled
        other: list[object] = []
        t = threading.Thread(target=lambda: other.append(resettrace.current_recorder()))
        t.start()
        t.join()
        assert other[0] is not main
    off = Tracing(Config(mode="off"))
    with resettrace.use_tracing(off):
        assert resettrace.current_recorder() is resettrace.NOOP_RECORDER


def test_bundled_env_nests_a_backend_with_its_own_recorder(session: Tracing) -> None:
    env = resettrace.make_env("g1_walk_flat", num_envs=8, tracing=session, nthread=1)
    env.backend.recorder = resettrace.recorder(tracing=session, backend="separate")
    done = np.zeros(8, dtype=bool)
    done[[1, 5]] = True
    env.reset_done(done)
    env.close()
    assert session.aggregator is not None
    session.aggregator.force_flush()
    assert session.aggregator.traces_seen == 1
    st = session.stats()
    assert st["dr_reset_set_state_ms"].count == 1 and st["reset_done_count"].mean_ms == 2.0


# -- traced ---------------------------------------------------------------------------------
def test_traced_counts_and_nesting(session: Tracing) -> None:
    class MyEnv:
        def __init__(self) -> None:
            self.done = np.array([True, False, True, True])

        @resettrace.traced("reset_done", count="self.done")
        def reset_done(self) -> str:
            return self.dr_reset(np.flatnonzero(self.done))

        @resettrace.traced(C.DR_RESET, count="env_ids")
        def dr_reset(self, env_ids: np.ndarray) -> str:
            return set_state(env_ids, k=len(env_ids))

    @resettrace.traced("set_state", count=lambda env_ids, k: k - 1)
    def set_state(env_ids: np.ndarray, k: int) -> str:
        return "ok"

    with resettrace.use_tracing(session):
        assert MyEnv().reset_done() == "ok"
    st = session.stats()
    assert st["reset_done_count"].total_ms == 3.0
    assert st["dr_reset_total_ms"].count == 1 and st["dr_reset_set_state_ms"].count == 1
    count_of = resettrace.tracing.api.count_of
    assert count_of(np.int64(5)) == 5
    assert count_of([1, 2]) == 2
    assert count_of(7) == 7
    for _ in range(2):  # the first numpy array teaches it numpy's type; the same after
        assert count_of(np.array([True, False, True, True])) == 3  # a mask: its True
        assert count_of(np.arange(6)) == 6  # env ids: how many
        assert count_of(np.zeros((4, 3))) == 4
        assert count_of(np.array(9)) == 1  # a 0-d integer array: one env id
        assert count_of(np.array(True)) == 1


def test_traced_never_breaks_the_call(session: Tracing) -> None:
    @resettrace.traced("dr_reset", count="ids")
    def reset(ids: object) -> int:
        return 41 + 1

    with resettrace.use_tracing(session):
        assert reset(object()) == 42  # no len(): recorded without a count
    assert session.stats()["dr_reset_total_ms"].count == 1
    with pytest.raises(ValueError, match="unknown phase"):
        resettrace.traced("no.such.phase")
    with pytest.raises(ValueError, match="has no argument 'env_ids'"):
        resettrace.traced("dr_reset", count="env_ids")(lambda ids: None)


def test_traced_refuses_functions_whose_work_runs_after_the_call(session: Tracing) -> None:
    """A call of a generator or async function only creates the generator or coroutine:
    recorded, 50 ms of work read as microseconds. Refused at decoration, saying why."""
    def rollout(n: int) -> Iterator[int]:
        yield n

    async def fetch() -> int:
        return 1

    async def stream() -> Any:
        yield 1

    class Env:
        def frames(self) -> Iterator[int]:
            yield 1

    for fn, kind, across in ((rollout, "a generator function", "across yields"),
                             (fetch, "a coroutine function", "across awaits"),
                             (stream, "an async generator function", "yields and awaits"),
                             (Env.frames, "a generator function", "across yields")):
        with pytest.raises(TypeError) as info:
            resettrace.traced("dr_reset", count="n" if fn is rollout else None)(fn)
        message = str(info.value)
        assert f"traced() cannot record {__name__}.{fn.__qualname__}: it is {kind}" in message
        assert across in message and "mis-nest" in message
        assert "trace the code that consumes it, or a synchronous helper" in message
    with resettrace.use_tracing(session):  # what to do instead: trace the consumer
        @resettrace.traced("dr_reset")
        def consume() -> int:
            return sum(rollout(3))

        assert consume() == 3
    assert session.stats()["dr_reset_total_ms"].count == 1


def test_traced_refuses_wrapped_generator_and_async_functions() -> None:
    """A ``staticmethod`` or ``classmethod`` of an async function, and an object whose
    ``__call__`` is a generator or async function, make their generator or coroutine as
    the plain ones do: they were accepted and recorded as microseconds. Refused at
    decoration, with the same message; their synchronous twins still are not."""
    async def fetch() -> int:
        return 1

    def rollout() -> Iterator[int]:
        yield 1

    class Frames:
        def __call__(self) -> Iterator[int]:
            yield 1

    class Fetch:
        async def __call__(self) -> int:
            return 1

    class Plain:
        def __call__(self) -> int:
            return 1

    for fn, kind in ((staticmethod(fetch), "a staticmethod of a coroutine function"),
                     (classmethod(fetch), "a classmethod of a coroutine function"),
                     (staticmethod(rollout), "a staticmethod of a generator function"),
                     (Frames(), "an object whose __call__ is a generator function"),
                     (Fetch(), "an object whose __call__ is a coroutine function")):
        with pytest.raises(TypeError, match="mis-nest") as info:
            resettrace.traced("dr_reset")(fn)
        assert f"it is {kind}" in str(info.value)
    for fn in (staticmethod(lambda: 1), Plain()):
        resettrace.traced("dr_reset")(fn)  # accepted


def test_traced_off_records_nothing_and_returns_the_value() -> None:
    off = Tracing(Config(mode="off"))

    @resettrace.traced("dr_reset", count="ids")
    def reset(ids: list[int]) -> list[int]:
        return ids

    with resettrace.use_tracing(off):
        assert reset([1, 2]) == [1, 2]
    assert off.stats() == {}


# -- SDK spans from user code ----------------------------------------------------------------
def test_sdk_spans_aggregate_like_records_and_gaps_use_the_real_parent(
        catalog: C.Catalog) -> None:
    catalog.register("set_state.contact_cache_clear", parent="set_state")
    proc = resettrace.TimingSpanProcessor(catalog=catalog)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    tracer = provider.get_tracer("user")
    t0 = 1_700_000_000 * 10**9
    dr = tracer.start_span("dr_reset", start_time=t0)
    ctx = trace.set_span_in_context(dr)
    ss = tracer.start_span("set_state", context=ctx, start_time=t0)
    sctx = trace.set_span_in_context(ss)
    tracer.start_span("set_state.contact_cache_clear", context=sctx,
                      start_time=t0).end(end_time=t0 + 2 * MS)
    tracer.start_span("mylab.unregistered", context=sctx, start_time=t0).end(end_time=t0 + MS)
    ss.end(end_time=t0 + 5 * MS)
    # a set_state phase directly under dr_reset: its own key, and inside dr_reset's gap
    tracer.start_span("set_state.mask", context=ctx, start_time=t0 + 5 * MS).end(
        end_time=t0 + 6 * MS)
    dr.end(end_time=t0 + 8 * MS)
    st = proc.stats()
    assert st["set_state_contact_cache_clear_ms"].total_ms == 2.0
    assert st["set_state_internal_gap_ms"].total_ms == 3.0
    assert st["set_state_mask_ms"].count == 2  # 0.0 from set_state's account + the stray one
    assert st["set_state_mask_ms"].total_ms == 1.0
    assert st["dr_reset_internal_gap_ms"].total_ms == 3.0  # 8 - set_state 5
    assert st["mylab_unregistered_ms"].total_ms == 1.0
    assert proc.unregistered_spans() == {"mylab.unregistered": "mylab_unregistered_ms"}
    provider.shutdown()


# -- phases reach the export child by name ---------------------------------------------------
def test_phase_registered_after_the_session_started_exports(tmp_path: Path,
                                                            catalog: C.Catalog) -> None:
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{out}",)), catalog=catalog)
    rec = session.recorder(backend="mylab")
    with rec.scope(C.DR_RESET):
        pass
    late = catalog.register("dr_reset.terrain_sample", parent="dr_reset")
    for _ in range(3):
        with rec.scope(C.DR_RESET, 2):
            with rec.scope(late):
                pass
    session.shutdown()
    assert session.aggregator is not None
    session.aggregator.shutdown()
    names = [json.loads(line)["name"] for line in out.read_text().splitlines()]
    assert names.count("dr_reset.terrain_sample") == 3 and names.count("dr_reset") == 4
    assert session.export_report()["spans_not_delivered"] == 0


# -- house rules ---------------------------------------------------------------------------
def test_the_library_imports_neither_bench_nor_the_cli() -> None:
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import resettrace
        skip = ("resettrace.bench", "resettrace.cli", "resettrace.testing",
                "resettrace._run.sitecustomize")
        def walk(path, prefix):
            for m in pkgutil.iter_modules(path, prefix):
                if not m.name.startswith(skip):
                    module = importlib.import_module(m.name)
                    if m.ispkg:
                        walk(module.__path__, m.name + ".")
        walk(resettrace.__path__, "resettrace.")
        bad = sorted(m for m in sys.modules if m.startswith(skip))
        print(",".join(bad))
        print(len([m for m in sys.modules if m.startswith("resettrace.")]), file=sys.stderr)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PATH": "", "RESETTRACE": "off", "RUST_LOG": "error"})
    assert out.stdout.strip() == "" and int(out.stderr.split()[-1]) > 30


def test_the_contract_imports_no_backend() -> None:
    code = ("import sys, resettrace.sim.contract; "
            "print([m for m in sys.modules if m.startswith('resettrace.sim.backends')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PATH": "", "RESETTRACE": "off"})
    assert out.stdout.strip() == "[]"


# -- misuse found in review: each of these failed before its fix ----------------------------
def test_a_thread_with_a_copied_context_records_its_own_trace(session: Tracing) -> None:
    import contextvars

    rec = resettrace.recorder(tracing=session)
    errors: list[BaseException] = []

    def physics() -> None:
        try:
            with resettrace.current_recorder().scope(C.DR_RESET_PLAN):
                pass
        except BaseException as e:  # noqa: BLE001 (a RecursionError before the fix)
            errors.append(e)

    with resettrace.use_tracing(session), rec.scope(C.DR_RESET):
        ctx = contextvars.copy_context()  # as asyncio.to_thread does
        t = threading.Thread(target=ctx.run, args=(physics,))
        t.start()
        t.join()
    assert errors == []
    # the current recorder is per thread: the thread's scope is a trace of its own, on
    # the default session's recorder of that thread
    stats = session.stats()
    assert stats["dr_reset_plan_ms"].count == 1 and stats["dr_reset_total_ms"].count == 1


def test_a_second_exit_neither_ends_the_trace_early_nor_loses_it(session: Tracing,
                                                                 clock: FakeClock) -> None:
    rec = resettrace.recorder(tracing=session)
    with rec.scope(C.ENV_STEP):
        s = rec.scope(C.APPLY_ACTION)
        with s:
            clock.now += 1 * MS
        s.__exit__(None, None, None)  # again: ignored
        with rec.scope(C.UPDATE_STATE):
            clock.now += 2 * MS
        # an inner scope left open is closed with its parent
        rec.scope(C.PHYSICS).__enter__()
        clock.now += 4 * MS
    st = session.stats()
    assert session.aggregator is not None and session.aggregator.traces_seen == 1
    assert st["env_step_total_ms"].total_ms == 7.0 and st["physics_ms"].total_ms == 4.0
    assert st["env_step_other_ms"].total_ms == 0.0


@pytest.fixture
def max_records() -> Iterator[Callable[[int], int]]:
    """Sets the records a trace may hold (in Python and C) for one test."""
    old = recorder_module.MAX_TRACE_RECORDS
    yield recorder_module.set_max_trace_records
    recorder_module.set_max_trace_records(old)


def test_a_scope_never_exited_does_not_grow_the_trace_forever(
        session: Tracing, max_records: Callable[[int], int]) -> None:
    max_records(50)
    rec = resettrace.recorder(tracing=session)
    rec.scope(C.ENV_STEP).__enter__()  # never exited
    for _ in range(200):
        with rec.scope(C.APPLY_ACTION):
            pass
    assert len(rec._records) <= 50
    assert session.aggregator is not None
    session.aggregator.force_flush()
    assert session.aggregator.traces_seen >= 3


def test_an_env_with_the_noop_recorder_records_nothing_anywhere() -> None:
    default = Tracing(Config(mode="timing"))
    with resettrace.use_tracing(default):
        env = resettrace.make_env("g1_walk_flat", num_envs=8, nthread=1)
        env.use_recorder(resettrace.NOOP_RECORDER)
        env.reset_done(np.arange(8) % 2 == 0)
        env.step(np.zeros((8, env.action_dim)))
        env.close()
    assert default.stats() == {}
    default.shutdown()


def test_the_noop_recorder_refuses_unknown_names_too() -> None:
    with pytest.raises(ValueError, match="unknown phase 'set_stat'"):
        resettrace.NOOP_RECORDER.scope("set_stat")
    assert resettrace.NOOP_RECORDER.scope("set_state").timing() is None


def test_recursion_is_transparent_and_accounts_close(session: Tracing, clock: FakeClock) -> None:
    rec = resettrace.recorder(tracing=session)
    with rec.scope(C.SET_STATE, 2) as outer:
        clock.now += 1 * MS
        with rec.scope(C.SET_STATE):  # a backend calling itself
            with rec.scope(C.SET_STATE_MASK):
                clock.now += 2 * MS
    st = session.stats()
    assert outer.timing()["set_state_internal_gap_ms"] == 3.0  # the direct account
    assert st["set_state_mask_ms"].count == 1 and st["set_state_mask_ms"].total_ms == 2.0
    assert st["set_state_internal_gap_ms"].total_ms == 1.0
    assert st["dr_reset_set_state_ms"].count == 1 and st["dr_reset_set_state_ms"].total_ms == 3.0


def test_trace_shapes_and_open_sdk_parents_stay_bounded(session: Tracing) -> None:
    from resettrace.tracing import aggregate as aggregate_module

    rec = resettrace.recorder(tracing=session)
    for k in range(1, 400):  # 399 shapes
        with rec.scope(C.DR_RESET):
            for _ in range(k % 97 + 1):
                with rec.scope(C.DR_RESET_PLAN):
                    pass
            with rec.scope(C.SET_STATE):
                pass
    proc = session.aggregator
    assert proc is not None
    st = proc.stats()
    assert st["dr_reset_total_ms"].count == 399 and st["dr_reset_plan_ms"].count == sum(
        k % 97 + 1 for k in range(1, 400))
    assert len(proc._plans) <= aggregate_module._MAX_PLANS

    sdk = resettrace.TimingSpanProcessor()
    provider = TracerProvider()
    provider.add_span_processor(sdk)
    tracer = provider.get_tracer("user")
    train = tracer.start_span("my.training.loop")
    ctx = trace.set_span_in_context(train)
    for _ in range(500):
        tracer.start_span("reset_done", context=ctx).end()
    assert len(sdk._open_children) == 0  # nothing waits on a parent that closes no account
    train.end()
    assert sdk.stats()["reset_done_ms"].count == 500
    provider.shutdown()


def test_attributes_set_after_the_first_trace_reach_the_span_file(tmp_path: Path) -> None:
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{out}",)))
    rec = session.recorder()
    with rec.scope(C.ENV_STEP):
        pass
    rec.attributes[C.ATTR_ENV_COUNT] = 4096  # as traced(env_count=...) does
    with rec.scope(C.ENV_STEP):
        pass
    session.shutdown()
    assert session.aggregator is not None
    session.aggregator.shutdown()
    spans = [json.loads(line) for line in out.read_text().splitlines()]
    assert [s["attributes"].get(C.ATTR_ENV_COUNT) for s in spans] == [None, 4096]


def test_parents_open_and_close_together_and_survive_misuse(
        session: Tracing, clock: FakeClock, max_records: Callable[[int], int]) -> None:
    """``parents`` opens its levels at one clock read and closes them at one: they share
    their times, an exception marks every level, a scope left open inside is closed with
    them, and a trace that overflows inside one is cut, never grown."""
    rec = session.thread_recorder()
    assert isinstance(rec, recorder_module.Recorder)
    inner: list[str] = []

    @resettrace.traced("set_state", count=1, parents=True)
    def reset(fail: bool = False, leave_open: bool = False, flood: int = 0) -> str:
        clock.now += 2 * MS
        with rec.scope(C.SET_STATE_DATA_RESET):
            clock.now += 1 * MS
        if leave_open:
            rec.scope(C.SET_STATE_FORWARD_KINEMATIC).__enter__()
            clock.now += 1 * MS
        for _ in range(flood):
            with rec.scope(C.SET_STATE_DATA_RESET):
                pass
        if fail:
            raise KeyError("user bug")
        inner.append("ran")
        return "ok"

    kept: list[list[list[int]]] = []

    class Keep:
        def on_trace(self, records: Any, recorder: Any) -> None:
            kept.append([list(r) for r in records])

    rec._sinks = (*rec._sinks, Keep())
    with resettrace.use_tracing(session):
        assert reset() == "ok"
        (trace,) = kept
        names = [session.catalog[r[0]].span for r in trace]
        assert names == ["reset_done", "reset_done.reset_call", "dr_reset", "set_state",
                         "set_state.data_reset"]
        assert {(r[2], r[3]) for r in trace[:4]} == {(0, 3 * MS)}  # one read each way
        assert [r[1] for r in trace] == [-1, 0, 1, 2, 3] and {r[4] for r in trace[:4]} == {1}
        timing = rec.scope(C.SET_STATE).timing()
        assert timing["set_state_data_reset_ms"] == 1.0 and timing[C.SET_STATE.gap_key] == 2.0

        with pytest.raises(KeyError):
            reset(fail=True)
        assert [r[5] > 0 for r in kept[1]] == [True, True, True, True, False]

        assert reset(leave_open=True) == "ok"
        assert len(kept[2]) == 6 and kept[2][5][3] == kept[2][0][3]  # closed with them

        with rec.scope(C.ENV_STEP):  # under an open phase: the missing levels only
            reset()
        assert [session.catalog[r[0]].span for r in kept[3]][:5] == [
            "env_step", "reset_done", "reset_done.reset_call", "dr_reset", "set_state"]

        max_records(20)
        assert reset(flood=50) == "ok"
        assert max(len(t) for t in kept) <= 20 and not rec._stack
        assert recorder_module.CURRENT.get() is None
        assert reset() == "ok" and [len(t) for t in kept][-1] == 5
    st = session.stats()
    assert st["reset_done_ms"].count == len(inner) + 1 and inner.count("ran") == len(inner)


def test_an_extension_function_is_recorded_in_place_and_adopts_what_it_calls_back(
        session: Tracing, clock: FakeClock) -> None:
    """A traced built-in (an engine's ``mj_forward``) takes no turn on the stack; a Python
    callback it runs that opens scopes (an engine's control callback) still nests them
    under its record, and an exception it raises is recorded on it."""
    rec = session.thread_recorder()
    assert isinstance(rec, recorder_module.Recorder)

    @resettrace.traced(C.SET_STATE_DATA_RESET)
    def callback(x: int) -> int:
        clock.now += 1 * MS
        return -x

    forward = resettrace.traced(C.SET_STATE_FORWARD_KINEMATIC, within="set_state")(sorted)
    assert forward([3, 1]) == [1, 3]  # outside set_state: not recorded, not broken
    kept: list[list[list[int]]] = []

    class Keep:
        def on_trace(self, records: Any, recorder: Any) -> None:
            kept.append([list(r) for r in records])

    rec._sinks = (*rec._sinks, Keep())
    with resettrace.use_tracing(session), rec.scope(C.SET_STATE, 2):
        clock.now += 1 * MS
        assert forward([1, 2, 3], key=callback) == [3, 2, 1]
        with pytest.raises(TypeError):
            forward([1, "a"])
    (trace,) = kept
    names = [session.catalog[r[0]].span for r in trace]
    assert names == ["set_state", "set_state.forward_kinematic", "set_state.data_reset",
                     "set_state.data_reset", "set_state.data_reset",
                     "set_state.forward_kinematic"]
    assert [r[1] for r in trace] == [-1, 0, 1, 1, 1, 0]  # the callbacks under the call
    assert trace[1][3] - trace[1][2] == 3 * MS and trace[1][5] == 0
    assert trace[5][5] > 0  # the TypeError
    timing = rec.scope(C.SET_STATE).timing()
    assert timing["set_state_forward_kinematic_ms"] == 3.0
    assert timing[C.SET_STATE.gap_key] == 1.0


def test_counts_are_read_by_one_rule(session: Tracing) -> None:
    """Every entry point reads a count by ``count_of``: a record holds an int, and a
    value that is no count is left out (-1), never raised and never stored."""
    count_of = resettrace.tracing.api.count_of
    cases: list[tuple[Any, int]] = [
        (7, 7), (0, 0), (np.int64(3), 3), (np.array(9), 1), (np.uint8(4), 4),
        (True, 1), (np.bool_(False), 0), (np.array(True), 1),
        (np.array([True, False, True]), 2), (np.zeros((2, 3), bool), 0), (np.arange(6), 6),
        ([4, 5], 2), ((1,), 1), (range(3), 3),
        (-1, -1), (-5, -1), (2**63, -1), (10**400, -1), (np.uint64(2**64 - 1), -1),
        (2.0, -1), (np.float32(2.0), -1), (np.array(2.5), -1), (None, -1), ("abc", -1),
        (b"ab", -1), ({1: 2}, -1), (object(), -1)]
    for value, want in cases:
        got = count_of(value)
        assert got == want and type(got) is int, value
    rec = session.thread_recorder()
    with resettrace.use_tracing(session):
        for k in (2, np.int64(3), 4.0, np.array([True, True]), None):
            with rec.scope(C.RESET_DONE, k):  # type: ignore[arg-type]
                pass
            assert type(rec._last[0][R_COUNT]) is int
    st = session.stats()
    assert st["reset_done_count"].total_ms == 7.0 and st["reset_done_ms"].count == 5
    with pytest.raises(ValueError, match="beyond int64"):
        resettrace.traced("dr_reset", count=2**63)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*63\), got -2"):
        resettrace.traced("dr_reset", count=-2)


#: counts that are no count, or not an int (each beside a good trace): a bool mask (the
#: ``done`` of a reset), None, a string, a list of ids, floats, ints beyond int64
BAD_COUNTS: list[tuple[Any, int]] = [
    (np.array([True, False, True]), 2), (None, -1), ("abc", -1), ([1, 2, 3], 3), (2.5, -1),
    (np.float32(2.0), -1), (np.uint64(2**64 - 1), -1), (2**63, -1), (10**400, -1)]


@pytest.mark.parametrize("mode", ["timing", "trace"])
def test_a_bad_count_costs_no_step_and_no_trace(tmp_path: Path, mode: str) -> None:
    """A bool mask as a count killed the aggregation (``stats()`` raised, every later step
    lost); in trace mode a count outside int64 lost its whole batch of traces, and
    ``shutdown()`` raised. Each entry point now records an int, whatever it is given."""
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode=mode, exporters=(f"file:{out}",) if mode == "trace"
                             else ()))
    rec = session.recorder()

    @resettrace.traced(C.DR_RESET, count="ids")
    def dr_reset(ids: Any) -> None:
        return None

    steps, total = 0, 0
    with resettrace.use_tracing(session):
        for _ in range(3):
            for bad, want in BAD_COUNTS:
                for value, k in ((bad, want), (3, 3)):  # a good trace beside each bad one
                    with rec.scope(C.ENV_STEP):
                        with rec.scope(C.RESET_DONE, value) as s:
                            s.lap(C.RESET_DONE_TERMINAL_OBS, value)
                            s.lap(C.RESET_DONE_RESET_CALL, value)
                            dr_reset(value)
                            s.lap(C.RESET_DONE_OBS_SCATTER)
                            with rec.scope(C.SET_STATE) as inner:
                                inner.set_count(value)
                                inner.count = value
                            s.lap(None)
                    last = rec._last
                    assert all(type(r[R_COUNT]) is int for r in last), value
                    assert [r[R_COUNT] for r in last] == [-1, k, k, k, k, -1, k], value
                    steps += 1
                    total += max(k, 0)
    st = session.stats()  # raised IndexError
    assert st["env_step_total_ms"].count == steps == 54
    assert st["reset_done_count"].total_ms == total
    session.shutdown()  # raised struct.error
    if mode == "trace":
        spans = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(spans) == 7 * steps
        counts = [x["attributes"].get(C.ATTR_RESET_COUNT) for x in spans
                  if x["name"] == C.RESET_DONE.span]
        assert sorted(c for c in counts if c is not None) == sorted(
            k for _ in range(3) for _, want in BAD_COUNTS for k in (want, 3) if k >= 0)
        assert session.export_report()["spans_dropped"] == 0


def test_a_record_that_is_not_ints_costs_no_other_trace(tmp_path: Path) -> None:
    """Behind the recorders (which store ints only): a trace whose record holds something
    else reaches the sinks; the aggregation and the span packer lose that trace at most."""
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{out}",)))
    rec = session.recorder()
    assert session.aggregator is not None and session.process is not None
    for i in range(40):
        with rec.scope(C.ENV_STEP):
            with rec.scope(C.RESET_DONE, 2):
                pass
        if i % 10 == 5:
            bad = [list(r) for r in rec._last]
            bad[1][R_COUNT] = [np.array([True, False]), 2.5, 2**63, 10**400][i // 10]
            session.aggregator.on_trace(bad)
            session.process.on_trace(bad, rec)
    st = session.stats()
    assert st["env_step_total_ms"].count == 44  # the bad ones aggregate, without a count
    assert st["reset_done_count"].count == 40
    session.shutdown()
    spans = out.read_text().splitlines()
    assert len(spans) == 80 and session.export_report()["spans_dropped"] == 4 * 2


def test_attribute_values_are_carried_as_opentelemetry_types_or_refused_at_the_call(
        tmp_path: Path) -> None:
    """``recorder(attributes={"seed": np.int64(7)})`` left the recorder unregistered in the
    export process: 0 of 50 spans written. numpy values become Python ones; a value
    OpenTelemetry cannot carry is refused where it is given, naming its key."""
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{out}",),
                             resource_attributes={"mylab.node": np.int64(3)}))
    rec = session.recorder(backend="mylab", attributes={
        "mylab.seed": np.int64(7), "mylab.scale": np.float32(0.5), "mylab.flag": np.bool_(True),
        "mylab.ids": [np.int64(1), 2], "mylab.names": ("a", np.str_("b")),
        "mylab.w": np.arange(3), "mylab.ok": 1.5})
    assert rec.enabled
    carried = {k: v for k, v in rec.attributes.items() if k.startswith("mylab.")}
    assert carried == {"mylab.seed": 7, "mylab.scale": 0.5, "mylab.flag": True,
                       "mylab.ids": [1, 2], "mylab.names": ("a", "b"), "mylab.w": [0, 1, 2],
                       "mylab.ok": 1.5}
    assert [type(v) for v in carried.values()] == [int, float, bool, list, tuple, list, float]
    assert type(carried["mylab.ids"][0]) is int and type(carried["mylab.names"][1]) is str
    for i in range(50):
        if i == 25:  # set on the recorder later: what can be carried is, the rest left out
            rec.attributes["mylab.late"] = np.int64(5)
            rec.attributes["mylab.junk"] = object()
        with rec.scope(C.ENV_STEP):
            pass
    bad: list[tuple[dict[Any, Any], str]] = [
        ({"mylab.raw": b"x"}, "'mylab.raw'"), ({"mylab.set": {1, 2}}, "'mylab.set'"),
        ({"mylab.obj": object()}, "'mylab.obj'"), ({"mylab.mixed": [1, "a"]}, "'mylab.mixed'"),
        ({"mylab.mixed2": [1, True]}, "'mylab.mixed2'"), ({"mylab.none": None}, "'mylab.none'"),
        ({"mylab.nested": [[1]]}, "'mylab.nested'"), ({3: 1}, "key 3"),
        ({"mylab.big": 2**63}, "'mylab.big'"), ({"mylab.m": np.zeros((2, 2))}, "'mylab.m'"),
        ({"mylab.c": np.complex64(1)}, "'mylab.c'")]
    off = Tracing(Config(mode="off"))
    for attributes, named in bad:
        for where in (session, off):
            with pytest.raises((TypeError, ValueError)) as info:
                where.recorder(attributes=attributes)
            assert named in str(info.value) and "\n" not in str(info.value), attributes
        with pytest.raises((TypeError, ValueError), match=named):
            Config(mode="off", resource_attributes=attributes)
    session.shutdown()
    spans = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(spans) == 50  # was 0
    first, last = spans[0], spans[-1]
    assert {k: v for k, v in first["attributes"].items() if k.startswith("mylab.")} == {
        "mylab.seed": 7, "mylab.scale": 0.5, "mylab.flag": True, "mylab.ids": [1, 2],
        "mylab.names": ["a", "b"], "mylab.w": [0, 1, 2], "mylab.ok": 1.5}
    node = session.resource_attributes()["mylab.node"]  # what the export process was sent
    assert node == 3 and type(node) is int
    assert last["attributes"]["mylab.late"] == 5 and "mylab.junk" not in last["attributes"]
    assert session.export_report()["spans_not_delivered"] == 0


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_torch_and_numpy_count_alike(device: str, caplog: pytest.LogCaptureFixture,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule for torch tensors and numpy arrays: index tensors by length, masks by their
    True values, a 0-d id (``nonzero().squeeze()`` of one reset) as one env, never its
    value. On an accelerator (the ``meta`` device: shapes, no data, so any read of a value
    raises) nothing is read: ids count by length, and a mask is no count rather than a wait
    for the device."""
    torch = pytest.importorskip("torch")  # (the stacks extra: make test installs it)
    count_of = resettrace.tracing.api.count_of
    ids = torch.tensor([0, 4, 9], device=device)
    mask = torch.tensor([True, False, True, True], device=device)
    one = torch.tensor([False] * 4 + [True], device=device).nonzero().squeeze() \
        if device == "cpu" else torch.tensor(4, device=device)
    assert one.ndim == 0
    cases = [(ids, 3), (one, 1), (torch.zeros((5, 2), dtype=torch.int32, device=device), 5),
             (torch.tensor(2.0, device=device), -1)]
    cases += ([(mask, 3), (torch.tensor(True), 1), (torch.tensor(7, dtype=torch.uint8), 1)]
              if device == "cpu" else [(mask, -1)])
    numpy_alike = {3: np.array([0, 4, 9]), 1: np.array(4)}
    monkeypatch.setattr(recorder_module, "_NOTED", set())  # surprises are logged once
    caplog.set_level(logging.WARNING, logger="resettrace")
    for value, want in cases:
        got = count_of(value)
        assert got == want and type(got) is int, value
        if want in numpy_alike and value.dtype != torch.bool:
            assert count_of(numpy_alike[want]) == got
    # the choice a 0-d integer forces is said (torch's mask.sum() is one too)
    assert "a count of a 0-d integer Tensor is read as one env id" in caplog.text
    if device == "meta":
        assert "a bool mask on meta that cannot be counted there (counting it here would " \
            "wait for the device" in caplog.text
        assert "env counts live on meta: resettrace's spans time the host" in caplog.text
        assert "meta" in recorder_module.DEVICES  # (its run record lists it)
        pid = os.fork()  # a forked child counts on its own devices: none yet
        if pid == 0:
            os._exit(0 if not recorder_module.DEVICES else 3)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_none_and_the_full_slice_count_every_env(session: Tracing,
                                                 caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``env_ids=None`` or ``slice(None)`` (mjlab's and Isaac Lab's "every env") counts the
    env count: the target's ``env_count`` (a 0-d tensor there is its value: an env count is
    never an id), else the recorder's attribute; without either, no count and one warning,
    never 0 or a guess."""
    torch = pytest.importorskip("torch")  # (the stacks extra: make test installs it)
    monkeypatch.setattr(recorder_module, "_NOTED", set())  # surprises are logged once

    class Env:
        num_envs = torch.tensor(6)

        @resettrace.traced("reset_done", count="env_ids", env_count="self.num_envs")
        def reset(self, env_ids: object = None) -> None:
            self.apply(env_ids)

        @resettrace.traced("dr_reset", count="env_ids")
        def apply(self, env_ids: object) -> None:
            pass

    @resettrace.traced("set_state", count="env_ids")
    def alone(env_ids: object) -> None:
        pass

    env = Env()
    rec = session.thread_recorder()
    with resettrace.use_tracing(session):
        env.reset()
        assert [r[R_COUNT] for r in rec._last] == [6, 6]  # reset_done, dr_reset (the
        env.reset(slice(None))  # recorder's env count, set by reset's env_count)
        assert [r[R_COUNT] for r in rec._last] == [6, 6]
        env.reset(np.array([1, 2]))
        env.reset(slice(0, 3))  # a slice of some envs: no len(), no count
        env.reset(slice(np.array(0), np.array(3)))  # (bounds that compare elementwise)
        assert [r[R_COUNT] for r in rec._last] == [-1, -1]
    st = session.stats()
    assert st["reset_done_count"].total_ms == 6 + 6 + 2 and st["reset_done_ms"].count == 5
    assert rec.attributes[C.ATTR_ENV_COUNT] == 6
    fresh = Tracing(Config(mode="timing"))
    try:
        caplog.set_level(logging.WARNING, logger="resettrace")
        with resettrace.use_tracing(fresh):
            alone(None)
        assert "the count of 'set_state' is None or slice(None) (every env) but the env " \
               "count is not known" in caplog.text
        assert "reset_done_count" not in fresh.stats()
    finally:
        fresh.shutdown()


def test_a_run_whose_counts_live_on_a_device_says_so_in_its_record_and_summary(
        tmp_path: Path) -> None:
    """Counts on an accelerator mean the spans time launches: the process's record lists
    the devices, the job's too, and ``resettrace run`` says it in one line (the ``meta``
    device: a real torch device with shapes and no data)."""
    pytest.importorskip("torch")  # (the stacks extra: make test installs it)
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        import resettrace

        @resettrace.traced("set_state", count="ids")
        def reset(ids):
            return None

        for _ in range(3):
            reset(torch.arange(4, device="meta"))
    """))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RESETTRACE") or k == "RESETTRACE_PURE_PYTHON"}
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "run", "--stats-json",
                        "job.json", "--", sys.executable, "train.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["devices"] == ["meta"] and job["stats"]["dr_reset_set_state_ms"]["count"] == 3
    (member,) = [p for p in tmp_path.glob("job.*.json")]
    assert json.loads(member.read_text())["devices"] == ["meta"]
    said = [line for line in r.stderr.splitlines() if "env counts lived on" in line]
    assert said == ["resettrace run: env counts lived on meta: the spans time the host, so a "
                    "phase that launches device work shows its launch, and the work shows "
                    "where the host next waits for it (docs/instrument.md, \"On a GPU\")"]
