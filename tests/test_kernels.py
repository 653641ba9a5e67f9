"""The numba update_state kernel against the numpy path: same obs, reward and termination."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import resettrace
from resettrace.contract import BackendInfo
from resettrace.tasks.g1_walk_flat import G1WalkFlat

NJ = 29
#: qpos and qvel rows live inside wider state rows, as the engine's views do
STATE_WIDTH = 120


class FakeBackend:
    """The state-reading part of the contract over arbitrary qpos / qvel rows."""

    name = "fake"
    nq, nv, nu = 7 + NJ, 6 + NJ, NJ

    def __init__(self, num_envs: int, rng: np.random.Generator) -> None:
        self.num_envs = num_envs
        self.info = BackendInfo(
            name=self.name, joint_names=tuple(f"j{i}" for i in range(NJ)),
            body_names=("world", "pelvis"), actuator_names=tuple(f"a{i}" for i in range(NJ)),
            joint_range=np.tile([-2.0, 2.0], (NJ, 1)), ctrl_range=np.tile([-2.0, 2.0], (NJ, 1)),
            actuator_joint=np.arange(NJ), physics_dt=0.005)
        key = np.zeros(self.nq)
        key[2], key[3] = 0.79, 1.0
        key[7:] = rng.uniform(-0.5, 0.5, NJ)
        self.keyframe_qpos = key
        state = np.zeros((num_envs, STATE_WIDTH))
        self.qpos = state[:, 10:10 + self.nq]
        self.qvel = state[:, 50:50 + self.nv]

    def get_qpos_rows(self, env_ids=None) -> np.ndarray:
        return self.qpos if env_ids is None else self.qpos[env_ids]

    def get_qvel_rows(self, env_ids=None) -> np.ndarray:
        return self.qvel if env_ids is None else self.qvel[env_ids]


def _tilt_quat(angle: np.ndarray, axis: np.ndarray) -> np.ndarray:
    axis = axis / np.linalg.norm(axis, axis=1, keepdims=True)
    return np.concatenate([np.cos(angle / 2)[:, None], np.sin(angle / 2)[:, None] * axis], 1)


def _random_states(backend: FakeBackend, rng: np.random.Generator) -> None:
    """A quarter uniformly random orientations (most fallen), a quarter small tilts, a
    quarter tilts within 0.01 degree of the 60 degree limit, a quarter upright; heights on
    both sides of ``min_base_height``."""
    n = backend.num_envs
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    m = n // 4
    q[m:2 * m] = _tilt_quat(rng.uniform(0, 0.8, m), rng.normal(size=(m, 3)))
    near = np.deg2rad(60.0 + rng.uniform(-0.01, 0.01, m))
    q[2 * m:3 * m] = _tilt_quat(near, rng.normal(size=(m, 3)))
    q[3 * m:] = _tilt_quat(rng.uniform(0, 0.05, n - 3 * m), rng.normal(size=(n - 3 * m, 3)))
    backend.qpos[:, 0:2] = rng.uniform(-5, 5, (n, 2))
    backend.qpos[:, 2] = rng.uniform(0.3, 1.0, n)
    backend.qpos[:, 3:7] = q
    backend.qpos[:, 7:] = rng.uniform(-2.5, 2.5, (n, NJ))
    backend.qvel[:] = rng.normal(0.0, 2.0, backend.qvel.shape)


def _bound_pair(n: int, seed: int) -> tuple[G1WalkFlat, G1WalkFlat, FakeBackend]:
    backend = FakeBackend(n, np.random.default_rng(seed))
    tasks = []
    for use_numba in (False, True):
        task = G1WalkFlat(use_numba=use_numba)
        task.bind(backend, np.random.default_rng(seed))  # same commands and phase offsets
        tasks.append(task)
    return tasks[0], tasks[1], backend


def test_kernel_matches_numpy_on_random_states() -> None:
    n = 512
    ref, fast, backend = _bound_pair(n, seed=7)
    assert fast._kernel is not None and ref._kernel is None
    np.testing.assert_array_equal(ref.command, fast.command)
    rng = np.random.default_rng(11)
    for _ in range(3):
        _random_states(backend, rng)
        step = rng.integers(0, 5000, n)
        action = rng.normal(0.0, 1.5, (n, NJ))
        outs = []
        for task in (ref, fast):
            obs = np.full((n, task.obs_dim), np.nan, np.float32)
            reward = np.full(n, np.nan)
            terminated = np.zeros(n, bool)
            terminated[::2] = True  # stale values must be overwritten
            task.update_state(step, action, obs, reward, terminated)
            outs.append((obs, reward, terminated))
        (obs_a, rew_a, term_a), (obs_b, rew_b, term_b) = outs
        assert not np.isnan(obs_b).any() and not np.isnan(rew_b).any()
        np.testing.assert_allclose(obs_b, obs_a, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rew_b, rew_a, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(term_b, term_a)
        # terminations happen both ways, for both reasons, and at the tilt limit
        assert 0 < term_a.sum() < n
        low = backend.qpos[:, 2] < ref.config.min_base_height
        tilted = obs_a[:, 5] > -ref.config.max_tilt_cos
        assert (low & ~tilted).any() and (tilted & ~low).any()
        near = slice(n // 2, 3 * n // 4)
        assert 0 < tilted[near].sum() < n // 4
        # the obs layout: command and phase land where the numpy path puts them
        np.testing.assert_allclose(obs_b[:, -5:-2], fast.command, rtol=1e-6)
        phase = (step * 0.02 * 1.25 + fast.phase_offset) % 1.0
        np.testing.assert_allclose(obs_b[:, -2], np.sin(2 * np.pi * phase), atol=1e-6)


def test_kernel_rejects_buffers_it_was_not_built_for() -> None:
    n = 8
    _, fast, _ = _bound_pair(n, seed=1)
    step, action = np.zeros(n, np.int64), np.zeros((n, NJ))
    reward, terminated = np.zeros(n), np.zeros(n, bool)
    with pytest.raises(ValueError, match="obs must be a float32 array"):
        fast.update_state(step, action, np.zeros((n, fast.obs_dim)), reward, terminated)
    with pytest.raises(ValueError, match="episode_step must be a int64"):
        fast.update_state(step.astype(np.int32), action,
                          np.zeros((n, fast.obs_dim), np.float32), reward, terminated)
    with pytest.raises(ValueError, match="last_action must be C-contiguous"):
        fast.update_state(step, np.zeros((NJ, n)).T, np.zeros((n, fast.obs_dim), np.float32),
                          reward, terminated)


def test_numba_env_steps_and_resets_like_numpy_env() -> None:
    n, opts = 32, {"min_base_height": 0.7, "max_episode_steps": 15}
    envs = [resettrace.make_env("g1_walk_flat", num_envs=n, seed=5, nthread=1,
                                task_options={**opts, "use_numba": use_numba})
            for use_numba in (False, True)]
    ref, fast = envs
    try:
        assert fast.task._kernel is not None and ref.task._kernel is None
        np.testing.assert_allclose(fast.obs, ref.obs, rtol=1e-5, atol=1e-5)
        rng = np.random.default_rng(0)
        terminated = truncated = 0
        for _ in range(20):
            action = rng.normal(0.0, 2.0, (n, ref.action_dim))
            obs_a, rew_a, done_a, info_a = ref.step(action)
            term_a = ref.terminated.copy()
            obs_b, rew_b, done_b, info_b = fast.step(action)
            np.testing.assert_array_equal(done_b, done_a)
            np.testing.assert_array_equal(fast.terminated, term_a)
            np.testing.assert_allclose(obs_b, obs_a, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(rew_b, rew_a, rtol=0, atol=1e-9)
            np.testing.assert_allclose(info_b["terminal_obs"][done_a],
                                       info_a["terminal_obs"][done_a], rtol=1e-5, atol=1e-5)
            terminated += int(term_a.sum())
            truncated += int((info_a["truncated"] & ~term_a).sum())
        assert terminated > 0 and truncated > 0  # both kinds of reset were compared
        assert fast.episodes_finished == ref.episodes_finished
    finally:
        for env in envs:
            env.close()


def test_numpy_variant_does_not_import_numba() -> None:
    code = ("import sys, numpy as np\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from test_kernels import FakeBackend\n"
            "from resettrace.tasks.g1_walk_flat import G1WalkFlat\n"
            "t = G1WalkFlat(); b = FakeBackend(4, np.random.default_rng(0))\n"
            "t.bind(b, np.random.default_rng(0))\n"
            "t.update_state(np.zeros(4, np.int64), np.zeros((4, 29)),\n"
            "               np.zeros((4, t.obs_dim), np.float32), np.zeros(4), np.zeros(4, bool))\n"
            "print('numba' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
