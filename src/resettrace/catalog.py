"""Every span name, timing key and attribute key of resettrace, defined once.

A :class:`Phase` is one timed stage of the reset hot path. It maps 1:1 between
an OpenTelemetry span name (``Phase.span``) and a timing key (``Phase.key``,
milliseconds), and names its parent phase so that the tree
``env_step > reset_done > dr_reset > set_state > set_state phases`` is known
without running anything. A phase whose parent declares a ``gap_key`` is part
of a closed account: ``parent = sum(children) + gap``.

The set of phases is a value, a :class:`Catalog`: the built-in phases below,
then the phases users add with :func:`register_phase` (for example
``register_phase("dr_reset.terrain_sample", parent="dr_reset")``). A catalog only
grows; a phase's ``index`` is its position in it, and recorders, processors and
span builders receive the catalog they index. Other processes (the span export
child) get phases by name. :data:`CATALOG` is the process's catalog.

Nothing else in the package spells a phase name, a timing key or an attribute
key as a string literal: import the constants from here.
"""

from __future__ import annotations

import difflib
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Phase",
    "Catalog",
    "CATALOG",
    "register_phase",
    "text_problem",
    "span_attributes",
    "attribute_value",
    "PHASES",
    "BY_SPAN",
    "SET_STATE_KEYS",
    "DR_RESET_KEYS",
    "ENV_STEP_KEYS",
    "ALL_KEYS",
]


@dataclass(frozen=True, slots=True)
class Phase:
    """One timed stage: its span name, timing key, parent and optional gap key."""

    index: int
    span: str
    key: str
    parent: str | None = None  # span name of the enclosing phase
    gap_key: str | None = None  # key of "self minus sum of children", if accounted
    description: str = ""
    #: a closed account: each call gives a sample of every registered child's key (0.0
    #: for a child that did not run) and of the gap, together, from the call's own
    #: children (``set_state``'s timing dict); needs a gap key
    closed: bool = False


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def text_problem(text: object, *, empty: bool = False) -> str | None:
    """Why ``text`` cannot be a span name, timing key or span attribute text; None if it can.

    It must be a string, non-empty unless ``empty``, that encodes as UTF-8 (a lone
    surrogate, as ``os.fsdecode`` makes of undecodable bytes, fails every exporter) and
    holds no control character. Checked where such text is given (registration, a
    recorder's attributes, a spec), never on the hot path or at export.
    """
    if not isinstance(text, str):
        return f"is not a string ({type(text).__name__})"
    if not text and not empty:
        return "is empty"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"has a lone surrogate {text[e.start]!r} at index {e.start} "
                "(not encodable as UTF-8)")
    bad = _CONTROL.search(text)
    if bad is not None:
        return f"has a control character {bad.group()!r} at index {bad.start()}"
    return None


_INT64 = range(-(1 << 63), 1 << 63)
_CARRIED = "a str, bool, int or float, or a list or tuple of one of those"


def _attribute_scalar(key: str, value: Any) -> str | bool | int | float:
    """One value OpenTelemetry can carry, as its Python type (a numpy scalar's ``item()``),
    or ``TypeError`` / ``ValueError`` naming ``key``."""
    t = type(value)
    if t is str or (t is not bool and isinstance(value, str)):
        value = str(value)  # a str subclass (numpy's str_, an enum): the plain text
        problem = text_problem(value, empty=True)
        if problem is not None:
            raise ValueError(f"span attribute {key!r}: its value {value!r} {problem}")
        return value
    if t is bool or t is float:
        return value
    np = sys.modules.get("numpy")  # not imported here: ``import resettrace`` stays light
    if np is not None and isinstance(value, np.generic) and value.dtype.kind in "biufU":
        return _attribute_scalar(key, value.item())  # np.int64(7) -> 7, np.bool_ -> bool
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        if value not in _INT64:
            raise ValueError(f"span attribute {key!r}: its value is an int outside int64, "
                             "which OpenTelemetry cannot carry")
        return int(value)
    if isinstance(value, float):
        return float(value)
    raise TypeError(f"span attribute {key!r}: a value of type {t.__module__}."
                    f"{t.__qualname__} is not one OpenTelemetry can carry ({_CARRIED})")


