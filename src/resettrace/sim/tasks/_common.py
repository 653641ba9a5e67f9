"""What the G1 tasks share: config fields read at construction, the actuator mapping
(policy action -> position targets around the stand pose), and the checks of the arrays a
compiled ``update_state`` kernel is bound to. numba-free: kernels load only when asked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from resettrace.sim.contract import SimBackend
from resettrace.sim.model_facts import control_substeps

__all__ = ["G1Task", "check_array"]


def check_array(name: str, a: Any, shape: tuple[int, ...], dtype: type,
                rows_only: bool = False) -> None:
    """``a`` is an ndarray of ``shape`` and ``dtype``, C-contiguous (``rows_only``: each row
    contiguous, rows at any stride, as the engine's state views are)."""
    if not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != shape:
        got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"use_numba: {name} must be a {np.dtype(dtype)} array of shape {shape},"
                         f" got {got}")
    ok = a.strides[-1] == a.itemsize if rows_only else a.flags.c_contiguous
    if not ok:
        raise ValueError(f"use_numba: {name} must be "
                         + ("row-contiguous" if rows_only else "C-contiguous"))


class G1Task:
    """Base of the G1 tasks: subclasses set ``obs_dim`` in ``bind`` after ``_bind_joints``."""

    obs_dim: int

    def __init__(self, config: Any) -> None:
        self.config = config
        #: physics substeps per env step (known once bound to a backend's model)
        self.substeps: int = config.substeps or 0
        self.max_episode_steps = config.max_episode_steps
        self.randomize_initial_episode_step = config.randomize_initial_episode_step
        self.backend: SimBackend | None = None
        self._kernel: Callable[..., None] | None = None
        #: the arrays last checked for the kernel; a call with other ones checks them again
        self._checked: tuple[np.ndarray, ...] = ()

    def _bind_joints(self, backend: SimBackend) -> None:
        """Joint and actuator layout of ``backend``; the stand pose is the action origin."""
        info = backend.info
        substeps = control_substeps(self.config.control_dt, info.physics_dt)
        if self.config.substeps is not None and self.config.substeps != substeps:
            raise ValueError(
                f"substeps={self.config.substeps} with the model's {info.physics_dt:g} s "
                f"timestep is {self.config.substeps * info.physics_dt:g} s per env step, not "
                f"control_dt {self.config.control_dt:g} s ({substeps} substeps)")
        self.substeps = substeps
        #: the control period (the task's clock), and the simulated seconds per env step
        #: (substeps x the engine's timestep: equal within the timestep's rounding)
        self.control_dt = float(self.config.control_dt)
        self.sim_s_per_step = substeps * info.physics_dt
        self.backend = backend
        self.num_joints = len(info.joint_names)
        self.action_dim = backend.nu
        self.default_qpos = backend.keyframe_qpos
        self.default_joint = self.default_qpos[7:].copy()
        self._act_default = self.default_joint[info.actuator_joint]
        self._ctrl_lo = info.ctrl_range[:, 0]
        self._ctrl_hi = info.ctrl_range[:, 1]
        self._kernel = None
        self._checked = ()

    def action_to_ctrl(self, action: np.ndarray, out: np.ndarray) -> None:
        np.multiply(action, self.config.action_scale, out=out)
        out += self._act_default
        np.clip(out, self._ctrl_lo, self._ctrl_hi, out=out)

    def _kernel_state(self, episode_step: np.ndarray, last_action: np.ndarray,
                      obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
        """The engine's qpos / qvel views, the kernel's arrays checked when they change."""
        assert self._kernel is not None and self.backend is not None
        qpos = self.backend.get_qpos_rows(None)  # the live engine views: the same arrays
        qvel = self.backend.get_qvel_rows(None)  # every call, so checked once
        arrays = (qpos, qvel, episode_step, last_action, obs, reward, terminated)
        checked = self._checked
        if len(checked) != len(arrays) or any(a is not b for a, b in zip(arrays, checked,
                                                                         strict=True)):
            self._check_kernel_arrays(arrays)
            self._checked = arrays
        return qpos, qvel

    def _check_kernel_arrays(self, arrays: tuple[np.ndarray, ...]) -> None:
        """Dtypes, shapes and layouts the compiled kernel was built for (a mismatch would
        recompile it in a timed step or index out of bounds)."""
        assert self.backend is not None
        n, nj, na = self.backend.num_envs, self.num_joints, self.action_dim
        qpos, qvel, episode_step, last_action, obs, reward, terminated = arrays
        check_array("qpos", qpos, (n, 7 + nj), np.float64, rows_only=True)
        check_array("qvel", qvel, (n, 6 + nj), np.float64, rows_only=True)
        check_array("episode_step", episode_step, (n,), np.int64)
        check_array("last_action", last_action, (n, na), np.float64)
        check_array("obs", obs, (n, self.obs_dim), np.float32)
        check_array("reward", reward, (n,), np.float64)
        check_array("terminated", terminated, (n,), np.bool_)
