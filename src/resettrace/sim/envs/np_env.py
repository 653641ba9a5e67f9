"""``NpEnv``: a batch of envs of one task on one backend, with a traced step.

``step(action)`` = apply action, physics (``task.substeps`` substeps),
update_state (observation, reward, termination of every env) and, when any env
finished, ``reset_done``: copy the terminal observations, reset the finished rows
through the domain-randomization manager, scatter the reset observations and the
episode bookkeeping back into the batch. Every stage is a catalog phase.

It instruments itself with resettrace's public API, as a user's env would:
``step`` and ``reset_done`` bind the env's recorder (``resettrace.bind``; the open
trace's, if the caller has one), so the domain-randomization manager, the task and
the backend record into the same trace through ``resettrace.current_recorder``,
and an env whose recorder is the no-op one records nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from resettrace import catalog as C
from resettrace.sim.contract import SimBackend
from resettrace.sim.envs.dr import DomainRandomizationManager
from resettrace.sim.tasks.base import Task
from resettrace.tracing.api import bind, current_recorder
from resettrace.tracing.recorder import NoopRecorder, Recorder

__all__ = ["NpEnv"]


class NpEnv:
    """``num_envs`` envs of ``task`` on ``backend``; buffers allocated once.

    ``recorder``: where the env's steps are recorded when the caller has bound none
    (``None``: the default session's recorder of the thread).
    """

    def __init__(self, task: Task, backend: SimBackend, *, seed: int = 0,
                 recorder: Recorder | NoopRecorder | None = None, payload: Any = None) -> None:
        self.task = task
        self.backend = backend
        self.num_envs = backend.num_envs
        self.rng = np.random.default_rng(seed)
        self.recorder = recorder
        if getattr(task, "reads_reset_poses", False) and hasattr(backend, "lazy_kinematics"):
            # the reset observation reads the reset rows' poses at once: computing their
            # kinematics inside set_state is cheaper than at the read (lazy kinematics)
            backend.lazy_kinematics = False
        task.bind(backend, self.rng)
        n = self.num_envs
        self.obs = np.zeros((n, task.obs_dim), dtype=np.float32)
        self.terminal_obs = np.zeros_like(self.obs)
        self.reward = np.zeros(n)
        self.terminated = np.zeros(n, dtype=bool)
        self.truncated = np.zeros(n, dtype=bool)
        self.done = np.zeros(n, dtype=bool)
        self.episode_step = np.zeros(n, dtype=np.int64)
        self.episode_return = np.zeros(n)
        self.last_action = np.zeros((n, task.action_dim))
        self.ctrl = np.zeros((n, backend.nu))
        self.episodes_finished = 0
        self.dr = DomainRandomizationManager(task, backend, rng=self.rng, payload=payload)
        if task.randomize_initial_episode_step:
            self.episode_step[:] = self.rng.integers(0, task.max_episode_steps, n)
        task.update_state(self.episode_step, self.last_action, self.obs, self.reward,
                          self.terminated)

    def use_recorder(self, recorder: Recorder | NoopRecorder) -> None:
        """Record this env (with its manager, task and backend) with ``recorder`` from now on."""
        self.recorder = recorder
        self.backend.recorder = recorder

    @property
    def action_dim(self) -> int:
        return self.task.action_dim

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
        """Advance every env one control step; finished envs are reset in place.

        Returns ``(obs, reward, done, info)``; ``info["terminal_obs"]`` holds the last
        observation of the envs that finished this step (rows where ``done``).
        """
        action = np.asarray(action)
        if action.shape != (self.num_envs, self.task.action_dim):
            raise ValueError(f"action must have shape ({self.num_envs}, {self.task.action_dim}),"
                             f" got {action.shape}")
        rec = current_recorder(self.recorder)
        task = self.task
        with bind(rec), rec.scope(C.ENV_STEP):
            with rec.scope(C.APPLY_ACTION):
                task.action_to_ctrl(action, self.ctrl)
                self.last_action[...] = action
            with rec.scope(C.PHYSICS):
                self.backend.step(self.ctrl, task.substeps)
            with rec.scope(C.UPDATE_STATE):
                self.episode_step += 1
                task.update_state(self.episode_step, self.last_action, self.obs, self.reward,
                                  self.terminated)
                np.greater_equal(self.episode_step, task.max_episode_steps, out=self.truncated)
                np.logical_or(self.terminated, self.truncated, out=self.done)
                self.episode_return += self.reward
            if self.done.any():
                self.reset_done(self.done)
        return self.obs, self.reward, self.done, {"terminal_obs": self.terminal_obs,
                                                   "truncated": self.truncated}

    def reset_done(self, done: np.ndarray) -> np.ndarray:
        """Reset the envs where ``done``; return their ids."""
        ids = np.flatnonzero(done)
        k = ids.size
        rec = current_recorder(self.recorder)
        with bind(rec), rec.scope(C.RESET_DONE, k):
            with rec.scope(C.RESET_DONE_TERMINAL_OBS):
                self.terminal_obs[ids] = self.obs[ids]
            with rec.scope(C.RESET_DONE_RESET_CALL):
                reset_obs = self.dr.reset(ids)
            with rec.scope(C.RESET_DONE_OBS_SCATTER):
                self.obs[ids] = reset_obs
            with rec.scope(C.RESET_DONE_INFO_SCATTER):
                self.episode_step[ids] = 0
                self.episode_return[ids] = 0.0
                self.last_action[ids] = 0.0
                self.episodes_finished += k
        return ids

    def close(self) -> None:
        self.backend.close()
