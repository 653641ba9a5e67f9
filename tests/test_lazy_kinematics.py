"""Lazy kinematics: set_state leaves the reset rows' forward kinematics to whoever reads
poses, and the next physics step recomputes them anyway, so eager and lazy runs are
bit-identical (qpos, qvel, observations, rewards, done masks, terminal observations)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import resettrace
from resettrace import catalog as C
from resettrace.sim.backends._base import RowBackend


def _rollout(task: str, backend: str, lazy: bool, steps: int = 150, n: int = 16
             ) -> tuple[list[Any], np.ndarray, np.ndarray, int]:
    previous = RowBackend.lazy_kinematics
    RowBackend.lazy_kinematics = lazy
    try:
        env = resettrace.make_env(task, backend=backend, num_envs=n, seed=3, nthread=1)
        env.backend.lazy_kinematics = lazy  # motion tracking would choose eager itself
        rng = np.random.default_rng(5)
        history, resets = [], 0
        for _ in range(steps):
            obs, reward, done, info = env.step(rng.normal(0.0, 2.0, (n, env.action_dim)))
            history.append((obs.copy(), reward.copy(), done.copy(),
                            {k: np.array(v, copy=True) for k, v in info.items()}))
            resets += int(done.sum())
        b = env.backend
        q, v = np.array(b.get_qpos_rows(), copy=True), np.array(b.get_qvel_rows(), copy=True)
        env.close()
    finally:
        RowBackend.lazy_kinematics = previous
    return history, q, v, resets


@pytest.mark.parametrize("backend", ["mujoco", "motrix"])
@pytest.mark.parametrize("task", ["g1_walk_flat", "g1_motion_tracking"])
def test_eager_and_lazy_runs_are_bit_identical(task: str, backend: str) -> None:
    eager, q0, v0, resets = _rollout(task, backend, lazy=False)
    lazy, q1, v1, resets_lazy = _rollout(task, backend, lazy=True)
    assert resets == resets_lazy > 20  # resets happened, the same ones
    assert np.array_equal(q0, q1) and np.array_equal(v0, v1)
    for step, (a, b) in enumerate(zip(eager, lazy, strict=True)):
        for x, y in zip(a[:3], b[:3], strict=True):  # obs, reward, done
            assert np.array_equal(x, y), step
        assert a[3].keys() == b[3].keys()
        for key in a[3]:
            assert np.array_equal(a[3][key], b[3][key]), (step, key)


@pytest.mark.parametrize("backend", ["mujoco", "motrix"])
def test_kinematics_run_only_where_poses_are_read(backend: str, timing_session) -> None:
    b = resettrace.make_backend(backend, num_envs=8, nthread=1, tracing=timing_session)
    calls: list[np.ndarray] = []
    forward = b._forward

    def counting(ids: np.ndarray, index: Any) -> None:
        calls.append(ids.copy())
        forward(ids, index)

    b._forward = counting  # type: ignore[method-assign]
    body = list(b.info.body_names[1:2])
    b.get_body_pose_rows(np.arange(8), body)  # the start at the keyframe left all rows stale
    assert [c.tolist() for c in calls] == [list(range(8))]
    calls.clear()
    ids = np.array([1, 4, 6])
    q = np.tile(b.keyframe_qpos, (3, 1))
    q[:, 2] += 0.5  # lifted: the poses must move with it
    b.set_state(ids, q, np.zeros((3, b.nv)))
    assert calls == []  # set_state ran no forward kinematics
    rec = timing_session.recorder(backend=backend)
    with rec.scope(C.DR_RESET_BODY_POSE):  # a reader's phase gets the cost
        poses = b.get_body_pose_rows(np.array([4, 0]), body)
    assert [c.tolist() for c in calls] == [[4]]  # the stale row read, only it
    b.get_body_pose_rows(np.array([4]), body)
    assert len(calls) == 1  # fresh now
    z = poses[:, 0, 2]
    assert z[0] == pytest.approx(z[1] + 0.5, abs=1e-5)  # env 4 lifted, env 0 not
    b.set_state(ids, q, np.zeros((3, b.nv)))
    b.step(np.zeros((8, b.nu)), 1)
    b.get_body_pose_rows(np.arange(8), body)
    assert len(calls) == 1  # the step computed the reset rows' kinematics
    assert timing_session.stats()[C.DR_RESET_BODY_POSE.key].count == 1
    b.close()


def test_motion_tracking_chooses_eager_kinematics_walk_flat_lazy() -> None:
    """Motion tracking reads the reset rows' poses right after set_state: eager is cheaper
    there; walk-flat reads qpos and qvel only: lazy."""
    tracking = resettrace.make_env("g1_motion_tracking", backend="mujoco", num_envs=4, nthread=1)
    walking = resettrace.make_env("g1_walk_flat", backend="mujoco", num_envs=4, nthread=1)
    assert tracking.backend.lazy_kinematics is False
    assert walking.backend.lazy_kinematics is True
    tracking.close()
    walking.close()
