"""Reset planning with per-reset noise. Level 2: the ``@resettrace.traced`` decorator.

Each method is recorded under a phase with the current recorder, so the backend's
``set_state`` (called inside ``reset``) nests in the same trace.
"""

from __future__ import annotations

import numpy as np

import resettrace

#: a phase of this manager's own, inside the plan
POLE_NOISE = resettrace.register_phase("dr_reset.plan.pole_noise", parent="dr_reset.plan")


class CartPoleDR:
    def __init__(self, backend, rng: np.random.Generator, noise: float = 0.05) -> None:
        self.backend = backend
        self.rng = rng
        self.noise = noise
        self.last_timing: dict | None = None

    @resettrace.traced("dr_reset", count="env_ids")
    def reset(self, env_ids: np.ndarray) -> np.ndarray:
        qpos, qvel = self.plan(env_ids)
        out = self.backend.set_state(env_ids, qpos, qvel)
        self.last_timing = None if out is None else out["timing"]
        return self.observe(env_ids)

    @resettrace.traced("dr_reset.plan", count="env_ids")
    def plan(self, env_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = len(env_ids)
        qpos = np.zeros((k, self.backend.nq))
        qpos[:, 1] = self.pole_noise(k)
        return qpos, np.zeros((k, self.backend.nv))

    @resettrace.traced(POLE_NOISE, count=lambda self, k: k)
    def pole_noise(self, k: int) -> np.ndarray:
        return self.rng.uniform(-self.noise, self.noise, k)

    @resettrace.traced("dr_reset.build_observation", count="env_ids")
    def observe(self, env_ids: np.ndarray) -> np.ndarray:
        data = self.backend.data
        return np.array([np.concatenate([data[i].qpos, data[i].qvel]) for i in env_ids])
