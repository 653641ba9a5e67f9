"""The numba update_state kernels against the numpy paths: same obs, reward and termination."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import resettrace
from resettrace.sim.contract import BackendInfo
from resettrace.sim.model_facts import describe_model, load_model
from resettrace.sim.tasks.g1_motion_tracking import G1MotionTracking
from resettrace.sim.tasks.g1_walk_flat import G1WalkFlat
from resettrace.sim.tasks.motion import MotionClip, generate_clip, qmul, qrot, quat_from_euler
from resettrace.tracing.recorder import NOOP_RECORDER

NJ = 29
#: qpos and qvel rows live inside wider state rows, as the engine's views do
STATE_WIDTH = 120


#: the bundled G1's hinge joints: clips map their joints to the model's by name
G1_JOINTS = describe_model(load_model(None), "g1").joint_names


class FakeBackend:
    """The state-reading part of the contract over arbitrary qpos / qvel rows."""

    name = "fake"
    nq, nv, nu = 7 + NJ, 6 + NJ, NJ

    def __init__(self, num_envs: int, rng: np.random.Generator) -> None:
        self.num_envs = num_envs
        self.info = BackendInfo(
            name=self.name, joint_names=G1_JOINTS,
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
            "from resettrace.sim.tasks.g1_walk_flat import G1WalkFlat\n"
            "t = G1WalkFlat(); b = FakeBackend(4, np.random.default_rng(0))\n"
            "t.bind(b, np.random.default_rng(0))\n"
            "t.update_state(np.zeros(4, np.int64), np.zeros((4, 29)),\n"
            "               np.zeros((4, t.obs_dim), np.float32), np.zeros(4), np.zeros(4, bool))\n"
            "print('numba' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


# -- motion tracking ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def motion_clip() -> MotionClip:
    # 30 fps at a 0.02 s control period: 0.6 frames per step, so frames round
    return generate_clip(seconds=2.0, fps=30)


class FakeMotionBackend(FakeBackend):
    """FakeBackend plus the clip's bodies, their poses and ``set_state``."""

    def __init__(self, num_envs: int, rng: np.random.Generator, clip: MotionClip) -> None:
        super().__init__(num_envs, rng)
        self.info = BackendInfo(
            name=self.name, joint_names=self.info.joint_names,
            body_names=("world", *clip.body_names), actuator_names=self.info.actuator_names,
            joint_range=self.info.joint_range, ctrl_range=self.info.ctrl_range,
            actuator_joint=self.info.actuator_joint, physics_dt=0.005)
        self.recorder = NOOP_RECORDER
        self.bodies = clip.body_names
        self.pose = np.zeros((num_envs, len(clip.body_names), 7))
        self.pose[..., 3] = 1.0

    def set_state(self, env_ids, qpos, qvel) -> None:
        self.qpos[env_ids] = qpos
        self.qvel[env_ids] = qvel

    def get_body_pose_rows(self, env_ids, body_names) -> np.ndarray:
        cols = [self.bodies.index(b) for b in body_names]
        rows = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        return self.pose[rows[:, None], cols]  # a new array, as the real backends return


def _motion_pair(n: int, seed: int, clip: MotionClip
                 ) -> tuple[G1MotionTracking, G1MotionTracking, FakeMotionBackend]:
    backend = FakeMotionBackend(n, np.random.default_rng(seed), clip)
    tasks = []
    for use_numba in (False, True):
        task = G1MotionTracking(clip=clip, use_numba=use_numba)
        task.bind(backend, np.random.default_rng(seed))  # same start frames
        tasks.append(task)
    return tasks[0], tasks[1], backend


def _random_rotations(rng: np.random.Generator, shape: tuple[int, ...], scale: float
                      ) -> np.ndarray:
    return quat_from_euler(rng.uniform(-scale, scale, (*shape, 3)))


def _random_poses(backend: FakeMotionBackend, clip: MotionClip, frames: np.ndarray,
                  rng: np.random.Generator) -> None:
    """The reference at ``frames``, drifted (xy shift, heading turn) and perturbed; by
    quarter: small noise, random orientations (gravity failures), anchor height errors near
    the 0.25 m limit, end-effector height errors near it."""
    n, nb = len(frames), len(clip.body_names)
    yaw = quat_from_euler(np.stack([np.zeros(n), np.zeros(n), rng.uniform(-np.pi, np.pi, n)],
                                   axis=1))[:, None]
    pos = qrot(yaw, clip.body_pos[frames])
    pos[..., :2] += rng.uniform(-3.0, 3.0, (n, 1, 2))
    pos += rng.normal(0.0, 0.03, pos.shape)
    quat = qmul(_random_rotations(rng, (n, nb), 0.2), qmul(yaw, clip.body_quat[frames]))
    m = n // 4
    q = rng.normal(size=(m, nb, 4))
    quat[m:2 * m] = q / np.linalg.norm(q, axis=-1, keepdims=True)
    pos[2 * m:3 * m, :, 2] += rng.choice([-1.0, 1.0], (m, 1)) * rng.uniform(0.2, 0.3, (m, 1))
    ee = [clip.body_names.index(b) for b in ("left_ankle_roll_link", "right_wrist_yaw_link")]
    pos[3 * m:, ee, 2] += rng.uniform(-0.3, 0.3, (n - 3 * m, 2))
    backend.pose[:, :, 0:3] = pos
    backend.pose[:, :, 3:7] = quat


