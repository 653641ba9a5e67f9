"""MuJoCo and MotrixSim behind the same contract: same model, same state in, same answers out.

MotrixSim computes in float32, so values are compared to 1e-5 (poses) and 2e-6 (states read
back); quaternions are compared up to sign (q and -q are the same rotation).
"""

from __future__ import annotations

import numpy as np
import pytest

import resettrace
from helpers import stand_rows
from resettrace import catalog as C
from resettrace.tracing.session import Tracing

BACKENDS = ("mujoco", "motrix")
N = 16
NTHREAD = 2
POSE_ATOL = 1e-5
STATE_ATOL = {"mujoco": 1e-12, "motrix": 2e-6}


def _make(name, session, num_envs=N):
    return resettrace.make_backend(name, num_envs=num_envs, nthread=NTHREAD, tracing=session)


@pytest.fixture(scope="module")
def pair():
    off = Tracing(resettrace.Config())
    backends = {name: _make(name, off) for name in BACKENDS}
    yield backends
    for b in backends.values():
        b.close()


def _ctrl_of(b) -> np.ndarray:
    """Every env's actuator targets (not part of the contract: each engine's own view)."""
    return np.array(b.batch.ctrl if b.name == "mujoco" else b.data.actuator_ctrls)


def random_states(b, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """k valid states anywhere in the model's range: random base pose and orientation
    (unit wxyz), joints uniform in their limits, random velocities."""
    q = np.tile(b.keyframe_qpos, (k, 1))
    q[:, :2] = rng.uniform(-2.0, 2.0, (k, 2))
    q[:, 2] = rng.uniform(0.3, 1.2, k)
    quat = rng.normal(size=(k, 4))
    q[:, 3:7] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    lo, hi = b.info.joint_range.T
    q[:, 7:] = rng.uniform(np.maximum(lo, -3.0), np.minimum(hi, 3.0), (k, len(lo)))
    v = rng.uniform(-1.0, 1.0, (k, b.nv))
    return q, v


def test_same_model_description(pair) -> None:
    mj, mx = pair["mujoco"], pair["motrix"]
    assert (mj.nq, mj.nv, mj.nu, mj.num_envs) == (mx.nq, mx.nv, mx.nu, mx.num_envs)
    for field in ("joint_names", "body_names", "actuator_names"):
        assert getattr(mj.info, field) == getattr(mx.info, field), field
    for field in ("joint_range", "ctrl_range", "actuator_joint"):
        np.testing.assert_array_equal(getattr(mj.info, field), getattr(mx.info, field))
    assert mj.info.physics_dt == pytest.approx(mx.info.physics_dt, rel=1e-6)
    np.testing.assert_array_equal(mj.keyframe_qpos, mx.keyframe_qpos)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_same_body_poses_after_set_state(pair, seed) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, N + 1))
    ids = rng.choice(N, k, replace=False)  # unsorted on purpose
    q, v = random_states(pair["mujoco"], k, rng)
    poses = {}
    for name, b in pair.items():
        b.set_state(ids, q, v)
        poses[name] = b.get_body_pose_rows(ids, b.info.body_names)
    mj, mx = poses["mujoco"], poses["motrix"]
    assert mj.shape == mx.shape == (k, len(pair["mujoco"].info.body_names), 7)
    assert np.abs(mj[..., :3] - mx[..., :3]).max() <= POSE_ATOL
    quat_err = np.minimum(np.abs(mj[..., 3:] - mx[..., 3:]).max(axis=-1),
                          np.abs(mj[..., 3:] + mx[..., 3:]).max(axis=-1))
    assert quat_err.max() <= POSE_ATOL
    # and the base body is exactly where the state put it
    np.testing.assert_allclose(mx[:, 1, :3], q[:, :3], atol=POSE_ATOL)


@pytest.mark.parametrize("name", BACKENDS)
def test_same_timing_key_set(name, timing_session) -> None:
    b = _make(name, timing_session)
    rng = np.random.default_rng(5)
    for k in (1, 5, N):
        ids = np.sort(rng.choice(N, k, replace=False))
        out = b.set_state(ids, *random_states(b, k, rng))
        assert out is not None
        assert tuple(out["timing"]) == C.SET_STATE_KEYS
        assert all(x >= 0.0 for x in out["timing"].values())
    b.close()


