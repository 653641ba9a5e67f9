"""Batched quaternion helpers (wxyz, as at the contract boundary)."""

from __future__ import annotations

import numpy as np

__all__ = ["quat_mul", "quat_rotate_inverse", "yaw_quat"]


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of ``(n, 4)`` wxyz quaternions."""
    aw, ax, ay, az = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    bw, bx, by, bz = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=1)


def quat_rotate_inverse(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate world vectors ``v`` ``(n, 3)`` into the frames ``q`` ``(n, 4)``."""
    w = q[:, :1]
    u = q[:, 1:4]
    t = 2.0 * np.cross(u, v)
    return v - w * t + np.cross(u, t)


def yaw_quat(yaw: np.ndarray) -> np.ndarray:
    """``(n, 4)`` rotations about world z."""
    half = 0.5 * yaw
    out = np.zeros((yaw.shape[0], 4))
    out[:, 0] = np.cos(half)
    out[:, 3] = np.sin(half)
    return out