def test_motion_kernel_matches_numpy_on_random_states(motion_clip: MotionClip) -> None:
    n, clip = 512, motion_clip
    ref, fast, backend = _motion_pair(n, seed=3, clip=clip)
    assert fast._kernel is not None and ref._kernel is None
    np.testing.assert_array_equal(ref.start_frame, fast.start_frame)
    rng = np.random.default_rng(21)
    offset = rng.integers(0, 400, n)  # the first call fixes each env's step offset
    for round_ in range(4):
        _random_states(backend, rng)
        step = offset + (0 if round_ == 0 else rng.integers(0, 120, n))
        elapsed = (step - offset) * clip.fps * ref.config.control_dt
        frames = np.minimum(ref.start_frame + np.floor(elapsed + 0.5).astype(np.int64),
                            clip.num_frames - 1)
        _random_poses(backend, clip, frames, rng)
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
        for name in ("frame", "failed", "clip_end", "step_offset"):
            np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=name)
        np.testing.assert_array_equal(fast.frame, frames)
        # both failure kinds and clip ends happen (after the first round), not everywhere
        assert 0 < ref.failed.sum() < n
        if round_ > 0:
            assert ref.clip_end.any() and (ref.failed & ~ref.clip_end).any()
        m = n // 4
        for part in (slice(m, 2 * m), slice(2 * m, 3 * m), slice(3 * m, n)):
            assert 0 < ref.failed[part].sum() < len(range(n)[part])
        # the sampler got the same failure frames
        np.testing.assert_array_equal(fast.sampler.bin_failures, ref.sampler.bin_failures)
    assert ref.sampler.bin_failures.sum() > 0


def test_motion_kernel_rejects_buffers_it_was_not_built_for(motion_clip: MotionClip) -> None:
    n = 8
    _, fast, backend = _motion_pair(n, seed=1, clip=motion_clip)
    step, action = np.zeros(n, np.int64), np.zeros((n, NJ))
    reward, terminated = np.zeros(n), np.zeros(n, bool)
    with pytest.raises(ValueError, match="obs must be a float32 array"):
        fast.update_state(step, action, np.zeros((n, fast.obs_dim)), reward, terminated)
    with pytest.raises(ValueError, match="last_action must be C-contiguous"):
        fast.update_state(step, np.zeros((NJ, n)).T, np.zeros((n, fast.obs_dim), np.float32),
                          reward, terminated)
    backend.get_body_pose_rows = lambda ids, names: np.zeros((n, 3, 7))  # type: ignore
    with pytest.raises(ValueError, match="body poses must be a float64 array"):
        fast.update_state(step, action, np.zeros((n, fast.obs_dim), np.float32), reward,
                          terminated)


