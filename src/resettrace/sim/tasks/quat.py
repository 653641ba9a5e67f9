"""Quaternion helpers (wxyz, as at the contract boundary; any leading shape), batched
with numpy: one implementation for the tasks and the motion clips."""

from __future__ import annotations

import numpy as np

__all__ = ["qmul", "qconj", "qrot", "qrot_inv", "qyaw", "qangle", "qlog", "quat_from_euler",
           "yaw_quat"]


def qmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a * b``; shapes broadcast over the leading axes."""
    aw, ax, ay, az = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    bw, bx, by, bz = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=-1)


def qconj(q: np.ndarray) -> np.ndarray:
    """The inverse of unit quaternions."""
    out = np.array(q, dtype=np.float64, copy=True)
    out[..., 1:] *= -1.0
    return out


_C1 = np.array([1, 2, 0])
_C2 = np.array([2, 0, 1])


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # np.cross costs ~4x this on the small arrays of a reset
    return a[..., _C1] * b[..., _C2] - a[..., _C2] * b[..., _C1]


def qrot(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate vectors ``v`` (..., 3) by ``q`` (frame to world)."""
    w = q[..., :1]
    u = q[..., 1:4]
    t = 2.0 * _cross(u, v)
    return v + w * t + _cross(u, t)


def qrot_inv(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate world vectors ``v`` (..., 3) into the frames ``q``."""
    w = q[..., :1]
    u = q[..., 1:4]
    t = 2.0 * _cross(u, v)
    return v - w * t + _cross(u, t)


def qyaw(q: np.ndarray) -> np.ndarray:
    """Heading (rotation about world z) of ``q``, in (-pi, pi]."""
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    return np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def qangle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rotation angle in [0, pi] between ``a`` and ``b`` (atan2 form: exact near 0)."""
    d = qmul(qconj(a), b)
    return 2.0 * np.arctan2(np.linalg.norm(d[..., 1:], axis=-1), np.abs(d[..., 0]))


def qlog(q: np.ndarray) -> np.ndarray:
    """Rotation vector (axis * angle, angle in [0, pi]) of unit quaternions."""
    q = np.where(q[..., :1] < 0.0, -q, q)  # the short way round
    v = q[..., 1:]
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    angle = 2.0 * np.arctan2(n, q[..., :1])
    scale = np.where(n > 1e-12, angle / np.maximum(n, 1e-12), 2.0)
    return v * scale


def quat_from_euler(rpy: np.ndarray) -> np.ndarray:
    """``(..., 4)`` rotations ``Rz(yaw) Ry(pitch) Rx(roll)`` from ``(..., 3)`` angles."""
    half = 0.5 * np.asarray(rpy, dtype=np.float64)
    cr, cp, cy = np.cos(half[..., 0]), np.cos(half[..., 1]), np.cos(half[..., 2])
    sr, sp, sy = np.sin(half[..., 0]), np.sin(half[..., 1]), np.sin(half[..., 2])
    return np.stack([cy * cp * cr + sy * sp * sr,
                     cy * cp * sr - sy * sp * cr,
                     cy * sp * cr + sy * cp * sr,
                     sy * cp * cr - cy * sp * sr], axis=-1)


def yaw_quat(yaw: np.ndarray) -> np.ndarray:
    """``(n, 4)`` rotations about world z."""
    half = 0.5 * yaw
    out = np.zeros((yaw.shape[0], 4))
    out[:, 0] = np.cos(half)
    out[:, 3] = np.sin(half)
    return out