def attribute_value(key: str, value: Any) -> Any:
    """``value`` as OpenTelemetry carries it: str, bool, int (int64) and float as they are, a
    numpy scalar as its Python value, a list or tuple (or 1-D numpy array, made a list) of
    one of those types, converted item by item. Anything else (None, bytes, a set, a dict,
    any other object, a sequence that mixes types or nests) raises ``TypeError``; text no
    exporter can write or an int outside int64 raises ``ValueError``; both name ``key``."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise TypeError(f"span attribute {key!r}: a {value.ndim}-d numpy array is not a "
                            f"value OpenTelemetry can carry ({_CARRIED})")
        value = value.tolist()
    if isinstance(value, list | tuple):
        items = [_attribute_scalar(key, v) for v in value]
        kinds = {type(v).__name__ for v in items}
        if len(kinds) > 1:
            raise TypeError(f"span attribute {key!r}: a sequence mixing "
                            f"{', '.join(sorted(kinds))}; OpenTelemetry carries sequences "
                            "of one type")
        return items if isinstance(value, list) else tuple(items)
    return _attribute_scalar(key, value)


def span_attributes(attributes: Mapping[Any, Any]) -> dict[str, Any]:
    """A copy of ``attributes`` as OpenTelemetry carries them (:func:`attribute_value`);
    a key that is not text every exporter can write (:func:`text_problem`) raises
    ``TypeError`` (not a string) or ``ValueError``, naming it. Checked where attributes
    are given, never on the hot path."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        problem = text_problem(key)
        if problem is not None:
            error = ValueError if isinstance(key, str) else TypeError
            raise error(f"span attribute key {key!r} {problem}")
        out[key] = attribute_value(key, value)
    return out


def default_key(span: str) -> str:
    """The timing key of a span name: dots become underscores, then ``_ms``."""
    return span.replace(".", "_") + "_ms"


#: called after a phase is registered in any catalog (the compiled recorder's timing()
#: then knows its layouts made before are out of date without reading the catalog)
ON_REGISTER: list[Callable[[], None]] = []


