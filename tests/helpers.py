"""Helpers shared by the tests (importable: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import numpy as np


def stand_rows(backend, k: int, rng: np.random.Generator | None = None):
    """k valid reset states: the keyframe with a little noise (unit base quaternion)."""
    q = np.tile(backend.keyframe_qpos, (k, 1))
    v = np.zeros((k, backend.nv))
    if rng is not None:
        q[:, 0:2] += rng.uniform(-0.3, 0.3, (k, 2))
        q[:, 7:] += rng.uniform(-0.05, 0.05, (k, backend.nq - 7))
        v[:] = rng.uniform(-0.5, 0.5, v.shape)
    return q, v


class FakeClock:
    """perf_counter_ns stand-in for the recorder: tests advance ``now`` by hand."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now
