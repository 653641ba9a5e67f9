"""Motion tracking: the clip format, the start-frame sampler and the task on real MuJoCo."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import resettrace
from resettrace import catalog as C
from resettrace.sim.tasks.motion import (
    CLIP_KEYS,
    MotionClip,
    MotionSampler,
    generate_clip,
    load_clip,
    qangle,
    save_clip,
)

N = 16
NO_NOISE = {"root_pos_noise": (0.0, 0.0, 0.0), "root_rot_noise": (0.0, 0.0, 0.0),
            "root_lin_vel_noise": (0.0, 0.0, 0.0), "root_ang_vel_noise": (0.0, 0.0, 0.0),
            "joint_pos_noise": 0.0}


@pytest.fixture(scope="module")
def clip() -> MotionClip:
    return generate_clip(seconds=2.0, fps=50)


def _arrays(c: MotionClip) -> dict[str, np.ndarray]:
    return {k: np.asarray(getattr(c, k)) for k in CLIP_KEYS}


# -- clip -------------------------------------------------------------------------------------
def test_generate_clip_is_deterministic_and_valid(clip: MotionClip) -> None:
    again = generate_clip(seconds=2.0, fps=50)
    for key, value in _arrays(clip).items():
        np.testing.assert_array_equal(value, _arrays(again)[key], err_msg=key)
    other = generate_clip(seconds=2.0, fps=50, seed=1)
    assert not np.array_equal(other.joint_pos, clip.joint_pos)
    t, b = 101, 14
    assert clip.fps == 50.0 and clip.num_frames == t and len(clip.body_names) == b
    assert clip.body_names[0] == "pelvis" and "torso_link" in clip.body_names
    assert clip.joint_pos.shape == clip.joint_vel.shape == (t, 29)
    assert clip.body_pos.shape == clip.body_lin_vel.shape == clip.body_ang_vel.shape == (t, b, 3)
    assert clip.body_quat.shape == (t, b, 4)
    np.testing.assert_allclose(np.linalg.norm(clip.body_quat, axis=-1), 1.0, atol=1e-12)
    # the pelvis walks forward at 0.5 m/s, near the stand height, and the legs move
    assert clip.body_pos[-1, 0, 0] - clip.body_pos[0, 0, 0] == pytest.approx(1.0)
    assert np.all(np.diff(clip.body_pos[:, 0, 0]) > 0)
    assert 0.65 < clip.body_pos[:, 0, 2].min() <= clip.body_pos[:, 0, 2].max() < 0.8
    assert np.ptp(clip.joint_pos[:, 0]) > 0.3 and np.ptp(clip.joint_pos[:, 3]) > 0.2
    # velocities are the finite differences of the positions
    np.testing.assert_allclose(clip.joint_vel[1:-1],
                               (clip.joint_pos[2:] - clip.joint_pos[:-2]) * 25.0, atol=1e-9)
    np.testing.assert_allclose(clip.body_lin_vel[:, 0, 0], 0.5, atol=1e-9)
    assert np.abs(clip.body_ang_vel[:, 1:]).max() > 0.1  # the limbs rotate
    with pytest.raises(ValueError, match="read-only"):
        clip.joint_pos[0, 0] = 1.0


def test_save_load_round_trip(clip: MotionClip, tmp_path: Path) -> None:
    path = save_clip(clip, tmp_path / "walk")
    assert path == tmp_path / "walk.npz" and path.is_file()
    loaded = load_clip(path)
    assert loaded.body_names == clip.body_names and loaded.fps == clip.fps
    for key, value in _arrays(clip).items():
        np.testing.assert_array_equal(_arrays(loaded)[key], value, err_msg=key)


def _break_missing(a: dict) -> None:
    del a["body_quat"]


def _break_shape(a: dict) -> None:
    a["body_pos"] = a["body_pos"][:, :5]


def _break_nan(a: dict) -> None:
    a["joint_vel"] = a["joint_vel"].copy()
    a["joint_vel"][3, 2] = np.nan


def _break_quat(a: dict) -> None:
    a["body_quat"] = a["body_quat"].copy()
    a["body_quat"][7, 2] = 0.0


def _break_fps(a: dict) -> None:
    a["fps"] = np.float64(0.0)


@pytest.mark.parametrize(("breaker", "message"), [
    (_break_missing, r"missing key\(s\) \['body_quat'\]"),
    (_break_shape, r"body_pos has shape \(101, 5, 3\), expected \(T, B, 3\) = \(101, 14, 3\)"),
    (_break_nan, r"joint_vel has 1 non-finite value\(s\), the first at index \(3, 2\)"),
    (_break_quat, r"non-unit quaternion.*frame 7, body 'left_hip_roll_link' \(norm 0\)"),
    (_break_fps, r"fps must be a finite number > 0"),
], ids=["missing_key", "wrong_shape", "nan", "zero_quaternion", "zero_fps"])
def test_malformed_clip_files_name_the_problem(clip: MotionClip, tmp_path: Path, breaker,
                                               message: str) -> None:
    arrays = _arrays(clip)
    breaker(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=message) as err:
        load_clip(path)
    assert str(path) in str(err.value)


def test_missing_and_unreadable_clip_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="motion clip not found"):
        load_clip(tmp_path / "nope.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"this is not a zip archive")
    with pytest.raises(ValueError, match="junk.npz"):
        load_clip(junk)


# -- sampler ----------------------------------------------------------------------------------
def test_sampler_start_and_uniform_modes() -> None:
    ids = np.arange(8)
    start = MotionSampler(50, 8, "start", rng=np.random.default_rng(0))
    assert (start.sample(ids) == 0).all()
    uniform = MotionSampler(50, 8, "uniform", rng=np.random.default_rng(0))
    frames = np.concatenate([uniform.sample(ids) for _ in range(500)])
    assert set(frames.tolist()) == set(range(50))
    with pytest.raises(ValueError, match="env ids must be in"):
        uniform.sample(np.array([8]))


def test_adaptive_sampler_shifts_toward_failing_bins() -> None:
    rng = np.random.default_rng(0)
    s = MotionSampler(100, 64, "adaptive", bins=10, ema=0.1, uniform_ratio=0.1, rng=rng)
    ids = np.arange(64)
    np.testing.assert_allclose(s.probabilities, 0.1)
    before = np.concatenate([s.sample(ids) for _ in range(100)])
    assert abs(np.mean(s.bin_of(before) == 7) - 0.1) < 0.03  # uniform: 10% in bin 7
    for _ in range(30):
        s.record_failures(np.array([72, 75, 79]))  # every failure in bin 7
        s.record_failures(np.array([], dtype=np.int64))  # steps without failure decay only
    p = s.probabilities
    # formula: (1 - u) * F_b / sum F + u / B, all failures in bin 7
    assert p[7] == pytest.approx(0.9 + 0.01) and p[0] == pytest.approx(0.01)
    assert p.sum() == pytest.approx(1.0)
    after = np.concatenate([s.sample(ids) for _ in range(100)])
    share = np.mean(s.bin_of(after) == 7)
    assert share > 0.85
    assert after.min() >= 0 and after.max() < 100
    # frames inside the failing bin are all reachable
    assert set(after[s.bin_of(after) == 7].tolist()) == set(range(70, 80))
    s.reset_statistics()
    np.testing.assert_allclose(s.probabilities, 0.1)


def test_sampler_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="modes: adaptive, uniform, start"):
        MotionSampler(10, 4, "greedy")
    with pytest.raises(ValueError, match="ema"):
        MotionSampler(10, 4, ema=0.0)
    with pytest.raises(ValueError, match="sampler mode"):
        resettrace.make_env("g1_motion_tracking", num_envs=2,
                            task_options={"sampler": "greedy"})


# -- the task on MuJoCo -------------------------------------------------------------------------
def _force_failures(env, ids) -> None:
    """Drop the base of ``ids`` to 0.2 m: the anchor height error terminates them."""
    q = np.array(env.backend.get_qpos_rows(ids))
    q[:, 2] = 0.2
    env.backend.set_state(ids, q, np.zeros((len(ids), env.backend.nv)))


def test_env_steps_resets_and_times_the_motion_phases(timing_session, clip) -> None:
    env = resettrace.make_env("g1_motion_tracking", num_envs=N, tracing=timing_session, seed=2,
                              task_options={"clip": clip})
    task = env.task
    assert task.obs_dim == 157 and env.obs.shape == (N, 157) and np.isfinite(env.obs).all()
    rng = np.random.default_rng(0)
    reset_calls = 0
    for i in range(20):
        if i in (3, 11):
            _force_failures(env, np.array([2, 5, 13]))
        _, reward, done, info = env.step(rng.uniform(-0.1, 0.1, (N, env.action_dim)))
        if i in (3, 11):
            assert done[[2, 5, 13]].all() and task.failed[[2, 5, 13]].all()
            assert (reward[[2, 5, 13]] <= 2.0).all()  # at most 3, minus the penalty 1
        reset_calls += int(done.any())
        assert np.isfinite(env.obs).all() and np.isfinite(reward).all()
    assert reset_calls >= 2
    assert task.sampler.bin_failures.sum() > 0  # failures reached the adaptive sampler
    st = timing_session.stats()
    assert st[C.RESET_DONE.key].count == reset_calls
    for phase in (C.DR_RESET_MOTION_SAMPLE, C.DR_RESET_MOTION_LOOKUP, C.DR_RESET_BODY_POSE):
        assert st[phase.key].count == reset_calls, phase.key
        assert 0.0 < st[phase.key].total_ms <= st[C.BY_SPAN[phase.parent].key].total_ms
    # one set_state per reset_done plus the two forced writes: bind's initial state is untraced
    assert st[C.SET_STATE.key].count == reset_calls + 2
    assert set(C.DR_RESET_KEYS[-3:]) == {C.DR_RESET_MOTION_SAMPLE.key,
                                         C.DR_RESET_MOTION_LOOKUP.key, C.DR_RESET_BODY_POSE.key}
    env.close()


def test_reset_rows_start_on_the_sampled_frame(timing_session, clip) -> None:
    env = resettrace.make_env("g1_motion_tracking", num_envs=N, tracing=timing_session, seed=4,
                              task_options={"clip": clip})
    task, cfg = env.task, env.task.config
    ids = np.array([0, 6, 7, 15])
    mask = np.zeros(N, bool)
    mask[ids] = True
    env.reset_done(mask)
    frames = task.start_frame[ids]
    assert (frames < clip.num_frames - 1).all()
    pelvis = env.backend.get_body_pose_rows(ids, ("pelvis",))[:, 0]
    err = np.abs(pelvis[:, :3] - clip.body_pos[frames, 0])
    assert (err <= np.array(cfg.root_pos_noise) + 1e-9).all()
    angle = qangle(pelvis[:, 3:], clip.body_quat[frames, 0])
    assert (angle <= sum(cfg.root_rot_noise) + 1e-9).all() and angle.max() > 0.0
    qpos = env.backend.get_qpos_rows(ids)
    joint_err = np.abs(qpos[:, 7:] - clip.joint_pos[frames])
    assert (joint_err <= cfg.joint_pos_noise + 1e-9).all() and joint_err.max() > 0.0
    lo, hi = env.backend.info.joint_range.T
    assert ((qpos[:, 7:] >= lo - 1e-12) & (qpos[:, 7:] <= hi + 1e-12)).all()
    np.testing.assert_allclose(env.backend.get_qvel_rows(ids)[:, 6:], clip.joint_vel[frames])
    env.close()


def test_without_noise_every_tracked_body_matches_the_clip(timing_session, clip) -> None:
    """Root from the clip's pelvis + clip joints through FK reproduce all clip poses."""
    env = resettrace.make_env("g1_motion_tracking", num_envs=4, tracing=timing_session,
                              task_options={"clip": clip, **NO_NOISE})
    task = env.task
    ids = np.array([1, 3])
    mask = np.zeros(4, bool)
    mask[ids] = True
    env.reset_done(mask)
    frames = task.start_frame[ids]
    pose = env.backend.get_body_pose_rows(ids, task.tracked_bodies)
    np.testing.assert_allclose(pose[..., :3], clip.body_pos[frames], atol=1e-6)
    np.testing.assert_allclose(qangle(pose[..., 3:], clip.body_quat[frames]), 0.0, atol=1e-6)
    # on the reference: no anchor error, full reward, not terminated
    obs = env.obs[ids]
    np.testing.assert_allclose(obs[:, 58:61], 0.0, atol=1e-5)
    np.testing.assert_allclose(obs[:, 61:67], [[1, 0, 0, 1, 0, 0]] * 2, atol=1e-5)
    np.testing.assert_allclose(obs[:, :29], clip.joint_pos[frames], rtol=1e-6)
    task.update_state(env.episode_step, env.last_action, env.obs, env.reward, env.terminated)
    np.testing.assert_allclose(env.reward[ids], 3.0, atol=1e-6)
    assert not env.terminated[ids].any()
    env.close()


