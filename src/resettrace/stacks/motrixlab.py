"""MotrixLab (``motrix-env-core``, MotrixSim's env framework): its reset path on the catalog.

``resettrace run --instrument motrixlab -- python train.py`` (or
``RESETTRACE_INSTRUMENT=motrixlab``, or ``resettrace.instrument("motrixlab")``)::

    env_step                         ArrayEnv.step                  (env count: num_envs)
      env_step.apply_action          ManagerEnv.apply_action
      env_step.physics               ManagerEnv.physics_step
      env_step.update_state          ManagerEnv.compute_transition
      env_step.final_obs             _capture_final_obs             (count: truncated ids)
      reset_done                     _reset_done_envs               (count: done envs)
        reset_done.reset_call        its perf scope "reset_envs"    (count: as reset_done)
          dr_reset                   ManagerEnv.reset               (count: env_ids)
            set_state                SimResetRuntime.apply          (count: env_ids)
              set_state.write_program  motrixsim.write:WriteProgram.execute, on this path
            dr_reset.build_observation ReadPlan.read, on this path  (count: env_ids)

The write program and ``ReadPlan.read`` also run on the step path (actions, the step's
reads): they are recorded inside ``set_state`` and ``dr_reset`` only. MotrixSim's write
program is one native call (restore defaults, write dof pos/vel, forward kinematics):
it is ``set_state.write_program`` and cannot be split further.

MotrixLab's own profiler (``env.perf.scope(name)``, ``active_perf_scope(name)``) is
bridged: while tracing is on, each of its scopes opened inside a resettrace phase is
recorded as the phase ``<that phase>.<scope name>`` (registered on first use: MotrixLab's
``done_mask`` is ``reset_done.done_mask``, its ``reset_kernel`` ``set_state.reset_kernel``),
except the scopes the targets above already record (``step``, ``transition``, ``reset``,
``apply_sim_reset``, ...). An exception leaving a scope is recorded on its span. Nothing is
switched on: MotrixLab's profiler stays as the user left it (its own tree fills only when
``env.perf.enable()`` was called), and with tracing off each scope costs one check.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from resettrace.catalog import CATALOG, Phase, default_key
from resettrace.stacks import Instrumentation
from resettrace.tracing.api import recording
from resettrace.tracing.layout import NO_COUNT
from resettrace.tracing.recorder import Recorder, note_once

_ENV = "motrix_env_core.numba.manager.env"
_ARRAY = "motrix_env_core.array.env"

#: MotrixLab's perf scopes that a target of the spec already records
SKIP = frozenset({"step", "apply_action", "physics", "transition", "final_obs", "reset",
                  "apply_sim_reset", "backend_apply", "reset_read_inputs", "sim_read"})
#: perf scopes that are a catalog phase when opened inside the given parent:
#: name -> (parent span, phase span, count taken from the parent's)
KNOWN = {"reset_envs": ("reset_done", "reset_done.reset_call", True)}


def spec() -> dict[str, Any]:
    return {
        "attributes": {"backend": "motrixsim"},
        "phases": [
            {"span": "env_step.final_obs", "parent": "env_step",
             "description": "final observations of the truncated envs (MotrixLab takes "
                            "them before reset_done)"},
            {"span": "set_state.write_program", "parent": "set_state",
             "description": "MotrixSim's native write program: restore defaults, write "
                            "dof pos/vel, forward kinematics (one call)"},
        ],
        "instrument": {
            f"{_ARRAY}:ArrayEnv.step": {"phase": "env_step", "env_count": "self.num_envs"},
            f"{_ENV}:ManagerEnv.apply_action": {"phase": "env_step.apply_action",
                                                "within": "env_step"},
            f"{_ENV}:ManagerEnv.physics_step": {"phase": "env_step.physics",
                                                "within": "env_step"},
            f"{_ENV}:ManagerEnv.compute_transition": {"phase": "env_step.update_state",
                                                      "within": "env_step"},
            f"{_ARRAY}:ArrayEnv._capture_final_obs": {"phase": "env_step.final_obs",
                                                      "count": "env_ids"},
            f"{_ENV}:ManagerEnv._capture_final_obs": {"phase": "env_step.final_obs",
                                                      "count": "env_ids"},
            f"{_ARRAY}:ArrayEnv._reset_done_envs": {"phase": "reset_done",
                                                    "count": "self._state.done"},
            f"{_ENV}:ManagerEnv._reset_done_envs": {"phase": "reset_done",
                                                    "count": "self._state.done"},
            f"{_ENV}:ManagerEnv.reset": {"phase": "dr_reset", "count": "env_ids"},
            "motrix_env_core.numba.manager.sim_reset:SimResetRuntime.apply": {
                "phase": "set_state", "count": "env_ids"},
            "motrixsim.write:WriteProgram.execute": {"phase": "set_state.write_program",
                                                     "within": "set_state"},
            f"{_ENV}:ReadPlan.read": {"phase": "dr_reset.build_observation",
                                      "count": "env_ids", "within": "dr_reset"},
        },
    }


# -- the bridge from MotrixLab's profiler ----------------------------------------------------
_lock = threading.Lock()
#: (parent phase index, scope name) -> (phase, count taken from the parent's) or None
_placed: dict[tuple[int, str], tuple[Phase, bool] | None] = {}


def _place(parent: Phase, name: str) -> tuple[Phase, bool] | None:
    """Where a perf scope ``name`` opened inside ``parent`` is recorded (None: not)."""
    if name in SKIP:
        return None
    known = KNOWN.get(name)
    if known is not None and known[0] == parent.span:
        return CATALOG.resolve(known[1]), known[2]
    span = f"{parent.span}.{name}"
    try:
        return CATALOG.register(span, parent=parent, key=default_key(span),
                                description=f"MotrixLab perf scope {name!r}"), False
    except (TypeError, ValueError) as e:
        note_once(f"motrixlab-scope:{span}", "MotrixLab perf scope %r inside %r is not "
                  "recorded: %s", name, parent.span, e)
        return None


def _phase_of(rec: Recorder, name: str) -> tuple[Phase, int] | None:
    top = rec.innermost()
    if top is None:
        return None  # outside every phase (the env's construction): not on a traced path
    parent, count = top
    key = (parent.index, name)
    try:
        placed = _placed[key]
    except KeyError:
        with _lock:
            placed = _placed[key] = _place(parent, name)
    if placed is None:
        return None
    phase, inherit = placed
    return phase, count if inherit else NO_COUNT


class _Bridged:
    """A MotrixLab perf scope and the resettrace scope of its phase, entered together."""

    __slots__ = ("_inner", "_scope")

    def __init__(self, inner: Any, scope: Any) -> None:
        self._inner = inner
        self._scope = scope

    def __enter__(self) -> None:
        self._inner.__enter__()
        self._scope.__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self._scope.__exit__(exc_type, exc, tb)
        finally:
            self._inner.__exit__(exc_type, exc, tb)


def _bridging(original: Callable[..., Any], disabled: Any) -> Callable[..., Any]:
    """``original`` (``Perf.scope`` or ``active_perf_scope``) with its scopes bridged, on
    the public recording API: a perf scope opened inside this thread's open trace is
    entered with the recorder's scope of its phase (:func:`_phase_of`); with MotrixLab's
    profiler off (``inner`` is its shared ``disabled`` scope, whose enter and exit do
    nothing) it is that scope alone, so it costs what ``rec.scope()`` costs."""

    def bridged(*args: Any, **kwargs: Any) -> Any:
        inner = original(*args, **kwargs)
        name = kwargs["name"] if kwargs else args[-1]
        if name in SKIP:  # recorded by a target of the spec: no lookup needed
            return inner
        rec = recording()
        if rec is None:
            return inner  # tracing off
        found = _phase_of(rec, name)
        if found is None:
            return inner  # outside every phase, or a scope of no phase here
        s = rec.scope(*found)
        return s if inner is disabled else _Bridged(inner, s)

    bridged.__resettrace_bridge__ = True  # type: ignore[attr-defined]
    return bridged


def _rebind(old: Any, new: Any) -> None:
    """Every module of the stack that holds ``old`` as ``active_perf_scope``: ``new``."""
    import sys

    for m in list(sys.modules.values()):
        if getattr(m, "__name__", "").startswith(("motrix_env_core", "motrix_env_motrixsim")) \
                and getattr(m, "__dict__", {}).get("active_perf_scope") is old:
            setattr(m, "active_perf_scope", new)  # noqa: B010 - any module of the stack


def install() -> Callable[[], None]:
    """Bridge ``motrix_env_core.perf`` (now, or when it is imported); the undo."""
    from resettrace.instrumentation import when_imported

    undos: list[Callable[[], None]] = []

    def patch(perf: ModuleType) -> None:
        cls = perf.Perf
        scope, active = cls.scope, perf.active_perf_scope
        if getattr(scope, "__resettrace_bridge__", False):
            return

        # MotrixLab's shared scope of a profiler that is off (None: entered beside)
        disabled = getattr(perf, "_DISABLED_SCOPE", None)
        bridged_scope = _bridging(scope, disabled)
        bridged_active = _bridging(active, disabled)
        cls.scope = bridged_scope
        setattr(perf, "active_perf_scope", bridged_active)  # noqa: B010
        # modules that imported the function by name before the bridge was installed
        # (the ones imported later import the bridged one)
        _rebind(active, bridged_active)

        def undo() -> None:
            cls.scope = scope
            setattr(perf, "active_perf_scope", active)  # noqa: B010
            _rebind(bridged_active, active)

        undos.append(undo)

    undos.append(when_imported("motrix_env_core.perf", patch))

    def undo_all() -> None:
        for undo in reversed(undos):
            undo()
        undos.clear()

    return undo_all


INSTRUMENTATION = Instrumentation(
    name="motrixlab", distribution="motrix-env-core", supported=">=0.4.0,<0.5",
    spec=spec, install=install,
    description="MotrixLab ManagerEnv: env step, reset_done, dr_reset, the sim reset "
                "runtime as set_state, the reset reads, and MotrixLab's perf scopes")