class Catalog:
    """An append-only set of phases, looked up by index, span name or timing key.

    Registration is thread-safe; lookups read plain dicts and lists, so they cost
    nothing on the hot path. ``version`` grows with every new phase, so that
    layouts derived from the catalog (the closed timing dicts) can be cached.
    """

    def __init__(self) -> None:
        self._phases: list[Phase] = []
        self.by_span: dict[str, Phase] = {}
        self.by_key: dict[str, Phase] = {}
        #: gap key -> the phase whose account it closes
        self.gap_parent: dict[str, Phase] = {}
        self.version = 0
        self._lock = threading.Lock()
        self._layouts: dict[int, tuple[int, dict[int, str], dict[str, float]]] = {}

    # -- lookups ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._phases)

    def __iter__(self) -> Iterator[Phase]:
        return iter(list(self._phases))

    def __getitem__(self, index: int) -> Phase:
        return self._phases[index]

    def __contains__(self, phase: object) -> bool:
        if isinstance(phase, Phase):
            return self.by_span.get(phase.span) is phase
        return phase in self.by_span

    @property
    def phases(self) -> tuple[Phase, ...]:
        return tuple(self._phases)

    def get(self, span: str) -> Phase | None:
        return self.by_span.get(span)

    @classmethod
    def union(cls, catalogs: Iterable[Catalog]) -> Catalog:
        """One catalog with the phases of all (the first's order, then the others' new
        ones): the phases of several run records, read together."""
        out = cls()
        for cat in catalogs:
            for p in cat:
                if out.get(p.span) is None and (p.parent is None or out.get(p.parent)):
                    out.register(p.span, parent=p.parent, key=p.key, gap_key=p.gap_key)
        return out

    def resolve(self, phase: Phase | str) -> Phase:
        """The catalog's phase for a :class:`Phase` or a span name.

        An unknown name raises ``ValueError`` listing the closest registered names.
        """
        if isinstance(phase, Phase):
            if self.by_span.get(phase.span) is not phase:
                raise ValueError(f"phase {phase.span!r} is not in this catalog")
            return phase
        if not isinstance(phase, str):
            raise TypeError(f"a phase is a Phase or a span name, got {type(phase).__name__}")
        found = self.by_span.get(phase)
        if found is None:
            raise ValueError(self._unknown(phase))
        return found

    def _unknown(self, span: str) -> str:
        close = difflib.get_close_matches(span, list(self.by_span), n=5, cutoff=0.5)
        hint = ", ".join(close) if close else ", ".join(list(self.by_span)[:8]) + ", ..."
        return (f"unknown phase {span!r}; closest registered: {hint} "
                "(add your own with resettrace.register_phase)")

    def children(self, phase: Phase) -> tuple[Phase, ...]:
        """The phases whose parent is ``phase``, in catalog order."""
        return tuple(p for p in self._phases if p.parent == phase.span)

    def descendants(self, phase: Phase, *, skip: tuple[Phase, ...] = ()) -> tuple[Phase, ...]:
        """Every phase below ``phase`` (depth first, catalog order), not below ``skip``."""
        out: list[Phase] = []
        for kid in self.children(phase):
            out.append(kid)
            if kid not in skip:
                out.extend(self.descendants(kid, skip=skip))
        return tuple(out)

    def timing_keys(self, phase: Phase) -> tuple[str, ...]:
        """The keys of ``phase``'s closed timing dict: its children's, then its gap."""
        return tuple(self.layout(phase)[2])

    def layout(self, phase: Phase) -> tuple[int, dict[int, str], dict[str, float]]:
        """``(version, child key by phase index, zero dict of the closed account)``."""
        cached = self._layouts.get(phase.index)
        if cached is not None and cached[0] == self.version:
            return cached
        kids = self.children(phase)
        key_of = {p.index: p.key for p in kids}
        keys = [p.key for p in kids] + ([phase.gap_key] if phase.gap_key else [])
        layout = (self.version, key_of, dict.fromkeys(keys, 0.0))
        self._layouts[phase.index] = layout
        return layout

    def parent_key(self, key: str) -> str | None:
        """The timing key a key's share is measured against (gaps: their own phase)."""
        if key in self.gap_parent:
            return self.gap_parent[key].key
        phase = self.by_key.get(key)
        if phase is None or phase.parent is None:
            return None
        parent = self.by_span.get(phase.parent)
        return None if parent is None else parent.key

    def label(self, key: str) -> str:
        """A key as people read it: its phase's span name (``set_state.mask``), a gap as
        ``<span> (rest)``, anything else as the key itself."""
        phase = self.by_key.get(key)
        if phase is not None:
            return phase.span
        owner = self.gap_parent.get(key)
        return f"{owner.span} (rest)" if owner is not None else key

    def all_keys(self) -> tuple[str, ...]:
        """Every phase key, then every gap key, then the counts (the stats order)."""
        phases = list(self._phases)
        return (tuple(p.key for p in phases) + tuple(p.gap_key for p in phases if p.gap_key)
                + (RESET_DONE_COUNT,))

    def copy(self, *, upto: int | None = None) -> Catalog:
        """A new catalog with the same phases (same objects and indices), to grow apart;
        ``upto``: its first ``upto`` phases only."""
        other = Catalog()
        for p in self._phases[:upto]:
            other._phases.append(p)
            other.by_span[p.span] = p
            other.by_key[p.key] = p
            if p.gap_key is not None:
                other.gap_parent[p.gap_key] = p
        other.version = len(other._phases)
        return other

    # -- registration -----------------------------------------------------------------------
    def register(self, span: str, *, parent: Phase | str | None, key: str | None = None,
                 gap_key: str | None = None, description: str = "",
                 closed: bool = False) -> Phase:
        """Add a phase (or return the same one registered before with the same arguments).

        ``parent`` is a :class:`Phase`, a span name or ``None`` (a root phase); ``key``
        defaults to :func:`default_key` of ``span``. A span registered before with other
        arguments, or a key or gap key already in use, raises ``ValueError`` naming the
        conflict; so does a span name, key or gap key that is not text every exporter
        can write (:func:`text_problem`; a span name also without surrounding spaces).
        ``closed``: a closed account (:attr:`Phase.closed`), which needs a ``gap_key``.
        """
        if closed and gap_key is None:
            raise ValueError(f"phase {span!r}: a closed account needs a gap_key")
        problem = text_problem(span)
        if problem is None and (not span.strip() or span != span.strip()):
            problem = "has surrounding spaces"
        if problem is not None:
            raise ValueError(f"a phase's span name must be a non-empty string without "
                             f"surrounding spaces or control characters that encodes as "
                             f"UTF-8, got {span!r}: it {problem}")
        parent_span = None
        if parent is not None:
            parent_span = self.resolve(parent).span
        key = default_key(span) if key is None else key
        for what, value in (("key", key), ("gap_key", gap_key)):
            if value is None:
                continue
            problem = text_problem(value)
            if problem is None and not value.strip():
                problem = "is blank"
            if problem is not None:
                raise ValueError(f"{what} of phase {span!r} must be a non-empty string "
                                 f"without control characters that encodes as UTF-8, got "
                                 f"{value!r}: it {problem}")
        with self._lock:
            old = self.by_span.get(span)
            if old is not None:
                return self._same(old, parent_span, key, gap_key, description, closed)
            taken = set(self.by_key) | set(self.gap_parent) | {RESET_DONE_COUNT}
            for what, value in (("key", key), ("gap_key", gap_key)):
                if value in taken:
                    owner = self.by_key.get(value) or self.gap_parent.get(value)
                    whose = f" of phase {owner.span!r}" if owner else ""
                    raise ValueError(f"cannot register phase {span!r}: {what} {value!r} is "
                                     f"already the timing key{whose}")
            if gap_key is not None and gap_key == key:
                raise ValueError(f"phase {span!r}: key and gap_key are both {key!r}")
            phase = Phase(len(self._phases), span, key, parent_span, gap_key, description,
                          closed)
            self._phases.append(phase)
            self.by_span[span] = phase
            self.by_key[key] = phase
            if gap_key is not None:
                self.gap_parent[gap_key] = phase
            self.version += 1
            for hook in ON_REGISTER:
                hook()
        return phase

    @staticmethod
    def _same(old: Phase, parent: str | None, key: str, gap_key: str | None,
              description: str, closed: bool) -> Phase:
        diffs = [f"{name} {new!r} (registered: {was!r})" for name, new, was in (
            ("parent", parent, old.parent), ("key", key, old.key),
            ("gap_key", gap_key, old.gap_key), ("closed", closed, old.closed)) if new != was]
        if description and description != old.description:
            diffs.append(f"description {description!r} (registered: {old.description!r})")
        if diffs:
            raise ValueError(f"phase {old.span!r} is already registered with other "
                             f"arguments: {'; '.join(diffs)}")
        return old