@pytest.mark.parametrize("name", BACKENDS)
def test_qpos_and_qvel_round_trip_in_contract_layout(pair, name) -> None:
    b = pair[name]
    rng = np.random.default_rng(6)
    ids = np.array([7, 0, 12, 3])
    q, v = random_states(b, 4, rng)
    q[:, 3:7] *= rng.uniform(0.2, 5.0, (4, 1))  # unnormalised in, unit out
    b.set_state(ids, q, v)
    unit = q.copy()
    unit[:, 3:7] /= np.linalg.norm(q[:, 3:7], axis=1, keepdims=True)
    atol = STATE_ATOL[name]
    got = b.get_qpos_rows(ids)
    np.testing.assert_allclose(got, unit, atol=atol)
    np.testing.assert_allclose(np.linalg.norm(got[:, 3:7], axis=1), 1.0, atol=atol)
    np.testing.assert_allclose(b.get_qpos_rows(None)[ids], unit, atol=atol)
    np.testing.assert_allclose(b.get_qvel_rows(ids), v, atol=atol)
    # a wxyz quaternion stays wxyz: the identity rotation reads back as (1, 0, 0, 0)
    ident = np.tile(b.keyframe_qpos, (1, 1))
    b.set_state([5], ident, np.zeros((1, b.nv)))
    np.testing.assert_allclose(b.get_qpos_rows([5])[0, 3:7], [1.0, 0.0, 0.0, 0.0], atol=atol)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_quaternion_too_large_to_normalise_is_refused_before_any_write(pair, name) -> None:
    """Finite parts whose squares overflow float64 would normalise to (0, 0, 0, 0): a
    90-degree roll would read back as no rotation. Both backends refuse it (MotrixSim's
    float32 rows refuse the value itself) and leave every env as it was; a long quaternion
    that can be normalised still is."""
    b = pair[name]
    q, v = stand_rows(b, 2)
    v[:] = 0.25
    before = (b.get_qpos_rows(None).copy(), b.get_qvel_rows(None).copy())
    for x in (1e200, 1.7e308, -1e308):
        roll = q.copy()
        roll[1, 3:7] = [x, x, 0.0, 0.0]
        with pytest.raises(ValueError, match=r"^qpos has .* at row 1\b"):
            b.set_state([3, 9], roll, v)
        np.testing.assert_array_equal(b.get_qpos_rows(None), before[0])
        np.testing.assert_array_equal(b.get_qvel_rows(None), before[1])
    long = q.copy()
    long[0, 3:7] = [2.0, 0.0, 0.0, 0.0]
    long[1, 3:7] = [3e30, 3e30, 0.0, 0.0]  # squares far from overflow, within float32
    b.set_state([3, 9], long, v)
    half = np.sqrt(0.5)
    np.testing.assert_allclose(b.get_qpos_rows([3, 9])[:, 3:7],
                               [[1.0, 0.0, 0.0, 0.0], [half, half, 0.0, 0.0]],
                               atol=STATE_ATOL[name])


@pytest.mark.parametrize("name", BACKENDS)
def test_step_then_set_state_keeps_untouched_rows(pair, name) -> None:
    b = pair[name]
    rng = np.random.default_rng(7)
    b.set_state(np.arange(N), *stand_rows(b, N))
    ctrl = np.tile(b.keyframe_qpos[7:], (N, 1)) + rng.normal(0, 0.05, (N, b.nu))
    b.step(ctrl, 3)
    moved = b.get_qpos_rows(None).copy()
    assert not np.allclose(moved, np.tile(b.keyframe_qpos, (N, 1)))  # physics ran
    assert np.isfinite(moved).all()
    before_q, before_v, before_c = moved, b.get_qvel_rows(None).copy(), _ctrl_of(b)
    before_p = b.get_body_pose_rows(None, b.info.body_names).copy()
    ids = np.array([2, 9, 11])
    b.set_state(ids, *random_states(b, 3, rng))
    other = np.setdiff1d(np.arange(N), ids)
    np.testing.assert_array_equal(b.get_qpos_rows(None)[other], before_q[other])
    np.testing.assert_array_equal(b.get_qvel_rows(None)[other], before_v[other])
    np.testing.assert_array_equal(_ctrl_of(b)[other], before_c[other])
    np.testing.assert_array_equal(b.get_body_pose_rows(other, b.info.body_names),
                                  before_p[other])
    b.step(ctrl, 2)
    assert np.isfinite(b.get_qpos_rows(None)).all()
