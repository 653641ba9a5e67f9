"""Shipped instrumentations of the stacks users train on, by name.

``resettrace run --instrument NAME``, ``RESETTRACE_INSTRUMENT=NAME`` and
``resettrace.instrument(NAME)`` take a name where they take a spec file: ``motrixlab``
(MotrixSim's env framework, ``motrix-env-core``), ``gymnasium`` (Gymnasium vector envs
and MuJoCo envs), ``sb3`` (Stable-Baselines3's vector envs and MuJoCo envs) and ``mjlab``
(mjlab's manager-based envs on MuJoCo Warp) ship with resettrace; third parties add theirs
through the entry-point group :data:`ENTRY_POINT_GROUP` (as ``opentelemetry-instrument``
finds instrumentors), each entry point naming an :class:`Instrumentation`.

An instrumentation is a spec (the same dict a TOML spec file holds: attributes, phases,
targets) plus, optionally, code of its own installed beside it (a bridge to a stack's own
profiler, say), and the version range of the package it was written for: another
installed version is said in one line, and a stack that is not installed is an error.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Instrumentation", "ENTRY_POINT_GROUP", "known", "get", "version_problem"]

log = logging.getLogger(__name__)

#: the entry-point group third parties register their instrumentations in
ENTRY_POINT_GROUP = "resettrace.instrumentations"
#: the shipped ones: name -> "module:attribute"
BUILTIN = {"motrixlab": "resettrace.stacks.motrixlab:INSTRUMENTATION",
           "gymnasium": "resettrace.stacks.gymnasium:INSTRUMENTATION",
           "sb3": "resettrace.stacks.sb3:INSTRUMENTATION",
           "mjlab": "resettrace.stacks.mjlab:INSTRUMENTATION"}


@dataclass(frozen=True)
class Instrumentation:
    """A named instrumentation of one stack."""

    #: its name (``--instrument NAME``)
    name: str
    #: the distribution it instruments (``motrix-env-core``)
    distribution: str
    #: the versions it was written for, as a version specifier (``">=0.4.0,<0.5"``)
    supported: str
    #: the spec (attributes, phases, instrument targets), as a spec file would hold it
    spec: Callable[[], dict[str, Any]]
    #: code installed beside the spec (after it); returns its own undo
    install: Callable[[], Callable[[], None]] | None = None
    description: str = ""


def known() -> dict[str, str]:
    """Every instrumentation name and where it is defined (shipped, then entry points)."""
    out = dict(BUILTIN)
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            out.setdefault(ep.name, ep.value)
    except Exception:  # a broken environment must not stop the shipped ones
        log.debug("resettrace: cannot read the %s entry points", ENTRY_POINT_GROUP,
                  exc_info=True)
    return out


def get(name: str) -> Instrumentation:
    """The instrumentation called ``name``; ``KeyError`` when there is none,
    ``ImportError``/``TypeError`` when its definition cannot be loaded."""
    where = known()[name]
    module, _, attr = where.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Instrumentation):
        obj = obj()
    if not isinstance(obj, Instrumentation):
        raise TypeError(f"{where} is not a resettrace Instrumentation ({type(obj).__name__})")
    return obj


def _satisfies(version: str, supported: str) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) in SpecifierSet(supported)
    except (InvalidSpecifier, InvalidVersion):
        return False


def version_problem(inst: Instrumentation) -> tuple[bool, str | None]:
    """``(installed, note)``: whether the stack is installed, and one line when its
    version is not one the instrumentation was written for."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = version(inst.distribution)
    except PackageNotFoundError:
        return False, (f"instrumentation {inst.name!r} instruments {inst.distribution}, which "
                       "is not installed here")
    if not _satisfies(have, inst.supported):
        return True, (f"instrumentation {inst.name!r} was written for {inst.distribution} "
                      f"{inst.supported}; {have} is installed: phases may be missing or "
                      "misplaced")
    return True, None
