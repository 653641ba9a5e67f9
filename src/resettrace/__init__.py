"""resettrace: see, measure and shrink the reset hot path of batched robot-RL envs.

Public API (simulators and the OpenTelemetry SDK load only when first needed):

- :func:`make_backend` / :func:`make_env`: a simulator backend, or a task's envs on one;
- :func:`configure`: switch tracing (``off`` / ``timing`` / ``trace``) in code, overriding
  the ``RESETTRACE`` environment variable;
- :func:`get_tracing` and :func:`stats`: the current session and its aggregated timings;
  :func:`write_run` writes them as a run record (:mod:`resettrace.record`), which
  :func:`read_record` reads and ``resettrace compare / report / merge / fit`` analyse;
- tracing your own code: :func:`register_phase` (phases of your own), :func:`recorder`,
  :func:`bind` / :func:`current_recorder` (one trace across objects), :func:`traced`
  (a decorator), :func:`instrument` (wrap existing methods from a spec, as
  ``resettrace run`` and ``RESETTRACE_INSTRUMENT`` do) and :class:`TimingSpanProcessor`
  (aggregate your own OpenTelemetry spans).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from resettrace.catalog import CATALOG, Catalog, Phase, register_phase
from resettrace.config import ENV_INSTRUMENT, ENV_RUN_JSON, Config
from resettrace.record import RunRecord, read_record, write_run
from resettrace.tracing.api import (
    bind,
    configure,
    current_recorder,
    get_tracing,
    recorder,
    stats,
    traced,
    use_tracing,
)
from resettrace.tracing.recorder import NOOP_RECORDER, NoopRecorder, Recorder, Scope
from resettrace.version import __version__

if TYPE_CHECKING:
    from resettrace.instrumentation import instrument
    from resettrace.sim.envs.np_env import NpEnv
    from resettrace.sim.randomization import RandomizationConfig
    from resettrace.tracing.processor import TimingSpanProcessor
    from resettrace.tracing.session import Tracing

__all__ = ["CATALOG", "Catalog", "Config", "NOOP_RECORDER", "NoopRecorder", "Phase", "Recorder",
           "Scope", "TimingSpanProcessor", "bind", "configure", "current_recorder",
           "get_tracing", "instrument", "make_backend", "make_env", "recorder",
           "register_phase", "stats", "traced", "use_tracing", "write_run", "read_record",
           "RunRecord", "__version__"]


def __getattr__(name: str) -> Any:
    # loaded on first use: the processor imports the OpenTelemetry SDK
    if name == "TimingSpanProcessor":
        from resettrace.tracing.processor import TimingSpanProcessor

        return TimingSpanProcessor
    if name == "instrument":
        from resettrace.instrumentation import instrument

        return instrument
    raise AttributeError(f"module 'resettrace' has no attribute {name!r}")


def make_backend(name: str, *, num_envs: int, model: Any = None, tracing: Tracing | None = None,
                 task: str | None = None, **options: Any) -> Any:
    """A simulator backend (``"mujoco"``) with ``num_envs`` envs; see
    ``resettrace.sim.backends``."""
    from resettrace.sim.backends import make_backend as _make

    rec = recorder(backend=name, task=task, env_count=num_envs, tracing=tracing)
    return _make(name, num_envs=num_envs, model=model, recorder=rec, **options)


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

    from resettrace.extras import require

    require("sim", "resettrace.make_env")  # before a task or backend module loads
    from resettrace.sim.backends import backend_class
    from resettrace.sim.envs.np_env import NpEnv
    from resettrace.sim.randomization import RandomizationConfig, RandomizationPayload
    from resettrace.sim.tasks import task_class

    task_obj = task_class(task)(**(task_options or {}))
    cls = backend_class(backend)  # unknown names fail before anything is built
    payload = None
    if randomization:
        rcfg = randomization if isinstance(randomization, RandomizationConfig) \
            else RandomizationConfig()
        payload = RandomizationPayload(rcfg, num_envs, np.random.default_rng([seed, 1]))
    rec = recorder(backend=backend, task=task, env_count=num_envs, tracing=tracing)
    sim = cls(num_envs=num_envs, model=model, recorder=rec, **backend_options)
    env = NpEnv(task_obj, sim, seed=seed, recorder=rec, payload=payload)
    if payload is not None:  # the first episodes already run on their own models (untraced)
        every = np.arange(num_envs)
        with bind(NOOP_RECORDER):
            sim.set_state(every, sim.get_qpos_rows(None).copy(),
                          sim.get_qvel_rows(None).copy(), payload.rows(every))
    return env


if os.environ.get(ENV_RUN_JSON, "").strip():
    # asked for: this process writes its run record at exit
    from resettrace.exit_record import arrange_exit_record

    arrange_exit_record()

if os.environ.get(ENV_INSTRUMENT, "").strip():
    # asked for by the user (``resettrace run`` or the variable): wrap the spec's targets
    from resettrace.instrumentation import instrument_from_env

    instrument_from_env()