def test_reset_observation_matches_update_state(timing_session, clip) -> None:
    """The reset rows' observation (built for k rows) equals the full-batch one."""
    env = resettrace.make_env("g1_motion_tracking", num_envs=N, tracing=timing_session, seed=5,
                              task_options={"clip": clip})
    env.step(np.zeros((N, env.action_dim)))  # the other rows' poses are now a step old
    ids = np.array([0, 7, 8])
    mask = np.zeros(N, bool)
    mask[ids] = True
    env.reset_done(mask)
    reset_obs = env.obs[ids].copy()
    env.task.update_state(env.episode_step, env.last_action, env.obs, env.reward,
                          env.terminated)
    np.testing.assert_allclose(env.obs[ids], reset_obs, rtol=1e-5, atol=1e-5)
    env.close()


def test_motion_spans_nest_under_plan_and_build_observation(trace_session, clip) -> None:
    env = resettrace.make_env("g1_motion_tracking", num_envs=8, tracing=trace_session,
                              task_options={"clip": clip})
    mask = np.zeros(8, bool)
    mask[[1, 2]] = True
    env.reset_done(mask)
    assert trace_session.force_flush()
    spans = trace_session.exporters[0].get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    names = {s.name for s in spans}
    for phase in (C.DR_RESET_MOTION_SAMPLE, C.DR_RESET_MOTION_LOOKUP, C.DR_RESET_BODY_POSE):
        assert phase.span in names
        (span,) = [s for s in spans if s.name == phase.span]
        assert by_id[span.parent.span_id].name == phase.parent
    env.close()


