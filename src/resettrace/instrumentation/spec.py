"""A spec: what it may hold, parsed and checked (nothing patched)."""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resettrace.catalog import ATTR_BACKEND, ATTR_ENV_COUNT, ATTR_TASK, CATALOG, Phase
from resettrace.tracing.session import attribute_problem

log = logging.getLogger("resettrace.instrumentation")


ATTRIBUTE_ALIASES = {"backend": ATTR_BACKEND, "task": ATTR_TASK, "env_count": ATTR_ENV_COUNT}
_SECTIONS = ("attributes", "phases", "instrument")
_PHASE_FIELDS = ("span", "parent", "key", "gap_key", "description")
_TARGET_FIELDS = ("phase", "count", "env_count", "within", "parents")


class InstrumentError(ValueError):
    """A spec, or one of its targets, that cannot be installed."""


@dataclass(frozen=True)
class Target:
    """One ``"module:Qualified.name"`` to record under ``phase``."""

    module: str
    qualname: str
    phase: Phase
    #: an argument name or path, or a constant count (int)
    count: str | int | None = None
    env_count: str | None = None
    #: recorded only while a scope of this phase (span name) is open
    within: str | None = None
    #: also open its registered parents that are not open (:func:`resettrace.traced`)
    parents: bool = False

    @property
    def name(self) -> str:
        return f"{self.module}:{self.qualname}"