#: The process's catalog: the built-in phases, then every registered one.
CATALOG = Catalog()


def register_phase(span: str, *, parent: Phase | str | None, key: str | None = None,
                   gap_key: str | None = None, description: str = "",
                   closed: bool = False) -> Phase:
    """Add a phase of your own to :data:`CATALOG`; see :meth:`Catalog.register`.

    Its timing key appears in stats, tables, CSV and ``timing.json`` like a built-in
    one; a child of ``set_state`` also gets a key in ``set_state``'s timing dict
    (before the gap key).
    """
    return CATALOG.register(span, parent=parent, key=key, gap_key=gap_key,
                            description=description, closed=closed)


def _phase(span: str, key: str, parent: Phase | None = None, *, gap_key: str | None = None,
           description: str = "", closed: bool = False) -> Phase:
    return CATALOG.register(span, parent=parent, key=key, gap_key=gap_key,
                            description=description, closed=closed)


#: Counts (not milliseconds) aggregated alongside the timing keys.
RESET_DONE_COUNT = "reset_done_count"

# --- env step -------------------------------------------------------------------------------
ENV_STEP = _phase("env_step", "env_step_total_ms", gap_key="env_step_other_ms",
                  description="one batched env step: action, physics, update_state, reset_done")
APPLY_ACTION = _phase("env_step.apply_action", "apply_action_ms", ENV_STEP,
                      description="policy action to actuator targets")
PHYSICS = _phase("env_step.physics", "physics_ms", ENV_STEP,
                 description="the backend's batched physics step (all substeps)")
UPDATE_STATE = _phase("env_step.update_state", "update_state_ms", ENV_STEP,
                      description="observation, reward and termination for every env")
RESET_DONE = _phase("reset_done", "reset_done_ms", ENV_STEP,
                    gap_key="reset_done_internal_gap_ms",
                    description="re-initialise the envs that finished")