def test_user_clip_file_and_clip_checks(timing_session, clip: MotionClip,
                                        tmp_path: Path) -> None:
    path = save_clip(clip, tmp_path / "user.npz")
    env = resettrace.make_env("g1_motion_tracking", num_envs=2, tracing=timing_session,
                              task_options={"clip_path": str(path), "sampler": "start"})
    assert env.task.clip.num_frames == clip.num_frames
    np.testing.assert_array_equal(env.task.start_frame, 0)
    env.close()
    with pytest.raises(ValueError, match="either clip or clip_path"):
        resettrace.make_env("g1_motion_tracking", num_envs=2,
                            task_options={"clip": clip, "clip_path": str(path)})
    arrays = _arrays(clip)
    order = [1, 0] + list(range(2, len(clip.body_names)))
    swapped = MotionClip(fps=clip.fps, joint_pos=clip.joint_pos, joint_vel=clip.joint_vel,
                         body_names=tuple(clip.body_names[i] for i in order),
                         **{k: arrays[k][:, order] for k in ("body_pos", "body_quat",
                                                             "body_lin_vel", "body_ang_vel")})
    with pytest.raises(ValueError, match="first body must be the floating-base body"):
        resettrace.make_env("g1_motion_tracking", num_envs=2, tracing=timing_session,
                            task_options={"clip": swapped})
