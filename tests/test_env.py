"""The traced env step on real MuJoCo: span tree, parent links, env-count attributes."""

from __future__ import annotations

import numpy as np
import pytest

import resettrace
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.tracing.session import Tracing

N = 32


def _force_resets(env, ids) -> None:
    """Knock the base of ``ids`` below the termination height so that they reset."""
    q = np.array(env.backend.get_qpos_rows(ids))
    q[:, 2] = 0.2
    env.backend.set_state(ids, q, np.zeros((len(ids), env.backend.nv)))


def test_env_step_span_tree_and_attributes(trace_session) -> None:
    env = resettrace.make_env("g1_walk_flat", num_envs=N, tracing=trace_session, seed=3)
    ids = np.array([1, 4, 9, 30])
    _force_resets(env, ids)
    assert trace_session.force_flush()
    trace_session.exporters[0].clear()
    action = np.zeros((N, env.action_dim))
    _, _, done, info = env.step(action)
    assert done[ids].all() and done.sum() == len(ids)
    assert trace_session.force_flush()
    spans = trace_session.exporters[0].get_finished_spans()
    by_name = {s.name: s for s in spans}
    assert len(by_name) == len(spans), "one span per phase per batched call"
    by_id = {s.context.span_id: s for s in spans}
    # nesting: each span's parent is the span of its catalog parent, in one trace
    for s in spans:
        phase = C.BY_SPAN[s.name]
        if phase.parent is None:
            assert s.parent is None
        else:
            assert by_id[s.parent.span_id].name == phase.parent
        assert s.context.trace_id == by_name[C.ENV_STEP.span].context.trace_id
        # children lie inside their parent
        if s.parent is not None:
            p = by_id[s.parent.span_id]
            assert p.start_time <= s.start_time <= s.end_time <= p.end_time
    for name in (C.ENV_STEP.span, C.PHYSICS.span, C.RESET_DONE.span, C.DR_RESET.span,
                 C.SET_STATE.span, C.SET_STATE_QPOS_CONVERT.span):
        assert name in by_name
    # lazy kinematics: nothing of them runs inside set_state, so no span says otherwise
    assert C.SET_STATE_FORWARD_KINEMATIC.span not in by_name
    for s in spans:
        assert s.attributes[C.ATTR_ENV_COUNT] == N
        assert s.attributes[C.ATTR_BACKEND] == "mujoco"
        assert s.attributes[C.ATTR_TASK] == "g1_walk_flat"
    for name in (C.RESET_DONE.span, C.DR_RESET.span, C.SET_STATE.span,
                 C.SET_STATE_QPOS_CONVERT.span, C.DR_RESET_PLAN.span):
        assert by_name[name].attributes[C.ATTR_RESET_COUNT] == len(ids)
    assert C.ATTR_RESET_COUNT not in by_name[C.PHYSICS.span].attributes
    # the reset rows start a new episode with a fresh observation
    assert (env.episode_step[ids] == 0).all()
    np.testing.assert_array_equal(info["terminal_obs"][ids].shape, (len(ids), env.task.obs_dim))
    assert env.backend.get_qpos_rows(ids)[:, 2].min() > 0.7
    env.close()


def test_reset_observation_matches_update_state(timing_session) -> None:
    """The reset rows' observation (built for k rows) equals the full-batch one."""
    env = resettrace.make_env("g1_walk_flat", num_envs=N, tracing=timing_session, seed=5)
    ids = np.array([0, 7, 8])
    mask = np.zeros(N, bool)
    mask[ids] = True
    env.reset_done(mask)
    reset_obs = env.obs[ids].copy()
    env.task.update_state(env.episode_step, env.last_action, env.obs, env.reward,
                          env.terminated)
    np.testing.assert_allclose(env.obs[ids], reset_obs, rtol=1e-5, atol=1e-5)
    assert env.dr.last_set_state is not None
    env.close()


def test_off_mode_records_nothing() -> None:
    session = Tracing(Config(mode="off"))
    env = resettrace.make_env("g1_walk_flat", num_envs=8, tracing=session)
    _force_resets(env, np.array([2]))
    env.step(np.zeros((8, env.action_dim)))
    assert env.dr.last_set_state is None
    assert session.stats() == {} and session.export_report()["spans_built"] == 0
    env.close()


def test_noisy_actions_terminate_a_few_percent(timing_session) -> None:
    env = resettrace.make_env("g1_walk_flat", num_envs=64, tracing=timing_session, seed=0)
    rng = np.random.default_rng(0)
    resets = 0
    for _ in range(80):
        _, _, done, _ = env.step(rng.normal(0, 1.0, (64, env.action_dim)))
        resets += int(done.sum())
    fraction = resets / (80 * 64)
    assert 0.005 < fraction < 0.08, fraction
    st = timing_session.stats()
    assert st[C.RESET_DONE_COUNT].total_ms == resets
    assert st[C.ENV_STEP.key].count == 80
    env.close()


def test_bad_action_shape_raises(timing_session) -> None:
    env = resettrace.make_env("g1_walk_flat", num_envs=4, tracing=timing_session)
    with pytest.raises(ValueError, match="action must have shape \\(4, 29\\)"):
        env.step(np.zeros((4, 3)))
    env.close()
