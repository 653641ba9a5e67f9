"""Numba kernels of the tasks' per-step state updates (``use_numba=True``).

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

It computes exactly what :meth:`resettrace.sim.tasks.g1_walk_flat.G1WalkFlat.update_state`
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

Contract of :func:`motion_tracking_update` (the motion-tracking task, one fused pass over
the envs and their tracked bodies, no temporaries):

- inputs (read only): ``qpos``, ``qvel``, ``last_action`` and ``default_joint`` as above;
  ``pose`` ``(n, B, 7)`` float64 C-contiguous, the tracked bodies' world position and wxyz
  quaternion; ``episode_step``, ``step_offset``, ``start_frame`` ``(n,)`` int64; the clip's
  ``joint_pos``, ``joint_vel`` ``(T, J)``, ``body_pos`` ``(T, B, 3)``, ``body_quat``
  ``(T, B, 4)`` float64 C-contiguous; ``ee`` ``(E,)`` intp (end-effector columns of ``pose``);
- scalars: ``anchor`` (the anchor's column), ``last_frame`` (``T - 1``), ``frames_per_step``
  (``fps * control_dt``), the failure thresholds ``max_height``, ``max_gravity``,
  ``max_ee_height``, the reward scales ``sp2`` and ``so2`` (squared sigmas) and ``penalty``;
- outputs (written in place, every row): ``frame`` ``(n,)`` int64 (clamped to
  ``last_frame``), ``clip_end`` and ``failed`` ``(n,)`` bool, ``obs`` ``(n, 4 J + na + 12)``
  float32, ``reward`` ``(n,)`` float64, ``terminated`` ``(n,)`` bool.

It computes what :meth:`resettrace.sim.tasks.g1_motion_tracking.G1MotionTracking.update_state`
computes with numpy (the sampler's failure feedback stays with the caller), with the numpy
path's operation order in every arithmetic term, so the observations agree to float32
rounding and the failure tests, which use only arithmetic, ``sqrt`` and ``abs``, give
identical masks. The reward uses ``exp`` and ``atan2`` from libm and sums the per-body
errors serially where numpy uses its own SIMD functions and pairwise sums: the two agree to
about 1e-15.

It is serial too: at 1024 envs and 14 bodies it runs in about 0.75 ms alone against an env
step of about 60 ms on 2 cores (``--numba-ab``: update_state 5.5 -> 2.3 ms p50, most of the
rest being the engine's body-pose read-back), so even a perfect 2x from ``prange`` would be
under 1% of the step, below the A/B's noise, with walk-flat's tail-latency risk.

This module imports numba: import it only when the numba variant is chosen.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["motion_tracking_update", "walk_flat_update"]

_TWO_PI = 2.0 * np.pi


@njit(cache=True, inline="always")
def _rotate_inverse(w: float, x: float, y: float, z: float,
                    vx: float, vy: float, vz: float) -> tuple[float, float, float]:
    """World vector ``v`` into the frame of the wxyz quaternion; the operation order of
    ``resettrace.sim.tasks.quat.qrot_inv``: ``v - w t + u x t`` with ``t = 2 u x v``."""
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


# -- motion tracking ---------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _rotate(w: float, x: float, y: float, z: float,
            vx: float, vy: float, vz: float) -> tuple[float, float, float]:
    """``v`` rotated by the wxyz quaternion (frame to world); the operation order of
    ``resettrace.sim.tasks.motion.qrot``: ``v + w t + u x t`` with ``t = 2 u x v``."""
    tx = 2.0 * (y * vz - z * vy)
    ty = 2.0 * (z * vx - x * vz)
    tz = 2.0 * (x * vy - y * vx)
    return (vx + w * tx + (y * tz - z * ty),
            vy + w * ty + (z * tx - x * tz),
            vz + w * tz + (x * ty - y * tx))


@njit(cache=True, inline="always")
def _qmul(aw: float, ax: float, ay: float, az: float, bw: float, bx: float, by: float,
          bz: float) -> tuple[float, float, float, float]:
    """Hamilton product ``a b`` in the operation order of ``resettrace.sim.tasks.motion.qmul``."""
    return (aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw)


@njit(cache=True, inline="always")
def _qangle(aw: float, ax: float, ay: float, az: float, bw: float, bx: float, by: float,
            bz: float) -> float:
    """Rotation angle between ``a`` and ``b`` as ``resettrace.sim.tasks.motion.qangle``."""
    dw, dx, dy, dz = _qmul(aw, -ax, -ay, -az, bw, bx, by, bz)
    return 2.0 * math.atan2(math.sqrt(dx * dx + dy * dy + dz * dz), abs(dw))


@njit(cache=True, inline="always")
def _yaw(w: float, x: float, y: float, z: float) -> float:
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


@njit(cache=True)
def motion_tracking_update(qpos: np.ndarray, qvel: np.ndarray, pose: np.ndarray,
                           last_action: np.ndarray, episode_step: np.ndarray,
                           step_offset: np.ndarray, start_frame: np.ndarray,
                           joint_pos: np.ndarray, joint_vel: np.ndarray, body_pos: np.ndarray,
                           body_quat: np.ndarray, default_joint: np.ndarray, ee: np.ndarray,
                           anchor: int, last_frame: int, frames_per_step: float,
                           max_height: float, max_gravity: float, max_ee_height: float,
                           sp2: float, so2: float, penalty: float, frame: np.ndarray,
                           clip_end: np.ndarray, failed: np.ndarray, obs: np.ndarray,
                           reward: np.ndarray, terminated: np.ndarray) -> None:
    """Frames, observation rows, reward and termination of every env (see the module
    contract)."""
    n = qpos.shape[0]
    nb = pose.shape[1]
    nj = default_joint.shape[0]
    na = last_action.shape[1]
    a = anchor
    o_ref_vel = nj
    o_pos_err = 2 * nj
    o_rot6 = o_pos_err + 3
    o_gyro = o_rot6 + 6
    o_jpos = o_gyro + 3
    o_jvel = o_jpos + nj
    o_act = o_jvel + nj
    for i in range(n):
        elapsed = (episode_step[i] - step_offset[i]) * frames_per_step
        f = start_frame[i] + np.int64(math.floor(elapsed + 0.5))
        clip_end[i] = f >= last_frame
        if f > last_frame:
            f = last_frame
        frame[i] = f

        # observation
        for j in range(nj):
            obs[i, j] = joint_pos[f, j]
        for j in range(nj):
            obs[i, o_ref_vel + j] = joint_vel[f, j]
        px, py, pz = pose[i, a, 0], pose[i, a, 1], pose[i, a, 2]
        w, x, y, z = pose[i, a, 3], pose[i, a, 4], pose[i, a, 5], pose[i, a, 6]
        rpx, rpy, rpz = body_pos[f, a, 0], body_pos[f, a, 1], body_pos[f, a, 2]
        rw, rx = body_quat[f, a, 0], body_quat[f, a, 1]
        ry, rz = body_quat[f, a, 2], body_quat[f, a, 3]
        ex, ey, ez = _rotate_inverse(w, x, y, z, rpx - px, rpy - py, rpz - pz)
        obs[i, o_pos_err] = ex
        obs[i, o_pos_err + 1] = ey
        obs[i, o_pos_err + 2] = ez
        dw, dx, dy, dz = _qmul(w, -x, -y, -z, rw, rx, ry, rz)
        obs[i, o_rot6] = 1.0 - 2.0 * (dy * dy + dz * dz)
        obs[i, o_rot6 + 1] = 2.0 * (dx * dy - dw * dz)
        obs[i, o_rot6 + 2] = 2.0 * (dx * dy + dw * dz)
        obs[i, o_rot6 + 3] = 1.0 - 2.0 * (dx * dx + dz * dz)
        obs[i, o_rot6 + 4] = 2.0 * (dx * dz - dw * dy)
        obs[i, o_rot6 + 5] = 2.0 * (dy * dz + dw * dx)
        obs[i, o_gyro] = qvel[i, 3]  # free-joint angular velocity is in the base frame
        obs[i, o_gyro + 1] = qvel[i, 4]
        obs[i, o_gyro + 2] = qvel[i, 5]
        for j in range(nj):
            obs[i, o_jpos + j] = qpos[i, 7 + j] - default_joint[j]
        for j in range(nj):
            obs[i, o_jvel + j] = qvel[i, 6 + j]
        for j in range(na):
            obs[i, o_act + j] = last_action[i, j]

        # reward: anchor errors, then the bodies against the reference moved onto the
        # robot's anchor (xy, reference height) and turned by the heading difference
        dpx, dpy, dpz = rpx - px, rpy - py, rpz - pz
        anchor_pos_err = dpx * dpx + dpy * dpy + dpz * dpz
        anchor_ang = _qangle(rw, rx, ry, rz, w, x, y, z)
        half = 0.5 * (_yaw(w, x, y, z) - _yaw(rw, rx, ry, rz))
        tw, tz = math.cos(half), math.sin(half)
        body_pos_err = 0.0
        body_ang_err = 0.0
        for b in range(nb):
            vx, vy, vz = _rotate(tw, 0.0, 0.0, tz, body_pos[f, b, 0] - rpx,
                                 body_pos[f, b, 1] - rpy, body_pos[f, b, 2] - rpz)
            qx = px + vx - pose[i, b, 0]
            qy = py + vy - pose[i, b, 1]
            qz = rpz + vz - pose[i, b, 2]
            body_pos_err += qx * qx + qy * qy + qz * qz
            gw, gx, gy, gz = _qmul(tw, 0.0, 0.0, tz, body_quat[f, b, 0], body_quat[f, b, 1],
                                   body_quat[f, b, 2], body_quat[f, b, 3])
            ang = _qangle(gw, gx, gy, gz, pose[i, b, 3], pose[i, b, 4], pose[i, b, 5],
                          pose[i, b, 6])
            body_ang_err += ang * ang
        body_pos_err /= nb
        body_ang_err /= nb
        r = (0.5 * math.exp(-anchor_pos_err / sp2) + 0.5 * math.exp(-anchor_ang ** 2 / so2)
             + math.exp(-body_pos_err / sp2) + math.exp(-body_ang_err / so2))

        # failures: anchor height and gravity direction, end-effector heights
        fail = abs(rpz - pz) > max_height
        gx0, gy0, gz0 = _rotate_inverse(rw, rx, ry, rz, 0.0, 0.0, -1.0)
        gx1, gy1, gz1 = _rotate_inverse(w, x, y, z, 0.0, 0.0, -1.0)
        hx, hy, hz = gx0 - gx1, gy0 - gy1, gz0 - gz1
        if math.sqrt(hx * hx + hy * hy + hz * hz) > max_gravity:
            fail = True
        for k in range(ee.shape[0]):
            e = ee[k]
            if abs(body_pos[f, e, 2] - pose[i, e, 2]) > max_ee_height:
                fail = True
        failed[i] = fail
        terminated[i] = fail or clip_end[i]
        if fail:
            r -= penalty
        reward[i] = r
