"""Numba kernels of the walk-flat task's per-step state update (``use_numba=True``).

Contract of :func:`walk_flat_update` (one fused pass over the envs, no temporaries):

- inputs (read only): ``qpos`` ``(n, 7 + nj)`` and ``qvel`` ``(n, 6 + nj)`` float64 in the
  contract layout (base xyz + wxyz quaternion + joints; base linear velocity in the world
  frame, angular velocity in the base frame, joints), rows may be strided views of the
  engine's state; ``last_action`` ``(n, na)``, ``command`` ``(n, 3)``, ``phase_offset``
  ``(n,)``, ``default_joint`` ``(nj,)`` float64; ``episode_step`` ``(n,)`` int64;
- scalars: ``dt`` (control period), ``gait_hz``, ``tilt_gz`` (float32 threshold on the base
  frame gravity's z, ``-max_tilt_cos``), ``min_base_height``, ``sigma`` (tracking sigma);
- outputs (written in place, every row): ``obs`` ``(n, 3 + 3 + 2 nj + na + 3 + 2)`` float32,
  ``reward`` ``(n,)`` float64, ``terminated`` ``(n,)`` bool.

It computes exactly what :meth:`resettrace.tasks.g1_walk_flat.G1WalkFlat.update_state`
computes with numpy, in the same floating-point operation order (float64 arithmetic, one
rounding to float32 per observation entry; termination compares the float32 gravity z,
as the numpy path does), so the two paths agree to float32 rounding and their
termination masks are identical.

The kernels validate nothing: the caller checks dtypes, shapes and layouts once when it
binds (``G1WalkFlat.bind``) and passes the same buffers afterwards. They hold no Python
objects and run no tracing: time them from outside, one scope per batched call.

The loop is serial, by measurement on 2 cores (MuJoCo stepping the same envs on 2 threads):
alone, ``parallel=True`` + ``prange`` ran the kernel 1.7x faster at 1024 envs (0.135 ->
0.078 ms p50) and 1.6x at 4096, but inside the env step its gain vanished: at 1024 envs the
p50 of update_state went 0.55 -> 0.48 ms while the mean went 0.55 -> 1.55 ms, and at 4096 both
got worse (p50 1.94 -> 2.20 ms, mean 2.05 -> 4.40 ms): a parallel region waits for its
slowest thread, which shares the two cores with the engine's workers and anything else.
``resettrace bench collector --numba-ab`` measures the serial kernel against numpy.

This module imports numba: import it only when the numba variant is chosen.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["walk_flat_update"]

_TWO_PI = 2.0 * np.pi


@njit(cache=True, inline="always")
def _rotate_inverse(w: float, x: float, y: float, z: float,
                    vx: float, vy: float, vz: float) -> tuple[float, float, float]:
    """World vector ``v`` into the frame of the wxyz quaternion; the operation order of
    ``resettrace.tasks.quat.quat_rotate_inverse``: ``v - w t + u x t`` with ``t = 2 u x v``."""
    tx = 2.0 * (y * vz - z * vy)
    ty = 2.0 * (z * vx - x * vz)
    tz = 2.0 * (x * vy - y * vx)
    return (vx - w * tx + (y * tz - z * ty),
            vy - w * ty + (z * tx - x * tz),
            vz - w * tz + (x * ty - y * tx))


@njit(cache=True)
def walk_flat_update(qpos: np.ndarray, qvel: np.ndarray, last_action: np.ndarray,
                     command: np.ndarray, phase_offset: np.ndarray, episode_step: np.ndarray,
                     default_joint: np.ndarray, dt: float, gait_hz: float, tilt_gz: np.float32,
                     min_base_height: float, sigma: float, obs: np.ndarray, reward: np.ndarray,
                     terminated: np.ndarray) -> None:
    """Observation rows, reward and termination of every env (see the module contract)."""
    n = qpos.shape[0]
    nj = default_joint.shape[0]
    na = last_action.shape[1]
    o_jpos = 6
    o_jvel = o_jpos + nj
    o_act = o_jvel + nj
    o_cmd = o_act + na
    o_phase = o_cmd + 3
    for i in range(n):
        w, x, y, z = qpos[i, 3], qpos[i, 4], qpos[i, 5], qpos[i, 6]
        obs[i, 0] = qvel[i, 3]  # free-joint angular velocity is in the base frame
        obs[i, 1] = qvel[i, 4]
        obs[i, 2] = qvel[i, 5]
        gx, gy, gz = _rotate_inverse(w, x, y, z, 0.0, 0.0, -1.0)
        obs[i, 3] = gx
        obs[i, 4] = gy
        gz32 = np.float32(gz)
        obs[i, 5] = gz32
        for j in range(nj):
            obs[i, o_jpos + j] = qpos[i, 7 + j] - default_joint[j]
        for j in range(nj):
            obs[i, o_jvel + j] = qvel[i, 6 + j]
        for j in range(na):
            obs[i, o_act + j] = last_action[i, j]
        obs[i, o_cmd] = command[i, 0]
        obs[i, o_cmd + 1] = command[i, 1]
        obs[i, o_cmd + 2] = command[i, 2]
        phase = (episode_step[i] * dt * gait_hz + phase_offset[i]) % 1.0
        angle = _TWO_PI * phase
        obs[i, o_phase] = math.sin(angle)
        obs[i, o_phase + 1] = math.cos(angle)

        # the numpy path compares the float32 observation entry in float32
        term = gz32 > tilt_gz or qpos[i, 2] < min_base_height
        terminated[i] = term
        lx, ly, _ = _rotate_inverse(w, x, y, z, qvel[i, 0], qvel[i, 1], qvel[i, 2])
        ex = command[i, 0] - lx
        ey = command[i, 1] - ly
        eyaw = command[i, 2] - qvel[i, 5]
        r = math.exp(-(ex * ex + ey * ey) / sigma) + 0.5 * math.exp(-(eyaw * eyaw) / sigma)
        if term:
            r -= 1.0
        reward[i] = r