# -- the spec -------------------------------------------------------------------------------
def load_spec(spec: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """The spec as a dict: a mapping as it is, a path read as TOML."""
    if isinstance(spec, Mapping):
        return dict(spec)
    path = Path(spec)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InstrumentError(f"cannot read the instrument spec {str(path)!r}: "
                              f"{e.strerror or e}") from None
    try:
        text = data.decode("utf-8")  # TOML is UTF-8, whatever the locale
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InstrumentError(f"instrument spec {str(path)!r} is not valid TOML: not UTF-8 "
                              f"text (byte 0x{data[e.start]:02x} on line {line})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InstrumentError(f"instrument spec {str(path)!r} is not valid TOML: {e}") from None


def named(spec: Any) -> Any:
    """The shipped or registered instrumentation ``spec`` names (:mod:`resettrace.stacks`),
    or None when ``spec`` is a path (an existing file, or anything with a folder or a
    ``.toml`` suffix) or a mapping. An unknown name is an :class:`InstrumentError` listing
    the known ones."""
    if not isinstance(spec, str) or os.path.exists(spec) or os.sep in spec \
            or spec.endswith(".toml"):
        return None
    from resettrace import stacks

    names = stacks.known()
    if spec not in names:
        raise InstrumentError(f"no instrument spec file {spec!r}, and no instrumentation of "
                              f"that name (known: {', '.join(sorted(names))})")
    try:
        inst = stacks.get(spec)
    except Exception as e:  # a third party's entry point that cannot be loaded
        raise InstrumentError(f"instrumentation {spec!r} ({names[spec]}) cannot be loaded: "
                              f"{type(e).__name__}: {e}") from None
    installed, note = stacks.version_problem(inst)
    if not installed:
        raise InstrumentError(str(note))
    if note:
        log.warning("resettrace: %s", note)
    return inst


@dataclass(frozen=True)
class CheckedSpec:
    """A spec parsed and checked, with nothing registered or patched yet: its
    ``[attributes]`` and its targets (checked against the catalog and the spec's own
    phases); :meth:`register` registers the phases and resolves the targets."""

    attributes: dict[str, Any]
    targets: list[Target]
    phases: Any  # the spec's [[phases]], as written
    instrument: Any  # its [instrument] table, as written

    def register(self) -> list[Target]:
        """Register the spec's phases; its targets, resolved against them."""
        _register(self.phases)
        return _targets(self.instrument)


def check(spec: Mapping[str, Any] | str | os.PathLike[str]) -> CheckedSpec:
    """Parse and check a spec (a mapping, a TOML path or an instrumentation's name):
    :class:`InstrumentError` naming the first problem, before anything is registered."""
    data = _sections(spec)
    attributes = _attributes(data.get("attributes", {}))
    raw_phases, raw_targets = data.get("phases", []), data.get("instrument", {})
    spans = [str(p.get("span")) for p in raw_phases if isinstance(p, Mapping)] \
        if isinstance(raw_phases, Sequence) and not isinstance(raw_phases, str) else []
    return CheckedSpec(attributes, _targets(raw_targets, spans), raw_phases, raw_targets)


def _sections(spec: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    inst = named(spec)
    data = inst.spec() if inst is not None else load_spec(spec)
    unknown = set(data) - set(_SECTIONS)
    if unknown:
        raise InstrumentError(f"unknown instrument spec section(s): {', '.join(sorted(unknown))}"
                              f" (sections: {', '.join(_SECTIONS)})")
    return data


def _attributes(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise InstrumentError("[attributes] must be a table of name = value")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if not isinstance(value, str | int | float | bool):
            raise InstrumentError(f"[attributes] {name!r}: a string, number or boolean, "
                                  f"got {value!r}")
        key = ATTRIBUTE_ALIASES.get(name) or str(name)
        problem = attribute_problem({key: value})
        if problem is not None:
            raise InstrumentError(f"[attributes] {name!r}: {problem}")
        out[key] = value
    return out


def _register(raw: Any) -> list[Phase]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise InstrumentError("[[phases]] must be a list of tables (span, parent, key, ...)")
    phases = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise InstrumentError(f"phases[{i}] must be a table, got {item!r}")
        unknown = set(item) - set(_PHASE_FIELDS)
        missing = {"span", "parent"} - set(item)
        if unknown or missing:
            raise InstrumentError(f"phases[{i}]: " + "; ".join(
                ([f"unknown field(s) {', '.join(sorted(unknown))}"] if unknown else [])
                + ([f"missing {', '.join(sorted(missing))}"] if missing else []))
                + f" (fields: {', '.join(_PHASE_FIELDS)})")
        try:
            phases.append(CATALOG.register(item["span"], parent=item["parent"] or None,
                                           key=item.get("key"), gap_key=item.get("gap_key"),
                                           description=item.get("description", "")))
        except (TypeError, ValueError) as e:
            raise InstrumentError(f"phases[{i}]: {e}") from None
    return phases


def _targets(raw: Any, extra_spans: Sequence[str] = ()) -> list[Target]:
    if not isinstance(raw, Mapping):
        raise InstrumentError('[instrument] must be a table of "module:Qualified.name" = phase')
    out = []
    for name, value in raw.items():
        module, sep, qualname = str(name).partition(":")
        if not sep or not module or not qualname or " " in name:
            raise InstrumentError(f"instrument target {name!r} must be 'module:Qualified.name'"
                                  " (e.g. 'mylab.env:MyEnv.step')")
        fields: Mapping[str, Any] = {"phase": value} if isinstance(value, str) else value
        if not isinstance(fields, Mapping) or "phase" not in fields:
            raise InstrumentError(f"instrument target {name!r}: a phase name or a table with "
                                  f"'phase', got {value!r}")
        unknown = set(fields) - set(_TARGET_FIELDS)
        if unknown:
            raise InstrumentError(f"instrument target {name!r}: unknown field(s) "
                                  f"{', '.join(sorted(unknown))} (fields: "
                                  f"{', '.join(_TARGET_FIELDS)})")
        count = fields.get("count")
        if count is not None and not (isinstance(count, str) or (
                isinstance(count, int) and not isinstance(count, bool) and count >= 0)):
            raise InstrumentError(f"instrument target {name!r}: count must be an argument "
                                  f"name or path like 'self.done', or a number of envs "
                                  f"(e.g. 1), got {count!r}")
        if "env_count" in fields and not isinstance(fields["env_count"], str):
            raise InstrumentError(f"instrument target {name!r}: env_count must be an "
                                  f"argument name or path like 'self.num_envs'")
        within = fields.get("within")
        if within is not None and not isinstance(within, str):
            raise InstrumentError(f"instrument target {name!r}: within must be a phase "
                                  f"name, got {within!r}")
        parents = fields.get("parents", False)
        if not isinstance(parents, bool):
            raise InstrumentError(f"instrument target {name!r}: parents must be true or "
                                  f"false, got {parents!r}")
        phase: Any = fields["phase"]
        for span in (phase, within):
            if span is not None and span not in extra_spans:
                try:
                    CATALOG.resolve(span)
                except (TypeError, ValueError) as e:
                    raise InstrumentError(f"instrument target {name!r}: {e}") from None
        # a phase registered by this spec is resolved after registration
        phase = None if phase in extra_spans else CATALOG.resolve(phase)
        out.append(Target(module, qualname, phase, count, fields.get("env_count"), within,
                          parents))
    return out
