"""resettrace: see, measure and shrink the reset hot path of batched robot-RL envs.

Public API (simulators and the OpenTelemetry SDK load only when first needed):

- :func:`make_backend` / :func:`make_env`: a simulator backend, or a task's envs on one;
- :func:`configure`: switch tracing (``off`` / ``timing`` / ``trace``) in code, overriding
  the ``RESETTRACE`` environment variable;
- :func:`get_tracing` and :func:`stats`: the current session and its aggregated timings.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from resettrace.config import Config

if TYPE_CHECKING:
    from resettrace.envs.np_env import NpEnv
    from resettrace.randomization import RandomizationConfig
    from resettrace.tracing.processor import KeyStats
    from resettrace.tracing.session import Tracing

__all__ = ["Config", "configure", "get_tracing", "make_backend", "make_env", "stats",
           "use_tracing", "__version__"]
__version__ = "0.1.0"

_lock = threading.Lock()
_default: Tracing | None = None


def configure(config: Config | None = None, *, tracer_provider: Any = None,
              **options: Any) -> Tracing:
    """Start a new default tracing session; the previous one is flushed and shut down.

    ``options`` are :class:`Config` fields (``mode="timing"``, ``exporters=...``); they
    win over the environment, which wins over the defaults. A ``tracer_provider``
    passed in receives the spans and is never shut down by resettrace.
    """
    from resettrace.tracing.session import Tracing

    global _default
    cfg = config if config is not None else Config.from_env(**options)
    new = Tracing(cfg, tracer_provider=tracer_provider)
    with _lock:
        old, _default = _default, new
    if old is not None:
        old.shutdown()
    return new


def get_tracing() -> Tracing:
    """The default tracing session, created from the environment on first use."""
    global _default
    with _lock:
        if _default is None:
            from resettrace.tracing.session import Tracing

            _default = Tracing(Config.from_env())
        return _default


@contextlib.contextmanager
def use_tracing(session: Tracing) -> Iterator[Tracing]:
    """Make ``session`` the default for the ``with`` block, then restore the previous one.

    Neither session is shut down: the caller owns ``session``.
    """
    global _default
    with _lock:
        previous, _default = _default, session
    try:
        yield session
    finally:
        with _lock:
            _default = previous


def stats() -> dict[str, KeyStats]:
    """Aggregated statistics per timing key of the default session."""
    return get_tracing().stats()


def make_backend(name: str, *, num_envs: int, model: Any = None, tracing: Tracing | None = None,
                 task: str | None = None, **options: Any) -> Any:
    """A simulator backend (``"mujoco"``) with ``num_envs`` envs; see ``resettrace.backends``."""
    from resettrace.backends import make_backend as _make

    session = tracing if tracing is not None else get_tracing()
    recorder = session.recorder(backend=name, task=task, env_count=num_envs)
    return _make(name, num_envs=num_envs, model=model, recorder=recorder, **options)


def make_env(task: str, *, backend: str = "mujoco", num_envs: int, model: Any = None,
             seed: int = 0, tracing: Tracing | None = None,
             task_options: dict[str, Any] | None = None,
             randomization: RandomizationConfig | bool | None = None,
             **backend_options: Any) -> NpEnv:
    """``num_envs`` envs of ``task`` (``"g1_walk_flat"``) on ``backend``.

    ``randomization``: ``True`` (default ranges) or a ``RandomizationConfig``: each
    reset draws new per-env friction, mass, PD gains and contact geom sizes.
    """
    import numpy as np

    from resettrace.backends import backend_class
    from resettrace.envs.np_env import NpEnv
    from resettrace.randomization import RandomizationConfig, RandomizationPayload
    from resettrace.tasks import task_class

    task_obj = task_class(task)(**(task_options or {}))
    cls = backend_class(backend)  # unknown names fail before anything is built
    payload = None
    if randomization:
        rcfg = randomization if isinstance(randomization, RandomizationConfig) \
            else RandomizationConfig()
        payload = RandomizationPayload(rcfg, num_envs, np.random.default_rng([seed, 1]))
    session = tracing if tracing is not None else get_tracing()
    recorder = session.recorder(backend=backend, task=task, env_count=num_envs)
    sim = cls(num_envs=num_envs, model=model, recorder=recorder, **backend_options)
    env = NpEnv(task_obj, sim, seed=seed, recorder=recorder, payload=payload)
    if payload is not None:  # the first episodes already run on their own models (untraced)
        from resettrace.tracing.recorder import NOOP_RECORDER

        every = np.arange(num_envs)
        sim.recorder = NOOP_RECORDER
        sim.set_state(every, sim.get_qpos_rows(None).copy(), sim.get_qvel_rows(None).copy(),
                      payload.rows(every))
        sim.recorder = recorder
    return env


@atexit.register
def _shutdown_default() -> None:
    if _default is not None:
        _default.shutdown()
