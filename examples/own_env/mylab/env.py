"""The batched env: no resettrace code here. Level 3: ``spec.toml`` traces it.

``resettrace run --instrument spec.toml -- python train.py`` (or
``resettrace.instrument("spec.toml")`` in code) wraps ``step``, ``reset_done`` and
their stages without editing this file.
"""

from __future__ import annotations

import numpy as np

from mylab.backend import CartPoleBackend
from mylab.dr import CartPoleDR


class CartPoleEnv:
    def __init__(self, num_envs: int = 64, seed: int = 0, substeps: int = 2) -> None:
        self.num_envs = num_envs
        self.substeps = substeps
        self.rng = np.random.default_rng(seed)
        self.backend = CartPoleBackend(num_envs)
        self.dr = CartPoleDR(self.backend, self.rng)
        self.obs = np.zeros((num_envs, 4))
        self.done = np.zeros(num_envs, dtype=bool)
        self.reset_done(np.ones(num_envs, dtype=bool))

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.physics(action)
        self.update_state()
        if self.done.any():
            self.reset_done(self.done)
        return self.obs, self.done

    def physics(self, action: np.ndarray) -> None:
        self.backend.step(action[:, None], self.substeps)

    def update_state(self) -> None:
        q, v = self.backend.qpos(), self.backend.qvel()
        self.obs[:] = np.concatenate([q, v], axis=1)
        self.done[:] = (np.abs(q[:, 1]) > 0.4) | (np.abs(q[:, 0]) > 1.8)

    def reset_done(self, done: np.ndarray) -> None:
        ids = np.flatnonzero(done)
        self.obs[ids] = self.reinit(ids)

    def reinit(self, ids: np.ndarray) -> np.ndarray:
        return self.dr.reset(ids)
