"""Domain-randomization manager: the reset call of ``reset_done``.

``reset(env_ids)`` plans the reset rows' initial state (the task's sampler, and
new randomization values when a payload is set), selects their rows of the
randomization payload, calls ``backend.set_state`` and builds their reset
observation, each under its catalog phase, with the current recorder
(``resettrace.current_recorder``: the env's, which it binds). The ``set_state``
span itself is emitted by the backend.
"""

from __future__ import annotations

import numpy as np

from resettrace import catalog as C
from resettrace.sim.contract import SetStateResult, SimBackend
from resettrace.sim.randomization import RandomizationPayload, RandomizationRows
from resettrace.sim.tasks.base import Task
from resettrace.tracing.api import current_recorder
from resettrace.tracing.recorder import NoopRecorder, Recorder

__all__ = ["DomainRandomizationManager"]


class DomainRandomizationManager:
    """Resets rows of one backend for one task."""

    def __init__(self, task: Task, backend: SimBackend, *, rng: np.random.Generator,
                 recorder: Recorder | NoopRecorder | None = None,
                 payload: RandomizationPayload | None = None) -> None:
        self.task = task
        self.backend = backend
        self.rng = rng
        self.payload = payload
        #: used when no recorder is bound (``None``: the default session's)
        self.recorder = recorder
        #: the backend's timing dict of the last reset (None with tracing off)
        self.last_set_state: SetStateResult | None = None

    def _payload_rows(self, env_ids: np.ndarray) -> RandomizationRows | None:
        if self.payload is None:
            return None
        return self.payload.rows(env_ids)

    def reset(self, env_ids: np.ndarray) -> np.ndarray:
        """Re-initialise ``env_ids``; return their reset observation ``(k, obs_dim)``."""
        rec = current_recorder(self.recorder)
        with rec.scope(C.DR_RESET, len(env_ids)):
            with rec.scope(C.DR_RESET_PLAN):
                qpos, qvel = self.task.plan_reset(env_ids, self.rng)
                if self.payload is not None:
                    self.payload.resample(env_ids, self.rng)
            with rec.scope(C.DR_RESET_PAYLOAD_FILTER):
                rand = self._payload_rows(env_ids)
            self.last_set_state = self.backend.set_state(env_ids, qpos, qvel, rand)
            with rec.scope(C.DR_RESET_BUILD_OBSERVATION):
                obs = self.task.reset_observation(env_ids)
        return obs
