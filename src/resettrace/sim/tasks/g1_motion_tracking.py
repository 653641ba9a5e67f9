"""G1 motion tracking: follow the bodies of a reference clip, the torso as anchor.

Each env plays the clip from its own start frame: at episode step ``s`` it tracks
frame ``start + round(s * control_dt * fps)`` (nearest frame, no interpolation).

Actor observation (``4 J + nu + 12`` = 157 on the G1, ``J`` = 29 joints, ``nu`` = 29):

==========  ====  ===================================================================
columns     size  content
==========  ====  ===================================================================
0:29        J     motion command: reference joint positions at the env's frame
29:58       J     motion command: reference joint velocities
58:61       3     anchor position error (reference minus robot torso) in the torso frame
61:67       6     anchor orientation error ``q_robot^-1 q_ref`` as the first two columns
                  of its rotation matrix, row-major (R00, R01, R10, R11, R20, R21)
67:70       3     base angular velocity (gyro, pelvis frame)
70:99       J     joint positions minus the stand keyframe
99:128      J     joint velocities
128:157     nu    last action
==========  ====  ===================================================================

Reward: ``0.5 exp(-|dp_anchor|^2 / sp^2) + 0.5 exp(-ang_anchor^2 / so^2) +
exp(-mean_b |dp_b|^2 / sp^2) + exp(-mean_b ang_b^2 / so^2)``, where the body errors
compare each robot body with the reference body moved onto the robot's anchor (torso
xy, reference height) and turned by the heading difference of the anchors, so body
tracking does not pay for global drift; ``termination_penalty`` is subtracted on a
failure.

Termination (``terminated``):

- *failure* (:attr:`G1MotionTracking.failed`): torso height error above
  ``max_anchor_height_error``, or the gravity direction in the torso frame differing
  from the reference's by more than ``max_anchor_gravity_error`` (vector norm), or any
  end-effector (ankles, wrists) height error above ``max_end_effector_height_error``;
  the frames of failures feed the adaptive start-frame sampler;
- *clip end* (:attr:`G1MotionTracking.clip_end`): the env reached the clip's last
  frame. The task protocol has one ``terminated`` output and ``NpEnv`` truncates only
  on ``max_episode_steps``, so the end of the reference ends the episode as a
  termination, but it is not a failure (the sampler does not count it and no
  penalty applies). ``max_episode_steps`` still truncates long clips.

Reset: a start frame from :class:`~resettrace.sim.tasks.motion.MotionSampler`; the root
pose and velocity of the clip's root body (``body_names[0]``, the pelvis) at that
frame, the clip's joint positions and velocities, plus uniform noise: root position
per axis, root rotation ``Rz(yaw) Ry(pitch) Rx(roll)`` applied on the left, root
linear and angular velocity (world frame), joint positions (clipped to the joint
limits). ``bind`` starts every env that way, so the first observation already tracks
the clip.

Body poses: ``update_state`` reads all envs' poses with ``get_body_pose_rows(None,
...)``; after ``backend.step`` the MuJoCo backend returns the kinematics of the
engine's last call, one substep behind the joint state (accepted: one substep is
1/3 of a control step). ``reset_observation`` reads the reset rows only; their poses
are fresh from ``set_state``.

``update_state`` has two implementations that compute the same frames, observation, reward
and terminations: numpy (the default) and a fused numba kernel
(:func:`resettrace.sim.tasks.kernels.motion_tracking_update`), chosen with ``use_numba=True``
(``make_env("g1_motion_tracking", ..., task_options={"use_numba": True})``). With numba on,
``bind`` validates the clip and state arrays once and compiles the kernel there, so no
compile lands in a timed step; numba is imported only then. The sampler's failure feedback
runs in Python after the kernel, and the reset rows' observation (``observe`` on k rows)
stays numpy in both variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from resettrace import catalog as C
from resettrace.sim.contract import SimBackend
from resettrace.sim.tasks._common import G1Task, check_array
from resettrace.sim.tasks.motion import (
    MotionClip,
    MotionSampler,
    generate_clip,
    load_clip,
    qangle,
    qconj,
    qmul,
    qrot,
    qrot_inv,
    quat_from_euler,
    qyaw,
)
from resettrace.tracing.api import bind, current_recorder
from resettrace.tracing.recorder import NOOP_RECORDER

__all__ = ["G1MotionTracking", "MotionTrackingConfig"]

_GRAVITY = np.array([0.0, 0.0, -1.0])
_Vec3 = tuple[float, float, float]


@dataclass(frozen=True, kw_only=True)
class MotionTrackingConfig:
    #: the reference clip; None with no ``clip_path``: :func:`generate_clip` at the control rate
    clip: MotionClip | None = None
    #: a user clip ``.npz`` (see :mod:`resettrace.sim.tasks.motion`); exclusive with ``clip``
    clip_path: str | Path | None = None
    #: start-frame sampling: "adaptive", "uniform" or "start"
    sampler: str = "adaptive"
    sampler_bins: int = 20
    #: weight of the newest step in the per-bin failure EMA
    sampler_ema: float = 0.01
    #: share of the start-frame probability spread uniformly over the bins
    sampler_uniform_ratio: float = 0.1
    #: the body whose pose error is observed and terminates (must be a clip body)
    anchor_body: str = "torso_link"
    #: bodies whose height error terminates (must be clip bodies)
    end_effector_bodies: tuple[str, ...] = ("left_ankle_roll_link", "right_ankle_roll_link",
                                            "left_wrist_yaw_link", "right_wrist_yaw_link")
    #: reset noise half-widths (uniform): root position x, y, z (m)
    root_pos_noise: _Vec3 = (0.05, 0.05, 0.01)
    #: root rotation roll, pitch, yaw (rad)
    root_rot_noise: _Vec3 = (0.1, 0.1, 0.2)
    #: root linear velocity x, y, z (m/s, world frame)
    root_lin_vel_noise: _Vec3 = (0.5, 0.5, 0.2)
    #: root angular velocity x, y, z (rad/s, world frame)
    root_ang_vel_noise: _Vec3 = (0.52, 0.52, 0.78)
    #: joint positions (rad), then clipped to the joint limits
    joint_pos_noise: float = 0.1
    #: failure thresholds: torso height error (m), gravity-direction difference in the
    #: torso frame (norm of the difference of unit vectors: 0.8 is about 47 degrees),
    #: end-effector height error (m)
    max_anchor_height_error: float = 0.25
    max_anchor_gravity_error: float = 0.8
    max_end_effector_height_error: float = 0.25
    #: reward length scales: position (m) and orientation (rad)
    pos_sigma: float = 0.3
    ori_sigma: float = 0.4
    termination_penalty: float = 1.0
    #: radians of joint target per unit of action
    action_scale: float = 0.25
    #: the control period (s); the physics substeps per env step are control_dt over the
    #: model's timestep (3 for the bundled G1), which must be a whole number
    control_dt: float = 0.02
    #: substeps per env step; None derives them from control_dt and the model's timestep
    #: (a number given must agree with both)
    substeps: int | None = None
    max_episode_steps: int = 500
    #: off by default: sampled start frames already spread episode ends over steps
    randomize_initial_episode_step: bool = False
    #: compute update_state with the fused numba kernel instead of numpy (same results;
    #: numba is imported and the kernel compiled, or loaded from its cache, in ``bind``)
    use_numba: bool = False

    def __post_init__(self) -> None:
        if self.clip is not None and self.clip_path is not None:
            raise ValueError("give either clip or clip_path, not both")
        if self.sampler not in MotionSampler.MODES:
            raise ValueError(f"unknown sampler mode {self.sampler!r}; modes: "
                             f"{', '.join(MotionSampler.MODES)}")
        if (self.substeps is not None and self.substeps < 1) or self.max_episode_steps < 1:
            raise ValueError("substeps and max_episode_steps must be >= 1")
        if not (self.control_dt > 0.0 and math.isfinite(self.control_dt)):
            raise ValueError(f"control_dt must be a finite number > 0, got {self.control_dt}")
        for name in ("root_pos_noise", "root_rot_noise", "root_lin_vel_noise",
                     "root_ang_vel_noise"):
            value = getattr(self, name)
            if len(value) != 3 or min(value) < 0.0:
                raise ValueError(f"{name} must be three values >= 0, got {value}")
        if self.joint_pos_noise < 0.0:
            raise ValueError(f"joint_pos_noise must be >= 0, got {self.joint_pos_noise}")
        for name in ("max_anchor_height_error", "max_anchor_gravity_error",
                     "max_end_effector_height_error", "pos_sigma", "ori_sigma"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


class G1MotionTracking(G1Task):
    """The motion-tracking task on any backend that satisfies the contract."""

    name = "g1_motion_tracking"
    config: MotionTrackingConfig
    #: its reset observation reads the reset rows' body poses right after set_state: eager
    #: kinematics there cost less than a second engine call at the read (measured: lazy
    #: reset_done +5-7% on both backends)
    reads_reset_poses = True

    def __init__(self, config: MotionTrackingConfig | None = None, **overrides: Any) -> None:
        super().__init__(config if config is not None else MotionTrackingConfig(**overrides))

    # -- bind ----------------------------------------------------------------------------------
    def _load_clip(self, backend: SimBackend) -> MotionClip:
        c = self.config
        if c.clip is not None:
            return c.clip
        if c.clip_path is not None:
            return load_clip(c.clip_path)
        # from the model being simulated, posed from its own keyframe
        return generate_clip(backend.info.model_path, fps=int(round(1.0 / c.control_dt)))

    def _check_clip(self, clip: MotionClip, backend: SimBackend) -> MotionClip:
        """The clip checked against the model, its joints mapped to the model's by name."""
        info, c = backend.info, self.config
        clip = clip.for_joints(tuple(info.joint_names))
        if len(info.body_names) < 2 or clip.body_names[0] != info.body_names[1]:
            raise ValueError(f"the clip's first body must be the floating-base body "
                             f"{info.body_names[1:2]}, got {clip.body_names[0]!r}")
        missing = [b for b in clip.body_names if b not in info.body_names]
        if missing:
            raise ValueError(f"clip bodies {missing} are not in the model")
        for b in (c.anchor_body, *c.end_effector_bodies):
            if b not in clip.body_names:
                raise ValueError(f"body {b!r} is not tracked by the clip; clip bodies: "
                                 f"{', '.join(clip.body_names)}")
        return clip

    def bind(self, backend: SimBackend, rng: np.random.Generator) -> None:
        c = self.config
        clip = self._check_clip(self._load_clip(backend), backend)
        self._bind_joints(backend)
        self.clip = clip
        n, info = backend.num_envs, backend.info
        self.tracked_bodies: tuple[str, ...] = clip.body_names
        self._anchor = clip.body_names.index(c.anchor_body)
        self._ee = np.array([clip.body_names.index(b) for b in c.end_effector_bodies], np.intp)
        nj = self.num_joints
        self.obs_dim = 2 * nj + 3 + 6 + 3 + 2 * nj + self.action_dim
        self._joint_lo = info.joint_range[:, 0]
        self._joint_hi = info.joint_range[:, 1]
        self._last_frame = clip.num_frames - 1
        self._frames_per_step = clip.fps * self.control_dt
        self._noise_scale = np.concatenate([c.root_pos_noise, c.root_rot_noise,
                                            c.root_lin_vel_noise, c.root_ang_vel_noise,
                                            np.full(nj, c.joint_pos_noise)])
        #: per env: the episode's start frame, the episode step it started at, the frame
        #: of the last update_state, and why it ended there
        self.start_frame = np.zeros(n, dtype=np.int64)
        self.step_offset = np.zeros(n, dtype=np.int64)
        self.frame = np.zeros(n, dtype=np.int64)
        self.failed = np.zeros(n, dtype=bool)
        self.clip_end = np.zeros(n, dtype=bool)
        # start frames exclude the last frame: an episode there would end at once
        self.sampler = MotionSampler(clip.num_frames - 1, n, c.sampler, bins=c.sampler_bins,
                                     ema=c.sampler_ema, uniform_ratio=c.sampler_uniform_ratio,
                                     rng=rng)
        # every env starts on the clip (untraced, as the backend's own initial reset)
        ids = np.arange(n)
        frames = self.sampler.sample(ids, rng)
        qpos, qvel = self._initial_state(frames, rng)
        self.start_frame[:] = self.frame[:] = frames
        with bind(NOOP_RECORDER):
            backend.set_state(ids, qpos, qvel)
        # the first update_state (the env's initial observation) fixes step_offset: the
        # env may have randomised the episode steps after bind
        self._offset_pending = True
        if c.use_numba:
            self._bind_kernel()

    def _bind_kernel(self) -> None:
        """Check the kernel's fixed inputs (clip, per-env bookkeeping) and compile it (or
        load it from numba's on-disk cache) now, on scratch outputs laid out like NpEnv's
        buffers, which do not exist yet; the first timed step then runs compiled code."""
        from resettrace.sim.tasks.kernels import motion_tracking_update

        assert self.backend is not None
        clip, n, nj = self.clip, self.backend.num_envs, self.num_joints
        t, nb = clip.num_frames, len(self.tracked_bodies)
        for name, a, shape in (("clip.joint_pos", clip.joint_pos, (t, nj)),
                               ("clip.joint_vel", clip.joint_vel, (t, nj)),
                               ("clip.body_pos", clip.body_pos, (t, nb, 3)),
                               ("clip.body_quat", clip.body_quat, (t, nb, 4)),
                               ("default_joint", self.default_joint, (nj,))):
            check_array(name, a, shape, np.float64)
        for name, a in (("start_frame", self.start_frame), ("step_offset", self.step_offset),
                        ("frame", self.frame)):
            check_array(name, a, (n,), np.int64)
        for name, a in (("failed", self.failed), ("clip_end", self.clip_end)):
            check_array(name, a, (n,), np.bool_)
        check_array("end_effectors", self._ee, (len(self._ee),), np.intp)
        self._kernel = motion_tracking_update
        # warm-up on copies: the compile must not move the task's frames or clip ends
        frame, clip_end, failed = self.frame.copy(), self.clip_end.copy(), self.failed.copy()
        self._run_kernel(np.zeros(n, np.int64), np.zeros((n, self.action_dim)),
                         np.empty((n, self.obs_dim), np.float32), np.empty(n),
                         np.empty(n, np.bool_))
        self.frame[:], self.clip_end[:], self.failed[:] = frame, clip_end, failed

    def _run_kernel(self, episode_step: np.ndarray, last_action: np.ndarray,
                    obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray) -> None:
        qpos, qvel = self._kernel_state(episode_step, last_action, obs, reward, terminated)
        assert self._kernel is not None and self.backend is not None
        pose = self.backend.get_body_pose_rows(None, self.tracked_bodies)
        n, nb = len(self.frame), len(self.tracked_bodies)
        # a new array every call: its shape and layout are checked every call (cheap)
        check_array("body poses", pose, (n, nb, 7), np.float64)
        c, clip = self.config, self.clip
        self._kernel(qpos, qvel, pose, last_action, episode_step, self.step_offset,
                     self.start_frame, clip.joint_pos, clip.joint_vel, clip.body_pos,
                     clip.body_quat, self.default_joint, self._ee, self._anchor,
                     self._last_frame, self._frames_per_step, c.max_anchor_height_error,
                     c.max_anchor_gravity_error, c.max_end_effector_height_error,
                     c.pos_sigma ** 2, c.ori_sigma ** 2, c.termination_penalty, self.frame,
                     self.clip_end, self.failed, obs, reward, terminated)

    def observe(self, frames: np.ndarray, pose: np.ndarray, qpos: np.ndarray,
                qvel: np.ndarray, last_action: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Observation rows from clip frames, tracked body poses ``(k, B, 7)`` and state
        rows (works for the whole batch or k rows)."""
        clip, a = self.clip, self._anchor
        nj, na = self.num_joints, self.action_dim
        o = 0
        out[:, o:o + nj] = clip.joint_pos[frames]
        o += nj
        out[:, o:o + nj] = clip.joint_vel[frames]
        o += nj
        robot_quat = pose[:, a, 3:7]
        out[:, o:o + 3] = qrot_inv(robot_quat, clip.body_pos[frames, a] - pose[:, a, 0:3])
        o += 3
        out[:, o:o + 6] = _rot6(qmul(qconj(robot_quat), clip.body_quat[frames, a]))
        o += 6
        out[:, o:o + 3] = qvel[:, 3:6]  # free-joint angular velocity is in the base frame
        o += 3
        np.subtract(qpos[:, 7:], self.default_joint, out=out[:, o:o + nj])
        o += nj
        out[:, o:o + nj] = qvel[:, 6:]
        o += nj
        out[:, o:o + na] = last_action
        return out

    def update_state(self, episode_step: np.ndarray, last_action: np.ndarray,
                     obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray) -> None:
        assert self.backend is not None, "bind() first"
        if self._offset_pending:
            self.step_offset[:] = episode_step
            self._offset_pending = False
        if self._kernel is not None:
            self._run_kernel(episode_step, last_action, obs, reward, terminated)
            self.sampler.record_failures(self.frame[self.failed])
            return
        c, clip, a = self.config, self.clip, self._anchor
        qpos = self.backend.get_qpos_rows(None)
        qvel = self.backend.get_qvel_rows(None)
        pose = self.backend.get_body_pose_rows(None, self.tracked_bodies)
        elapsed = (episode_step - self.step_offset) * self._frames_per_step
        frame = self.start_frame + np.floor(elapsed + 0.5).astype(np.int64)
        np.greater_equal(frame, self._last_frame, out=self.clip_end)
        np.minimum(frame, self._last_frame, out=self.frame)
        frames = self.frame
        self.observe(frames, pose, qpos, qvel, last_action, obs)

        ref_pos, ref_quat = clip.body_pos[frames], clip.body_quat[frames]
        pos, quat = pose[:, :, 0:3], pose[:, :, 3:7]
        # anchor errors
        anchor_pos_err = np.sum((ref_pos[:, a] - pos[:, a]) ** 2, axis=1)
        anchor_ang = qangle(ref_quat[:, a], quat[:, a])
        # bodies: the reference moved onto the robot's anchor and turned by the heading error
        turn = quat_from_euler(np.stack([np.zeros_like(anchor_ang), np.zeros_like(anchor_ang),
                                         qyaw(quat[:, a]) - qyaw(ref_quat[:, a])], axis=1))
        origin = pos[:, a].copy()
        origin[:, 2] = ref_pos[:, a, 2]
        target_pos = origin[:, None] + qrot(turn[:, None], ref_pos - ref_pos[:, a:a + 1])
        target_quat = qmul(turn[:, None], ref_quat)
        body_pos_err = np.mean(np.sum((target_pos - pos) ** 2, axis=2), axis=1)
        body_ang_err = np.mean(qangle(target_quat, quat) ** 2, axis=1)
        sp2, so2 = c.pos_sigma ** 2, c.ori_sigma ** 2
        reward[:] = (0.5 * np.exp(-anchor_pos_err / sp2) + 0.5 * np.exp(-anchor_ang ** 2 / so2)
                     + np.exp(-body_pos_err / sp2) + np.exp(-body_ang_err / so2))

        # failures: anchor height and gravity direction, end-effector heights
        gravity = np.broadcast_to(_GRAVITY, (len(frames), 3))
        gravity_err = np.linalg.norm(qrot_inv(ref_quat[:, a], gravity)
                                     - qrot_inv(quat[:, a], gravity), axis=1)
        ee = self._ee
        ee_err = np.abs(ref_pos[:, ee, 2] - pos[:, ee, 2]).max(axis=1)
        failed = self.failed
        np.greater(np.abs(ref_pos[:, a, 2] - pos[:, a, 2]), c.max_anchor_height_error,
                   out=failed)
        failed |= gravity_err > c.max_anchor_gravity_error
        failed |= ee_err > c.max_end_effector_height_error
        np.logical_or(failed, self.clip_end, out=terminated)
        reward[failed] -= c.termination_penalty
        self.sampler.record_failures(frames[failed])

    # -- reset ---------------------------------------------------------------------------------
    def _initial_state(self, frames: np.ndarray, rng: np.random.Generator
                       ) -> tuple[np.ndarray, np.ndarray]:
        """qpos/qvel rows (contract layout) of the clip's root and joints at ``frames``,
        plus the configured noise."""
        assert self.backend is not None
        clip, k, nj = self.clip, len(frames), self.num_joints
        # one draw for every noise term: [pos 3, rot 3, lin vel 3, ang vel 3, joints nj]
        noise = self._noise_scale * rng.uniform(-1.0, 1.0, (k, 12 + nj))
        qpos = np.empty((k, self.backend.nq))
        qvel = np.empty((k, self.backend.nv))
        qpos[:, 0:3] = clip.body_pos[frames, 0] + noise[:, 0:3]
        quat = qmul(quat_from_euler(noise[:, 3:6]), clip.body_quat[frames, 0])
        qpos[:, 3:7] = quat
        np.clip(clip.joint_pos[frames] + noise[:, 12:], self._joint_lo, self._joint_hi,
                out=qpos[:, 7:])
        qvel[:, 0:3] = clip.body_lin_vel[frames, 0] + noise[:, 6:9]
        ang_world = clip.body_ang_vel[frames, 0] + noise[:, 9:12]
        qvel[:, 3:6] = qrot_inv(quat, ang_world)  # free-joint angular velocity is local
        qvel[:, 6:] = clip.joint_vel[frames]
        return qpos, qvel

    def plan_reset(self, env_ids: np.ndarray, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Sample start frames, then the rows' state from the clip; the env sets the rows'
        episode step to 0 after the reset, so their step offset is 0."""
        assert self.backend is not None, "bind() first"
        rec = current_recorder()
        with rec.scope(C.DR_RESET_MOTION_SAMPLE):
            frames = self.sampler.sample(env_ids, rng)
            self.start_frame[env_ids] = frames
            self.frame[env_ids] = frames
            self.step_offset[env_ids] = 0
        with rec.scope(C.DR_RESET_MOTION_LOOKUP):
            return self._initial_state(frames, rng)

    def reset_observation(self, env_ids: np.ndarray) -> np.ndarray:
        assert self.backend is not None, "bind() first"
        with current_recorder().scope(C.DR_RESET_BODY_POSE):
            pose = self.backend.get_body_pose_rows(env_ids, self.tracked_bodies)
        qpos = self.backend.get_qpos_rows(env_ids)
        qvel = self.backend.get_qvel_rows(env_ids)
        k = len(env_ids)
        out = np.empty((k, self.obs_dim), dtype=np.float32)
        return self.observe(self.start_frame[env_ids], pose, qpos, qvel,
                            np.zeros((k, self.action_dim)), out)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "substeps": self.substeps,
                               "max_episode_steps": self.max_episode_steps,
                               "sampler": self.config.sampler,
                               "use_numba": self.config.use_numba}
        if self.backend is not None:
            out.update(physics_dt_s=self.backend.info.physics_dt,
                       sim_s_per_step=self.sim_s_per_step)
            out.update(obs_dim=self.obs_dim, action_dim=self.action_dim,
                       clip_frames=self.clip.num_frames, clip_fps=self.clip.fps,
                       tracked_bodies=list(self.tracked_bodies),
                       anchor_body=self.config.anchor_body)
        return out


def _rot6(q: np.ndarray) -> np.ndarray:
    """The first two columns of the rotation matrices of ``(k, 4)`` wxyz quaternions,
    row-major: (R00, R01, R10, R11, R20, R21)."""
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    return np.stack([1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z),
                     2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z),
                     2.0 * (x * z - w * y), 2.0 * (y * z + w * x)], axis=1)