# --- reset_done stages ------------------------------------------------------------------------
RESET_DONE_TERMINAL_OBS = _phase("reset_done.terminal_obs", "reset_done_terminal_obs_ms",
                                 RESET_DONE, description="copy the terminal observations")
RESET_DONE_RESET_CALL = _phase("reset_done.reset_call", "reset_done_reset_call_ms", RESET_DONE,
                               description="the call into the domain-randomization manager")
RESET_DONE_OBS_SCATTER = _phase("reset_done.obs_scatter", "reset_done_obs_scatter_ms",
                                RESET_DONE, description="reset observations into the batch")
RESET_DONE_INFO_SCATTER = _phase("reset_done.info_scatter", "reset_done_info_scatter_ms",
                                 RESET_DONE, description="episode bookkeeping of the reset rows")

# --- domain-randomization manager --------------------------------------------------------------
DR_RESET = _phase("dr_reset", "dr_reset_total_ms", RESET_DONE_RESET_CALL,
                  gap_key="dr_reset_internal_gap_ms",
                  description="plan, payload, set_state and reset observation")
DR_RESET_PLAN = _phase("dr_reset.plan", "dr_reset_plan_ms", DR_RESET,
                       description="sample the initial state of the reset rows")
DR_RESET_PAYLOAD_FILTER = _phase("dr_reset.payload_filter", "dr_reset_payload_filter_ms",
                                 DR_RESET, description="select the randomization rows")
SET_STATE = _phase("set_state", "dr_reset_set_state_ms", DR_RESET,
                   gap_key="set_state_internal_gap_ms", closed=True,
                   description="backend.set_state: the authoritative set_state total")
DR_RESET_BUILD_OBSERVATION = _phase("dr_reset.build_observation",
                                    "dr_reset_build_observation_ms", DR_RESET,
                                    description="observation of the reset rows only")

# --- backend set_state phases (the contract's 15 measured keys) ---------------------------------
SET_STATE_MASK = _phase("set_state.mask", "set_state_mask_ms", SET_STATE,
                        description="validate ids, build the index (or mask) of the reset rows")
SET_STATE_DATA_SLICE = _phase("set_state.data_slice", "set_state_data_slice_ms", SET_STATE,
                              description="engine handle on the reset rows")
SET_STATE_DATA_RESET = _phase("set_state.data_reset", "set_state_data_reset_ms", SET_STATE,
                              description="reset the rows' engine data to the model defaults")
SET_STATE_CLEAR_FORCES = _phase("set_state.clear_forces", "set_state_clear_forces_ms",
                                SET_STATE, description="zero applied forces")
SET_STATE_GEOM_OVERRIDES = _phase("set_state.geom_overrides", "set_state_geom_overrides_ms",
                                  SET_STATE, description="per-env geom size overrides")
SET_STATE_RESET_RAND = _phase("set_state.reset_rand", "set_state_reset_rand_ms", SET_STATE,
                              description="per-env model randomization")
SET_STATE_SET_DOF_VEL = _phase("set_state.set_dof_vel", "set_state_set_dof_vel_ms", SET_STATE,
                               description="write qvel rows")
SET_STATE_SET_DOF_POS = _phase("set_state.set_dof_pos", "set_state_set_dof_pos_ms", SET_STATE,
                               description="write qpos rows")
SET_STATE_ACTUATOR_CTRL = _phase("set_state.actuator_ctrl", "set_state_actuator_ctrl_ms",
                                 SET_STATE, description="actuator targets hold the reset pose")
SET_STATE_FORWARD_KINEMATIC = _phase("set_state.forward_kinematic",
                                     "set_state_forward_kinematic_ms", SET_STATE,
                                     description="forward kinematics of the reset rows")
SET_STATE_REFRESH_POSE_CACHE = _phase("set_state.refresh_pose_cache",
                                      "set_state_refresh_pose_cache_ms", SET_STATE,
                                      description="body pose cache of the reset rows")
SET_STATE_INVALIDATE_VELOCITY = _phase("set_state.invalidate_velocity",
                                       "set_state_invalidate_velocity_ms", SET_STATE,
                                       description="drop cached velocities of the reset rows")
SET_STATE_QPOS_CONVERT = _phase("set_state.qpos_convert", "set_state_qpos_convert_ms",
                                SET_STATE,
                                description="contract qpos to the engine layout, unit quats")
