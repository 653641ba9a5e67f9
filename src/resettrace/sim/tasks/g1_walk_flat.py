"""G1 walk-flat: follow a joystick velocity command on flat ground.

Actor observation (98 = 3 + 3 + 29 + 29 + 29 + 3 + 2): base angular velocity
(gyro, base frame), gravity in the base frame, joint positions minus the stand
pose, joint velocities, last action, command (vx, vy, yaw rate), gait phase
(sin, cos). Termination: base tilted past ``max_tilt_cos`` or below
``min_base_height``; truncation after ``max_episode_steps``. Reset: the stand
keyframe with xy and yaw noise and base velocity noise.

``update_state`` has two implementations that compute the same observation, reward and
termination: numpy (the default) and a fused numba kernel
(:func:`resettrace.sim.tasks.kernels.walk_flat_update`), chosen per env with
``use_numba=True`` (``make_env("g1_walk_flat", ..., task_options={"use_numba": True})``).
With numba on, ``bind`` validates the state views once and compiles the kernel there, so
no compile lands in a timed step; numba is imported only then. The reset rows'
observation (``observe`` on k rows) stays numpy in both variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from resettrace.sim.contract import SimBackend
from resettrace.sim.tasks._common import G1Task, check_array
from resettrace.sim.tasks.quat import qmul, qrot_inv, yaw_quat

__all__ = ["G1WalkFlat", "WalkFlatConfig"]

_GRAVITY = np.array([0.0, 0.0, -1.0])


@dataclass(frozen=True, kw_only=True)
class WalkFlatConfig:
    #: radians of joint target per unit of action
    action_scale: float = 0.25
    #: the control period (s); the physics substeps per env step are control_dt over the
    #: model's timestep (3 for the bundled G1), which must be a whole number
    control_dt: float = 0.02
    #: substeps per env step; None derives them from control_dt and the model's timestep
    #: (a number given must agree with both)
    substeps: int | None = None
    max_episode_steps: int = 1000
    #: terminate when gravity's z in the base frame is above -cos(60 deg)
    max_tilt_cos: float = 0.5
    min_base_height: float = 0.5
    gait_frequency_hz: float = 1.25
    #: uniform command ranges (vx, vy, yaw rate)
    command_range: tuple[tuple[float, float], ...] = ((-1.0, 1.0), (-0.5, 0.5), (-1.0, 1.0))
    reset_xy_noise: float = 0.5
    reset_yaw_noise: float = np.pi
    reset_lin_vel_noise: float = 0.5
    reset_ang_vel_noise: float = 0.5
    #: spread episode starts so that time-outs do not all land on one step
    randomize_initial_episode_step: bool = True
    tracking_sigma: float = 0.25
    #: compute update_state with the fused numba kernel instead of numpy (same results;
    #: numba is imported and the kernel compiled, or loaded from its cache, in ``bind``)
    use_numba: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.substeps is not None and self.substeps < 1) or self.max_episode_steps < 1:
            raise ValueError("substeps and max_episode_steps must be >= 1")
        if not (self.control_dt > 0.0 and math.isfinite(self.control_dt)):
            raise ValueError(f"control_dt must be a finite number > 0, got {self.control_dt}")
        if not 0.0 <= self.max_tilt_cos <= 1.0:
            raise ValueError(f"max_tilt_cos must be in [0, 1], got {self.max_tilt_cos}")


class G1WalkFlat(G1Task):
    """The walk-flat task on any backend that satisfies the contract."""

    name = "g1_walk_flat"
    config: WalkFlatConfig

    def __init__(self, config: WalkFlatConfig | None = None, **overrides: Any) -> None:
        super().__init__(config if config is not None else WalkFlatConfig(**overrides))

    def bind(self, backend: SimBackend, rng: np.random.Generator) -> None:
        self._bind_joints(backend)
        n = backend.num_envs
        self.obs_dim = 3 + 3 + 2 * self.num_joints + self.action_dim + 3 + 2
        self.command = np.zeros((n, 3))
        self._command_lo, self._command_hi = np.array(self.config.command_range).T
        self.phase_offset = np.zeros(n)
        self._dt = self.control_dt
        self._sample_episode(np.arange(n), rng)
        self._tilt_gz = np.float32(-self.config.max_tilt_cos)  # compared in float32, see below
        if self.config.use_numba:
            self._bind_kernel()

    def _bind_kernel(self) -> None:
        """Check the kernel's inputs and compile it (or load it from numba's on-disk cache)
        now, on scratch outputs laid out like NpEnv's buffers, which do not exist yet; the
        first timed step then runs compiled code."""
        from resettrace.sim.tasks.kernels import walk_flat_update

        assert self.backend is not None
        n = self.backend.num_envs
        for name, a, shape in (("default_joint", self.default_joint, (self.num_joints,)),
                               ("command", self.command, (n, 3)),
                               ("phase_offset", self.phase_offset, (n,))):
            check_array(name, a, shape, np.float64)
        self._kernel = walk_flat_update
        self._run_kernel(np.zeros(n, np.int64), np.zeros((n, self.action_dim)),
                         np.empty((n, self.obs_dim), np.float32), np.empty(n),
                         np.empty(n, np.bool_))

    def _run_kernel(self, episode_step: np.ndarray, last_action: np.ndarray,
                    obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray) -> None:
        qpos, qvel = self._kernel_state(episode_step, last_action, obs, reward, terminated)
        c = self.config
        assert self._kernel is not None
        self._kernel(qpos, qvel, last_action, self.command, self.phase_offset, episode_step,
                     self.default_joint, self._dt, c.gait_frequency_hz, self._tilt_gz,
                     c.min_base_height, c.tracking_sigma, obs, reward, terminated)

    def observe(self, qpos: np.ndarray, qvel: np.ndarray, last_action: np.ndarray,
                command: np.ndarray, phase: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Observation rows from state rows (works for the whole batch or k rows)."""
        quat = qpos[:, 3:7]
        nj, na = self.num_joints, self.action_dim
        o = 0
        out[:, o:o + 3] = qvel[:, 3:6]  # free-joint angular velocity is in the base frame
        o += 3
        out[:, o:o + 3] = qrot_inv(quat, np.broadcast_to(_GRAVITY, (len(quat), 3)))
        o += 3
        np.subtract(qpos[:, 7:], self.default_joint, out=out[:, o:o + nj])
        o += nj
        out[:, o:o + nj] = qvel[:, 6:]
        o += nj
        out[:, o:o + na] = last_action
        o += na
        out[:, o:o + 3] = command
        o += 3
        angle = 2.0 * np.pi * phase
        out[:, o] = np.sin(angle)
        out[:, o + 1] = np.cos(angle)
        return out

    def _phase(self, episode_step: np.ndarray, offset: np.ndarray) -> np.ndarray:
        return (episode_step * self._dt * self.config.gait_frequency_hz + offset) % 1.0

    def update_state(self, episode_step: np.ndarray, last_action: np.ndarray,
                     obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray) -> None:
        assert self.backend is not None, "bind() first"
        if self._kernel is not None:
            self._run_kernel(episode_step, last_action, obs, reward, terminated)
            return
        qpos = self.backend.get_qpos_rows(None)
        qvel = self.backend.get_qvel_rows(None)
        self.observe(qpos, qvel, last_action, self.command,
                     self._phase(episode_step, self.phase_offset), obs)
        gravity_z = obs[:, 5]  # float32: the threshold is float32 too, in both variants
        np.logical_or(gravity_z > self._tilt_gz,
                      qpos[:, 2] < self.config.min_base_height, out=terminated)
        lin_vel = qrot_inv(qpos[:, 3:7], qvel[:, 0:3])
        sigma = self.config.tracking_sigma
        err_xy = np.sum((self.command[:, :2] - lin_vel[:, :2]) ** 2, axis=1)
        err_yaw = (self.command[:, 2] - qvel[:, 5]) ** 2
        reward[:] = np.exp(-err_xy / sigma) + 0.5 * np.exp(-err_yaw / sigma)
        reward[terminated] -= 1.0

    # -- reset ---------------------------------------------------------------------------------
    def plan_reset(self, env_ids: np.ndarray, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
        assert self.backend is not None, "bind() first"
        c, k = self.config, len(env_ids)
        qpos = np.tile(self.default_qpos, (k, 1))
        qpos[:, 0:2] += rng.uniform(-c.reset_xy_noise, c.reset_xy_noise, (k, 2))
        yaw = rng.uniform(-c.reset_yaw_noise, c.reset_yaw_noise, k)
        qpos[:, 3:7] = qmul(yaw_quat(yaw), qpos[:, 3:7])
        qvel = np.zeros((k, self.backend.nv))
        qvel[:, 0:2] = rng.uniform(-c.reset_lin_vel_noise, c.reset_lin_vel_noise, (k, 2))
        qvel[:, 3:6] = rng.uniform(-c.reset_ang_vel_noise, c.reset_ang_vel_noise, (k, 3))
        self._sample_episode(env_ids, rng)
        return qpos, qvel

    def _sample_episode(self, env_ids: np.ndarray, rng: np.random.Generator) -> None:
        """A new command and gait phase for the rows' next episode."""
        lo, hi = self._command_lo, self._command_hi
        self.command[env_ids] = rng.uniform(lo, hi, (len(env_ids), 3))
        self.phase_offset[env_ids] = rng.uniform(0.0, 1.0, len(env_ids))

    def reset_observation(self, env_ids: np.ndarray) -> np.ndarray:
        assert self.backend is not None, "bind() first"
        qpos = self.backend.get_qpos_rows(env_ids)
        qvel = self.backend.get_qvel_rows(env_ids)
        out = np.empty((len(env_ids), self.obs_dim), dtype=np.float32)
        no_action = np.zeros((len(env_ids), self.action_dim))
        return self.observe(qpos, qvel, no_action, self.command[env_ids],
                            self.phase_offset[env_ids], out)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "obs_dim": self.obs_dim, "action_dim": self.action_dim,
                "substeps": self.substeps, "physics_dt_s": self.backend.info.physics_dt
                if self.backend is not None else None,
                "sim_s_per_step": self.sim_s_per_step if self.backend is not None else None,
                "max_episode_steps": self.max_episode_steps,
                "use_numba": self.config.use_numba}