def test_motion_numba_env_steps_and_resets_like_numpy_env() -> None:
    n = 16
    # a 15-frame clip and tight thresholds: clip ends and failures within 15 steps
    opts = {"clip": generate_clip(seconds=0.3, fps=50), "max_anchor_height_error": 0.05,
            "max_end_effector_height_error": 0.05}
    envs = [resettrace.make_env("g1_motion_tracking", num_envs=n, seed=5, nthread=1,
                                task_options={**opts, "use_numba": use_numba})
            for use_numba in (False, True)]
    ref, fast = envs
    try:
        assert fast.task._kernel is not None and ref.task._kernel is None
        np.testing.assert_allclose(fast.obs, ref.obs, rtol=1e-5, atol=1e-5)
        rng = np.random.default_rng(0)
        failed = clip_end = 0
        for _ in range(15):
            action = rng.normal(0.0, 2.0, (n, ref.action_dim))
            obs_a, rew_a, done_a, info_a = ref.step(action)
            obs_b, rew_b, done_b, info_b = fast.step(action)
            np.testing.assert_array_equal(done_b, done_a)
            np.testing.assert_array_equal(fast.terminated, ref.terminated)
            np.testing.assert_array_equal(fast.task.failed, ref.task.failed)
            np.testing.assert_array_equal(fast.task.start_frame, ref.task.start_frame)
            np.testing.assert_allclose(obs_b, obs_a, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(rew_b, rew_a, rtol=0, atol=1e-9)
            np.testing.assert_allclose(info_b["terminal_obs"][done_a],
                                       info_a["terminal_obs"][done_a], rtol=1e-5, atol=1e-5)
            failed += int(ref.task.failed.sum())
            clip_end += int((ref.task.clip_end & ~ref.task.failed).sum())
        assert failed > 0 and clip_end > 0  # both kinds of reset were compared
        np.testing.assert_array_equal(fast.task.sampler.bin_failures,
                                      ref.task.sampler.bin_failures)
    finally:
        for env in envs:
            env.close()


def _bind_args(k: int, nq: int, *, f64: bool = False) -> dict[str, object]:
    """bind_pass's arguments for k rows of an nq-wide qpos (6 qvel, 1 actuator on column 7):
    float32 scratch of its own, or (``f64``) one float64 array of whole rows with state
    rows and warning counters."""
    from resettrace.sim.backends import _kernels as K

    n = 8
    if f64:
        rows = np.zeros((k, nq + 7))
        q = v = c = rows
        oq, ov, oc = 0, nq, nq + 6
        state, warning = np.zeros((n, nq + 7)), np.ones((n, 2, 3), np.int32)
    else:
        q, v, c = (np.zeros((k, w), np.float32) for w in (nq, 6, 1))
        oq = ov = oc = 0
        state, warning = K.NO_STATE, K.NO_WARNING
    return dict(k=k, num_envs=n, ids_out=np.zeros(k, np.int32), q=q, oq=oq, v=v, ov=ov,
                ctrl=c, oc=oc, act_qadr=np.array([7]), ctrl_lo=np.array([-1.0]),
                ctrl_hi=np.array([1.0]), xyzw=not f64, fresh=np.ones(n, bool),
                stale=np.zeros(n, bool), state=state, warning=warning,
                kept=np.full((2, k), -1, np.int32), nq=nq, nv=6)


@pytest.mark.parametrize("f64", [False, True])
def test_a_bound_pass_writes_what_prepare_rows_writes(f64: bool) -> None:
    """bind_pass binds every argument but the caller's ids and rows: on int64 ids and
    float64 rows in any layout (C, Fortran, strided, read-only, unaligned) it writes
    exactly what prepare_rows writes with the same arrays, and finds kept ids."""
    from resettrace.sim.backends import _kernels as K

    k, nq = 2, 8
    q = np.zeros((k, nq))
    q[:, 3] = [1.0, 2.0]
    q[:, 7] = [0.25, 3.0]
    v = np.arange(12.0).reshape(k, 6)
    ids = np.array([1, 9, 6, 9])[::2]  # strided
    wide = np.zeros((k, 2 * nq))
    wide[:, ::2] = q
    buf = np.zeros(q.nbytes + 1, np.uint8)
    unaligned = np.frombuffer(buf.data, np.float64, q.size, offset=1).reshape(q.shape)
    unaligned[...] = q
    frozen = q.copy()
    frozen.flags.writeable = False
    for odd in (q, np.asfortranarray(q), wide[:, ::2], frozen, unaligned):
        got, ref = _bind_args(k, nq, f64=f64), _bind_args(k, nq, f64=f64)
        got["kept"][1] = [1, 6]
        bound = K.bind_pass(**got)
        assert bound is not None
        call, ctx, pinned = bound
        assert any(a is got["fresh"] for a in pinned)
        assert call(ids, odd, v, True, ctx) == (K.OK, 1, 0)  # kept in row 1
        assert K.prepare_rows(
            np.array([1, 6]), 8, ref["ids_out"], q, v, K.NO_ORDER, ref["q"], ref["oq"],
            ref["v"], ref["ov"], ref["ctrl"], ref["oc"], ref["act_qadr"], ref["ctrl_lo"],
            ref["ctrl_hi"], not f64, ref["fresh"], ref["stale"], True, ref["state"],
            ref["warning"], K.NO_KEPT) == (K.OK, -1, 0)
        for name, a in got.items():
            if isinstance(a, np.ndarray) and name != "kept":
                np.testing.assert_array_equal(a, ref[name], err_msg=name)
        np.testing.assert_array_equal(got["ids_out"], [1, 6])
        assert not got["fresh"][[1, 6]].any() and got["stale"][[1, 6]].all()
        if f64:  # the rows went to the state rows and their warnings were zeroed
            np.testing.assert_array_equal(got["state"][[1, 6]], got["q"])
            assert not got["warning"][[1, 6]].any() and got["warning"][0].all()
        assert call(ids, odd[:1], v[:1], True, ctx) == (K.BAD_SHAPE, 0, 0)  # other k
        assert call(ids, wide, v, True, ctx) == (K.BAD_SHAPE, 0, 0)  # other width


def test_bind_pass_binds_only_what_the_pass_can_index() -> None:
    """bind_pass returns None (the caller uses prepare_rows) for arrays of another dtype or
    layout than it binds, or too small for what the pass indexes unchecked."""
    from resettrace.sim.backends import _kernels as K

    assert K.bind_pass(**_bind_args(3, 8)) is not None
    for change in ({"q": np.zeros((3, 8))},  # float64 scratch of its own
                   {"ctrl": np.zeros((3, 1), np.float16)},
                   {"v": np.zeros((6, 3), np.float32).T},  # Fortran
                   {"fresh": np.ones(4, bool)},  # shorter than num_envs
                   {"kept": np.full((2, 4), -1, np.int32)},  # sets of another size
                   {"ids_out": np.zeros(2, np.int32)},
                   {"act_qadr": np.array([8])},  # past qpos
                   {"ctrl_lo": np.array([-1.0, -1.0])},
                   {"state": np.zeros((8, 15))}):  # state rows without float64 rows
        assert K.bind_pass(**(_bind_args(3, 8) | change)) is None, change
    ro = _bind_args(3, 8)
    ro["stale"].flags.writeable = False
    assert K.bind_pass(**ro) is None
    assert K.bind_pass(**_bind_args(3, 8, f64=True)) is not None
    short = _bind_args(3, 8, f64=True)
    short["warning"] = np.zeros((4, 2, 3), np.int32)
    assert K.bind_pass(**short) is None


def test_the_pass_finds_the_ids_among_the_kept_id_sets() -> None:
    """Given id sets kept by the caller (one per row, -1 where none), the pass returns the
    row that holds exactly its sorted ids, -1 when none does or they hold another size."""
    from resettrace.sim.backends import _kernels as K

    k, nq = 3, 8
    q = np.zeros((k, nq))
    q[:, 3] = 1.0

    def run(ids: list[int], kept: np.ndarray) -> tuple[int, int, int]:
        return K.prepare_rows(np.array(ids), 10, np.zeros(k, np.int32), q,
                              np.zeros((k, 6)), K.NO_ORDER, np.zeros((k, nq)), 0,
                              np.zeros((k, 6)), 0, np.zeros((k, 1)), 0, np.array([7]),
                              np.array([-1.0]), np.array([1.0]), False, np.ones(10, bool),
                              np.zeros(10, bool), True, K.NO_STATE, K.NO_WARNING, kept)

    kept = np.full((4, k), -1, np.int32)
    kept[1] = [2, 5, 8]
    kept[2] = [2, 5, 9]
    kept[3] = [1, 5, 9]
    assert run([2, 5, 9], kept) == (K.OK, 2, 0)
    assert run([2, 5, 8], kept) == (K.OK, 1, 0)
    assert run([1, 5, 9], kept) == (K.OK, 3, 0)
    assert run([2, 6, 9], kept) == (K.OK, -1, 0)  # a prefix or a suffix is not a match
    assert run([2, 5, 9], np.full((4, 2), 2, np.int32)) == (K.OK, -1, 0)
    assert run([2, 5, 9], K.NO_KEPT) == (K.OK, -1, 0)
    assert run([9, 5, 2], kept)[0] == K.UNSORTED  # (the caller sorts, no slot then)


@pytest.mark.parametrize("f64", [False, True])
def test_the_pass_refuses_a_quaternion_it_cannot_normalise_and_marks_nothing(f64: bool
                                                                              ) -> None:
    """Zero, or finite parts whose squared norm overflows float64 (it would normalise to
    zeros): BAD_QUAT at the caller's row in float64 rows, no row marked or scattered; in
    float32 rows the value is out of range first (BAD_QPOS at its column)."""
    from resettrace.sim.backends import _kernels as K

    k, nq = 2, 8
    for x in (0.0, 1e200, 1.7e308, -1e308):
        q = np.zeros((k, nq))
        q[:, 3] = 1.0
        q[1, 3:5] = x
        args = _bind_args(k, nq, f64=f64)
        call, ctx, _ = K.bind_pass(**args)
        got = call(np.array([2, 5]), q, np.zeros((k, 6)), True, ctx)
        assert got == ((K.BAD_QUAT, 1, 3) if f64 or x == 0.0 else (K.BAD_QPOS, 1, 3)), x
        assert args["fresh"].all() and not args["stale"].any()
        if f64:
            assert not args["state"].any() and args["warning"].all()
    q = np.zeros((k, nq))
    q[:, 3:5] = [[2.0, 0.0], [1e150, 1e150]]  # long, but its square sum is finite
    args = _bind_args(k, nq, f64=True)
    call, ctx, _ = K.bind_pass(**args)
    assert call(np.array([2, 5]), q, np.zeros((k, 6)), True, ctx) == (K.OK, -1, 0)
    np.testing.assert_allclose(args["q"][:, 3:5], [[1.0, 0.0], [np.sqrt(0.5)] * 2])
