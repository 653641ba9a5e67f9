"""The MuJoCo backend against the contract: timing schema and closure, exact row writes,
input validation before any engine call."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resettrace
from helpers import reset_timings, stand_rows
from resettrace import catalog as C
from resettrace.sim.contract import SimBackend
from resettrace.tracing.session import Tracing

N = 64


@pytest.fixture(scope="module")
def off_backend():
    b = resettrace.make_backend("mujoco", num_envs=16, tracing=Tracing(resettrace.Config()))
    yield b
    b.close()


def test_backend_satisfies_contract(off_backend) -> None:
    b = off_backend
    assert isinstance(b, SimBackend)
    assert (b.nq, b.nv, b.nu) == (36, 35, 29)
    assert b.info.joint_names[0] == "left_hip_pitch_joint" and len(b.info.joint_names) == 29
    assert b.keyframe_qpos.shape == (36,)
    assert b.get_qpos_rows(None).shape == (16, 36)
    poses = b.get_body_pose_rows([0, 3], ["pelvis", "torso_link"])
    assert poses.shape == (2, 2, 7)
    np.testing.assert_allclose(np.linalg.norm(poses[..., 3:], axis=-1), 1.0, atol=1e-9)
    np.testing.assert_allclose(poses[0, 0, :3], b.keyframe_qpos[:3], atol=1e-9)


def test_off_mode_returns_none(off_backend) -> None:
    q, v = stand_rows(off_backend, 2)
    assert off_backend.set_state([1, 5], q, v) is None


def test_timing_schema_every_key_every_call(timing_session) -> None:
    b = resettrace.make_backend("mujoco", num_envs=N, tracing=timing_session)
    rng = np.random.default_rng(1)
    for lazy, timing in reset_timings(b, (1, 3, 17, N), rng):
        assert timing["set_state_qpos_convert_ms"] > 0.0  # the pass writes the rows too
        # lazy: nothing of the kinematics runs inside set_state (the pass marks them)
        assert (timing["set_state_forward_kinematic_ms"] > 0.0) is not lazy
        for key in ("set_state_data_slice_ms", "set_state_data_reset_ms",
                    "set_state_refresh_pose_cache_ms", "set_state_actuator_ctrl_ms"):
            assert timing[key] == 0.0, key  # in the pass, or does not apply on MuJoCo
    b.close()


@pytest.mark.parametrize("backend", ["mujoco", "motrix"])
def test_timing_closes_on_the_set_state_span(trace_session, backend) -> None:
    """Phases + gap = the set_state span's duration (within 1%), and never more than
    the wall time measured around the call; the phases, not the gap, hold most of it
    (in the median call of each size: one call can lose the core in its gap)."""
    b = resettrace.make_backend(backend, num_envs=N, tracing=trace_session, nthread=2)
    rng = np.random.default_rng(2)
    sizes, walls, timings = [], [], []
    for k in (2, 8, 32):
        for _ in range(5):
            ids = np.sort(rng.choice(N, k, replace=False))
            q, v = stand_rows(b, k, rng)
            t0 = time.perf_counter_ns()
            out = b.set_state(ids, q, v)
            walls.append((time.perf_counter_ns() - t0) / 1e6)
            timings.append(out["timing"])
            sizes.append(k)
    assert trace_session.force_flush()
    spans = [s for s in trace_session.exporters[0].get_finished_spans()
             if s.name == C.SET_STATE.span]
    assert len(spans) == len(timings)
    measured_share: dict[int, list[float]] = {}
    for span, timing, wall, k in zip(spans, timings, walls, sizes, strict=True):
        span_ms = (span.end_time - span.start_time) / 1e6
        total = sum(timing.values())
        assert total == pytest.approx(span_ms, rel=0.01)
        assert total <= wall
        measured = total - timing["set_state_internal_gap_ms"]
        measured_share.setdefault(k, []).append(measured / total)
    for k, shares in measured_share.items():
        assert np.median(shares) > 0.5, (k, shares)
    b.close()


def _snapshot(b):
    return (np.array(b.get_qpos_rows(None)), np.array(b.get_qvel_rows(None)),
            np.array(b.batch.ctrl))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_set_state_changes_exactly_the_selected_rows(off_backend, data) -> None:
    b = off_backend
    n = b.num_envs
    ids = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # move every env first so that untouched rows differ from a fresh reset
    b.step(np.tile(b.keyframe_qpos[7:], (n, 1)) + rng.normal(0, 0.1, (n, 29)), 2)
    before_q, before_v, before_c = _snapshot(b)
    k = len(ids)
    q, v = stand_rows(b, k, rng)
    q[:, 3:7] = rng.normal(size=(k, 4)) * 3.0  # any non-zero quaternion is normalised
    b.set_state(np.array(ids), q, v)
    after_q, after_v, after_c = _snapshot(b)
    other = np.setdiff1d(np.arange(n), ids)
    np.testing.assert_array_equal(after_q[other], before_q[other])
    np.testing.assert_array_equal(after_v[other], before_v[other])
    np.testing.assert_array_equal(after_c[other], before_c[other])
    unit = q[:, 3:7] / np.linalg.norm(q[:, 3:7], axis=1, keepdims=True)
    np.testing.assert_allclose(after_q[ids, 3:7], unit, atol=1e-12)
    np.testing.assert_array_equal(after_q[ids, :3], q[:, :3])
    np.testing.assert_array_equal(after_q[ids, 7:], q[:, 7:])
    np.testing.assert_array_equal(after_v[ids], v)
    lo, hi = b.info.ctrl_range.T
    np.testing.assert_array_equal(after_c[ids], np.clip(q[:, 7:][:, b.info.actuator_joint], lo, hi))
    # kinematics of the reset rows are fresh: the pelvis pose is the new base pose
    pose = b.get_body_pose_rows(np.array(ids), ["pelvis"])[:, 0]
    np.testing.assert_allclose(pose[:, :3], q[:, :3], atol=1e-9)
    np.testing.assert_allclose(np.abs(np.sum(pose[:, 3:] * unit, axis=1)), 1.0, atol=1e-9)


def test_unsorted_ids_keep_their_rows(off_backend) -> None:
    b = off_backend
    q, v = stand_rows(b, 3, np.random.default_rng(3))
    b.set_state(np.array([9, 2, 5]), q, v)
    np.testing.assert_array_equal(b.get_qpos_rows(np.array([9, 2, 5]))[:, :3], q[:, :3])
    np.testing.assert_array_equal(b.get_qvel_rows(np.array([9, 2, 5])), v)


BAD = [
    ("out of range", lambda q, v: ([0, 16], q[:2], v[:2]), "in \\[0, 16\\)"),
    ("negative", lambda q, v: ([-1, 3], q[:2], v[:2]), "in \\[0, 16\\)"),
    ("duplicated", lambda q, v: ([4, 4], q[:2], v[:2]), "unique"),
    ("float ids", lambda q, v: (np.array([1.0, 2.0]), q[:2], v[:2]), "integers"),
    ("2-D ids", lambda q, v: (np.array([[1, 2]]), q[:2], v[:2]), "one-dimensional"),
    ("bool mask", lambda q, v: (np.ones(16, bool), q, v), "boolean mask"),
    ("qpos shape", lambda q, v: ([1, 2], q[:3], v[:2]), "qpos must have shape \\(2, 36\\)"),
    ("qvel shape", lambda q, v: ([1, 2], q[:2], v[:2, :-1]), "qvel must have shape"),
    ("nan qpos", lambda q, v: ([1, 2], _with(q[:2], (1, 9), np.nan), v[:2]), "non-finite"),
    ("inf qvel", lambda q, v: ([1, 2], q[:2], _with(v[:2], (0, 0), np.inf)), "non-finite"),
    ("zero quat", lambda q, v: ([1, 2], _with(q[:2], (0, slice(3, 7)), 0.0), v[:2]),
     "zero base quaternion at row 0"),
    # finite, but the squared norm overflows: it would normalise to [0, 0, 0, 0]
    *[(f"huge quat {x:g}", lambda q, v, x=x: ([1, 2], _with(q[:2], (1, slice(3, 5)), x),
                                              v[:2]),
       "base quaternion too large to normalise at row 1") for x in (1e200, 1.7e308, -1e308)],
    ("text qpos", lambda q, v: ([1, 2], np.full((2, 36), "a"), v[:2]), "numeric"),
]


def _with(a, index, value):
    a = np.array(a)
    a[index] = value
    return a


@pytest.mark.parametrize("make_args,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_and_touches_nothing(off_backend, make_args, match) -> None:
    b = off_backend
    q, v = stand_rows(b, 16, np.random.default_rng(4))
    before = _snapshot(b)
    with pytest.raises(ValueError, match=match):
        b.set_state(*make_args(q, v))
    for x, y in zip(before, _snapshot(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_the_numpy_normaliser_refuses_what_the_pass_refuses() -> None:
    """``normalise_quat_into`` (the published path's qpos conversion in the benchmarks)."""
    from resettrace.sim.backends._validate import normalise_quat_into

    for x, match in ((0.0, "zero base quaternion at row 1"),
                     (1e200, "too large to normalise at row 1"),
                     (-1e308, "too large to normalise at row 1")):
        quat = np.array([[2.0, 0.0, 0.0, 0.0], [x, x, 0.0, 0.0]])
        out = np.full_like(quat, 7.0)
        with pytest.raises(ValueError, match=match):
            normalise_quat_into(out, quat, "qpos")
        assert (out == 7.0).all()
    quat = np.array([[2.0, 0.0, 0.0, 0.0], [1e150, 1e150, 0.0, 0.0]])
    normalise_quat_into(quat, quat, "qpos")
    np.testing.assert_allclose(quat, [[1.0, 0.0, 0.0, 0.0], [np.sqrt(0.5)] * 2 + [0.0] * 2])


def test_empty_ids_is_a_no_op(timing_session) -> None:
    b = resettrace.make_backend("mujoco", num_envs=4, tracing=timing_session)
    before = _snapshot(b)
    out = b.set_state(np.zeros(0, np.int64), np.zeros((0, 36)), np.zeros((0, 35)))
    assert out is not None and tuple(out["timing"]) == C.SET_STATE_KEYS
    for x, y in zip(before, _snapshot(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_registry_lists_known_names() -> None:
    with pytest.raises(ValueError, match="unknown backend 'bullet'; known: .*mujoco"):
        resettrace.make_backend("bullet", num_envs=1)
    with pytest.raises(ValueError,
                       match="unknown task 'g1_fly'; known: g1_motion_tracking, g1_walk_flat"):
        resettrace.make_env("g1_fly", num_envs=1)


def test_user_model_path_and_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="model file not found"):
        resettrace.make_backend("mujoco", num_envs=1, model=tmp_path / "missing.xml")
    arm = tmp_path / "arm.xml"
    arm.write_text("<mujoco><worldbody><body><joint type='hinge'/><geom size='.1'/></body>"
                   "</worldbody></mujoco>")
    with pytest.raises(ValueError, match="floating base"):
        resettrace.make_backend("mujoco", num_envs=1, model=arm)
