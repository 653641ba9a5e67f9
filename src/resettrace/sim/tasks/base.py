"""What a task provides to :class:`~resettrace.sim.envs.np_env.NpEnv`.

A task owns the observation, reward, termination and reset-sampling logic of one
robot task. Its methods work on any number of rows, so the same code builds the
whole batch's observation in ``update_state`` and the reset rows' observation in
the domain-randomization manager. All buffers are allocated once in ``bind``.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from resettrace.sim.contract import SimBackend

__all__ = ["Task"]


class Task(Protocol):
    name: str
    obs_dim: int
    action_dim: int
    #: physics substeps per env step
    substeps: int
    max_episode_steps: int
    #: start envs at random episode steps so that time-outs spread over steps
    randomize_initial_episode_step: bool
    def bind(self, backend: SimBackend, rng: np.random.Generator) -> None:
        """Allocate per-env buffers for ``backend.num_envs`` envs."""
        ...

    def action_to_ctrl(self, action: np.ndarray, out: np.ndarray) -> None:
        """Actuator targets ``(num_envs, nu)`` for a policy action."""
        ...

    def update_state(self, episode_step: np.ndarray, last_action: np.ndarray,
                     obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray) -> None:
        """Fill observation, reward and termination for every env, in place."""
        ...

    def plan_reset(self, env_ids: np.ndarray, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Initial ``(qpos, qvel)`` of the reset rows (contract layout); also samples
        the rows' per-episode task state (commands, phases)."""
        ...

    def reset_observation(self, env_ids: np.ndarray) -> np.ndarray:
        """Observation ``(k, obs_dim)`` of the reset rows only (no last action yet)."""
        ...

    def describe(self) -> dict[str, Any]: ...