SET_STATE_POOL_RESET = _phase("set_state.pool_reset", "set_state_pool_reset_ms", SET_STATE,
                              description="reset per-env engine pools")
SET_STATE_STATE_SCATTER = _phase("set_state.state_scatter", "set_state_state_scatter_ms",
                                 SET_STATE,
                                 description="per-row bookkeeping outside the state rows")

# --- task sub-phases (motion tracking) ---------------------------------------------------------
DR_RESET_MOTION_SAMPLE = _phase("dr_reset.plan.motion_sample", "dr_reset_motion_sample_ms",
                                DR_RESET_PLAN,
                                description="sample the reset rows' motion-clip start frames")
DR_RESET_MOTION_LOOKUP = _phase("dr_reset.plan.motion_lookup", "dr_reset_motion_lookup_ms",
                                DR_RESET_PLAN,
                                description="clip frames to initial qpos/qvel plus noise")
DR_RESET_BODY_POSE = _phase("dr_reset.build_observation.body_pose", "dr_reset_body_pose_ms",
                            DR_RESET_BUILD_OBSERVATION,
                            description="tracked body poses of the reset rows")

#: The built-in phases (registered ones are in :data:`CATALOG` only).
PHASES: tuple[Phase, ...] = CATALOG.phases


def builtin_catalog() -> Catalog:
    """A new catalog of the built-in phases only: none that an instrumentation (MotrixLab's
    profiler scopes) or a user registered in this process, whenever they did."""
    return CATALOG.copy(upto=len(PHASES))

BY_SPAN: dict[str, Phase] = {p.span: p for p in PHASES}

#: The 16 canonical keys of ``set_state(...)["timing"]``: 15 phases then the gap. A
#: registered child of ``set_state`` adds its key before the gap
#: (``CATALOG.timing_keys(SET_STATE)``).
SET_STATE_KEYS: tuple[str, ...] = tuple(p.key for p in CATALOG.children(SET_STATE)) + (
    "set_state_internal_gap_ms",
)
assert SET_STATE.gap_key == SET_STATE_KEYS[-1] and len(SET_STATE_KEYS) == 16

#: the last three are sub-phases of plan / build_observation (their % overlaps their parent's)
DR_RESET_KEYS: tuple[str, ...] = (DR_RESET.key, DR_RESET_PLAN.key, DR_RESET_PAYLOAD_FILTER.key,
                                  SET_STATE.key, DR_RESET_BUILD_OBSERVATION.key,
                                  "dr_reset_internal_gap_ms", DR_RESET_MOTION_SAMPLE.key,
                                  DR_RESET_MOTION_LOOKUP.key, DR_RESET_BODY_POSE.key)
ENV_STEP_KEYS: tuple[str, ...] = (ENV_STEP.key, APPLY_ACTION.key, PHYSICS.key, UPDATE_STATE.key,
                                  RESET_DONE.key, "env_step_other_ms")
ALL_KEYS: tuple[str, ...] = CATALOG.all_keys()

# --- attribute keys ---------------------------------------------------------------------------
ATTR_ENV_COUNT = "resettrace.env.count"  # envs in the batch
ATTR_RESET_COUNT = "resettrace.reset.count"  # envs reset by this call
ATTR_BACKEND = "resettrace.backend.name"
ATTR_TASK = "resettrace.task.name"
ATTR_EXPORT_DROPPED = "resettrace.export.dropped"
ATTR_WORKER_RANK = "resettrace.worker.rank"  # resource attribute of a worker process
ATTR_PARENT_PID = "resettrace.parent.pid"  # resource attribute: the process that started it
ATTR_PHASE = "resettrace.phase"  # metric attribute: the phase's span name

#: metrics (``RESETTRACE_METRICS``): phase durations, and counts of resets and env steps
METRIC_PHASE_DURATION = "resettrace.phase.duration"  # histogram, unit ms
METRIC_RESETS = "resettrace.resets"  # counter: envs reset
METRIC_ENV_STEPS = "resettrace.env_steps"  # counter: env steps (batched calls)

#: Instrumentation scope of the spans resettrace materialises from its own records.
INSTRUMENTATION_SCOPE = "resettrace.recorder"
