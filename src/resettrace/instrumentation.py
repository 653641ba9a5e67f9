"""Zero-code tracing: wrap existing functions and methods from a spec.

A spec (a TOML file or the same as a mapping) names span attributes, phases of
your own and the functions to record::

    [attributes]                       # on every span (backend, task, env_count or any key)
    backend = "mylab-mujoco"

    [[phases]]                         # phases of your own (register_phase's arguments)
    span = "dr_reset.terrain_sample"
    parent = "dr_reset"

    [instrument]                       # "module:Qualified.name" = phase, or a table
    "mylab.env:MyEnv.step" = "env_step"
    "mylab.env:MyEnv.reset_done" = { phase = "reset_done", count = "self.done" }

    [instrument."mylab.backend:MyBackend.set_state"]  # a table on lines of its own (TOML's
    phase = "set_state"                               # inline tables fit on one line)
    count = "env_ids"
    env_count = "self.num_envs"

Each target is wrapped with :func:`resettrace.traced` (``count`` and ``env_count``
as there). A module already imported is patched at once; any other when it is
first imported (a ``sys.meta_path`` hook), so the spec can be installed before the
training code starts. Errors in the spec and targets that cannot be wrapped (unknown
module, missing attribute, not a function, a generator or async function, a count
argument it does not have, an unknown phase) raise :class:`InstrumentError` naming
them: at once where possible, else from the import of the module. The spec of
``RESETTRACE_INSTRUMENT`` (what ``resettrace run`` installs) instead ends the process
with one line on stderr and exit code 2, at start-up or at that import.

:func:`instrument` returns an ``undo()`` that restores every original. The
``RESETTRACE_INSTRUMENT=SPEC`` variable makes ``import resettrace`` install the
spec (what ``resettrace run`` sets up, with a ``sitecustomize`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from resettrace.catalog import ATTR_BACKEND, ATTR_ENV_COUNT, ATTR_TASK, CATALOG, Phase
from resettrace.config import ENV_INSTRUMENT, ENV_RUN_OWNER, ENV_RUN_SUMMARY
from resettrace.tracing.api import traced
from resettrace.tracing.session import add_default_attributes, attribute_problem

log = logging.getLogger(__name__)

__all__ = ["instrument", "instrument_from_env", "check_spec", "InstrumentError", "load_spec",
           "Target", "ENV_INSTRUMENT", "arrange_run"]

#: short attribute names of the spec's ``[attributes]`` table
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


# -- patching -------------------------------------------------------------------------------
class _Patch:
    """One wrapped attribute and how to put the original back."""

    def __init__(self, target: Target, module: ModuleType) -> None:
        owner: Any = module
        parts = target.qualname.split(".")
        for i, part in enumerate(parts[:-1]):
            owner = _lookup(target, owner, ".".join([target.module] + parts[:i]), part)
        name = parts[-1]
        raw = None
        if isinstance(owner, type):  # the class's own or an inherited one, undecorated
            raw = next((k.__dict__[name] for k in owner.__mro__ if name in k.__dict__), None)
        if raw is None:
            raw = _lookup(target, owner, ".".join([target.module] + parts[:-1]), name)
        self.owner, self.name = owner, name
        self.had_own = isinstance(owner, type) and name in owner.__dict__ or \
            not isinstance(owner, type)
        self.original = raw
        kind: Callable[[Any], Any] | None = None
        fn = raw
        if isinstance(raw, staticmethod | classmethod):
            kind, fn = type(raw), raw.__func__
        elif isinstance(owner, type) and not callable(raw):
            fn = None
        if isinstance(fn, type):  # a wrapper function would break isinstance and subclassing
            raise InstrumentError(f"instrument target {target.name!r} is a class, not a "
                                  f"function or method (e.g. '{target.name}.__init__')")
        if fn is None or not callable(fn):
            raise InstrumentError(f"instrument target {target.name!r} is not a function or "
                                  f"method ({type(raw).__name__})")
        if getattr(fn, "__resettrace_phase__", None) is not None:
            raise InstrumentError(f"instrument target {target.name!r} is already traced")
        try:
            wrapped = traced(target.phase, count=target.count, env_count=target.env_count,
                             within=target.within, parents=target.parents)(fn)
        except (TypeError, ValueError) as e:
            raise InstrumentError(f"instrument target {target.name!r}: {e}") from None
        try:
            setattr(owner, name, kind(wrapped) if kind is not None else wrapped)
        except (AttributeError, TypeError) as e:  # a built-in or extension type's method
            raise InstrumentError(f"instrument target {target.name!r} cannot be replaced: "
                                  f"{e}") from None

    def undo(self) -> None:
        if self.had_own:
            setattr(self.owner, self.name, self.original)
        else:  # the method was inherited: drop the wrapper, the base class's shows again
            delattr(self.owner, self.name)


def _lookup(target: Target, owner: Any, where: str, name: str) -> Any:
    """``owner.name``, or an :class:`InstrumentError` naming the target: not found, or the
    lookup raised (a module ``__getattr__``, a descriptor)."""
    try:
        return getattr(owner, name)
    except AttributeError:
        raise InstrumentError(f"instrument target {target.name!r} not found: {where!r} has "
                              f"no attribute {name!r}") from None
    except Exception as e:  # noqa: BLE001 - the user's code raised: name it, in one line
        raise InstrumentError(f"instrument target {target.name!r}: looking up {name!r} on "
                              f"{where!r} raised {type(e).__name__}: {e}") from None


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then patches the module's targets."""

    def __init__(self, loader: importlib.abc.Loader, hook: _ImportHook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        except BaseException as e:  # the module's own error: its own traceback, as ever
            self._hook.failed(module.__name__, e)
            raise
        self._hook.loaded(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... as the real one
        return getattr(self._loader, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Patches targets of modules that are imported after the spec was installed."""

    def __init__(self) -> None:
        self.pending: dict[str, list[tuple[Target, _Installed]]] = {}
        #: modules with pending targets whose import raised, and what it raised
        self.failed_imports: dict[str, str] = {}
        #: code to run when a module is imported (:func:`when_imported`)
        self.callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._busy: set[str] = set()
        self._lock = threading.RLock()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname in self._busy or (
                fullname not in self.pending and fullname not in self.callbacks
                and not any(name.startswith(fullname + ".")
                            for name in (*self.pending, *self.callbacks))):
            return None  # (a package of a waiting module: it may register it while loading)
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self)
        return spec

    def failed(self, name: str, error: BaseException) -> None:
        with self._lock:
            if name in self.pending:
                self.failed_imports[name] = type(error).__name__

    def loaded(self, module: ModuleType) -> None:
        """Patch the targets waiting for ``module``. A target that cannot be patched fails
        the import: an :class:`InstrumentError` for a spec installed in code (its targets
        wait again: the failed import left no module), one line and exit code 2 for the
        spec of ``RESETTRACE_INSTRUMENT``, never a traceback inside the user's import."""
        # submodules a package registers itself while it loads (an extension's native
        # ones, such as ``motrixsim.write``: never imported through the finders) too
        prefix = module.__name__ + "."
        with self._lock:
            names = [module.__name__] + [n for n in {*self.pending, *self.callbacks}
                                         if n.startswith(prefix) and n in sys.modules]
        for name in names:
            self._patch(name, module if name == module.__name__ else sys.modules[name])
            with self._lock:
                callbacks = self.callbacks.pop(name, [])
            for callback in callbacks:
                _run_callback(callback, sys.modules.get(name, module))

    def _patch(self, name: str, target_module: ModuleType) -> None:
        with self._lock:
            waiting = self.pending.pop(name, [])
            self.failed_imports.pop(name, None)
        for tgt, owner in waiting:
            try:
                owner.patch(tgt, target_module)
            except InstrumentError as e:
                if owner.from_env:
                    _spec_failed(str(e))
                with self._lock:
                    self.pending.setdefault(name, []).extend(
                        (t, o) for t, o in waiting if not o.done)
                raise


_HOOK = _ImportHook()


def _run_callback(callback: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        callback(module)
    except Exception as e:  # noqa: BLE001 - never break the user's import over it
        log.warning("resettrace: %s on import of %r failed (%s: %s); not installed",
                    getattr(callback, "__qualname__", callback), module.__name__,
                    type(e).__name__, e)


def when_imported(module: str, callback: Callable[[ModuleType], None]) -> Callable[[], None]:
    """Run ``callback(module)`` now when ``module`` is imported, else right after its
    import (before any other module can use it); return an ``undo`` that drops it if it
    has not run. What an instrumentation's own code (a bridge to a stack's profiler) uses
    to patch a module the training code imports later. A callback that raises is logged
    and skipped, never raised into the user's import."""
    loaded = sys.modules.get(module)
    if loaded is not None and not getattr(loaded.__spec__, "_initializing", False):
        _run_callback(callback, loaded)
        return lambda: None
    with _HOOK._lock:
        _HOOK.callbacks.setdefault(module, []).append(callback)
        if _HOOK not in sys.meta_path:
            sys.meta_path.insert(0, _HOOK)

    def undo() -> None:
        with _HOOK._lock:
            waiting = _HOOK.callbacks.get(module, [])
            if callback in waiting:
                waiting.remove(callback)
                if not waiting:
                    del _HOOK.callbacks[module]

    return undo


class _Installed:
    """What one ``instrument()`` call installed: patches, pending targets, attributes."""

    def __init__(self, attributes: dict[str, Any], *, from_env: bool = False) -> None:
        self.patches: list[_Patch] = []
        self.attributes = attributes
        self._unset_attributes: Callable[[], None] = lambda: None
        self.done = False
        #: installed from ``RESETTRACE_INSTRUMENT``: a target that fails later ends the
        #: process with one line (:func:`_spec_failed`)
        self.from_env = from_env

    def set_attributes(self) -> None:
        self._unset_attributes = add_default_attributes(self.attributes)

    def patch(self, target: Target, module: ModuleType) -> None:
        if not self.done:
            self.patches.append(_Patch(target, module))

    def undo(self) -> None:
        """Restore every original and forget the targets not imported yet."""
        if self.done:
            return
        self.done = True
        for p in reversed(self.patches):
            p.undo()
        self.patches.clear()
        with _HOOK._lock:
            for name in list(_HOOK.pending):
                _HOOK.pending[name] = [(t, o) for t, o in _HOOK.pending[name] if o is not self]
                if not _HOOK.pending[name]:
                    del _HOOK.pending[name]
        self._unset_attributes()


def _findable(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing anything.

    Searched on ``sys.path`` plus the folder Python adds for the main script, which is
    not on ``sys.path`` yet while ``sitecustomize`` runs; submodules in their package's
    folders (the package's ``__path__`` once it is imported).
    """
    parts = module.split(".")
    main = sys.argv[0] if sys.argv else ""
    extra = [os.path.dirname(os.path.abspath(main))] if main not in ("", "-c", "-m") \
        else [os.getcwd()]
    spec = None
    for i in range(len(parts)):
        name = ".".join(parts[:i + 1])
        loaded = sys.modules.get(name)
        if loaded is not None:
            spec = loaded.__spec__
            if spec is None:
                return hasattr(loaded, "__path__") or i == len(parts) - 1
            continue
        try:
            if i == 0:
                spec = importlib.util.find_spec(name) if name in sys.builtin_module_names \
                    else importlib.machinery.PathFinder.find_spec(name, sys.path + extra)
            else:
                where = spec.submodule_search_locations if spec is not None else None
                found = None if where is None else importlib.machinery.PathFinder.find_spec(
                    name, list(where))
                if found is None:
                    # not a file of its package: a submodule the package registers itself
                    # when it loads (an extension's native one), checked then
                    return True
                spec = found
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
    return True


def _warn_unpatched() -> None:
    if _run_worker():
        return  # a helper process of a ``resettrace run`` command: its main one speaks
    with _HOOK._lock:
        waiting = {m: sorted(t.name for t, _ in ts) for m, ts in _HOOK.pending.items()}
        failed = dict(_HOOK.failed_imports)
    names = sorted(n for m, ts in waiting.items() if m not in failed for n in ts)
    if names:
        log.warning("resettrace: instrument target(s) never imported, so never traced: %s",
                    ", ".join(names))
    for module, error in sorted(failed.items()):
        if waiting.get(module):
            log.warning("resettrace: instrument target(s) never traced: importing their "
                        "module %r raised %s: %s", module, error, ", ".join(waiting[module]))


def _spec_failed(message: str) -> NoReturn:
    """End the process over a spec from ``RESETTRACE_INSTRUMENT`` that cannot be installed:
    one line on stderr, exit code 2, no exit hooks (no stats summary saying that nothing
    ran), wherever it happens (start-up, or a module imported later on any thread)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # ``resettrace run`` sets the summary variable in every process of its command
    where = "resettrace run" if ENV_RUN_SUMMARY in os.environ else \
        f"resettrace ({ENV_INSTRUMENT}={_FROM_ENV_PATH})"
    with contextlib.suppress(Exception):
        print(f"{where}: {message}", file=sys.stderr, flush=True)
    os._exit(2)


def instrument(spec: Mapping[str, Any] | str | os.PathLike[str], *,
               strict: bool = True) -> Callable[[], None]:
    """Install a spec (a mapping, a TOML path, the name of a shipped or registered
    instrumentation such as ``"motrixlab"`` or ``"gymnasium"``, or several of those
    comma-separated); return ``undo``. See the module docstring.

    The spec and its targets are checked first (a module that cannot be found is an
    error unless ``strict=False``: then it waits, and is reported at exit if never
    imported); then its phases are registered, every target of a module already
    imported is wrapped, and the others when their module is imported (a target that
    cannot be wrapped then, as one missing from its module, raises
    :class:`InstrumentError` from that import). Nothing is left installed when it
    raises, but phases stay registered (a catalog only grows).
    """
    return _install(spec, strict=strict, from_env=False)


def _install(spec: Mapping[str, Any] | str | os.PathLike[str], *, strict: bool,
             from_env: bool) -> Callable[[], None]:
    if isinstance(spec, str) and "," in spec and not os.path.exists(spec):
        undos: list[Callable[[], None]] = []
        try:  # several: names and paths, installed in order
            for item in (x.strip() for x in spec.split(",") if x.strip()):
                undos.append(_install(item, strict=strict, from_env=from_env))
        except BaseException:
            for undo in reversed(undos):
                undo()
            raise

        def undo_all() -> None:
            for undo in reversed(undos):
                undo()

        return undo_all
    inst = named(spec)
    undo = _install_spec(inst.spec() if inst is not None else spec, strict=strict,
                         from_env=from_env)
    if inst is None or inst.install is None:
        return undo
    try:
        extra = inst.install()
    except BaseException:
        undo()
        raise

    def both() -> None:
        extra()
        undo()

    return both


def _install_spec(spec: Mapping[str, Any] | str | os.PathLike[str], *, strict: bool,
                  from_env: bool) -> Callable[[], None]:
    data = _sections(spec)
    attributes = _attributes(data.get("attributes", {}))
    raw_phases, raw_targets = data.get("phases", []), data.get("instrument", {})
    spans = [str(p.get("span")) for p in raw_phases if isinstance(p, Mapping)] \
        if isinstance(raw_phases, Sequence) and not isinstance(raw_phases, str) else []
    # everything that can be checked is checked before anything is registered or patched
    for tgt in _targets(raw_targets, spans):
        if tgt.module not in sys.modules and not _findable(tgt.module):
            if strict:
                raise InstrumentError(f"instrument target {tgt.name!r}: no module named "
                                      f"{tgt.module!r}")
    _register(raw_phases)
    targets = _targets(raw_targets)
    installed = _Installed(attributes, from_env=from_env)
    try:
        # after every check: looking up a module never imports it, but a module may be
        # loaded meanwhile, so which ones are is only known now
        later = []
        for tgt in targets:
            module = sys.modules.get(tgt.module)
            if module is not None and getattr(module.__spec__, "_initializing", False):
                if strict:
                    raise InstrumentError(
                        f"instrument target {tgt.name!r}: module {tgt.module!r} was still "
                        "being imported when the spec was installed (it imports resettrace "
                        "itself); install the spec before it: resettrace run, or import "
                        "resettrace first")
                module = None  # never patched: reported at exit
            if module is not None:
                installed.patch(tgt, module)
            else:
                later.append(tgt)
    except BaseException:
        installed.undo()
        raise
    installed.set_attributes()
    if later:
        with _HOOK._lock:
            for tgt in later:
                _HOOK.pending.setdefault(tgt.module, []).append((tgt, installed))
            if _HOOK not in sys.meta_path:
                sys.meta_path.insert(0, _HOOK)
                import atexit

                atexit.register(_warn_unpatched)
    return installed.undo


def _is_cli() -> bool:
    """Whether this process is the ``resettrace`` command itself (its console script or
    ``python -m resettrace.cli``), started before its own module runs."""
    if os.path.basename(sys.argv[0] if sys.argv else "").partition(".")[0] == "resettrace":
        return True
    argv = list(getattr(sys, "orig_argv", ()))
    return any(a == "-m" and argv[i + 1:i + 2] == ["resettrace.cli"] or a == "-mresettrace.cli"
               for i, a in enumerate(argv))


def instrument_from_env(environ: Mapping[str, str] | None = None) -> Callable[[], None] | None:
    """Install the spec named by ``RESETTRACE_INSTRUMENT`` (once per process).

    Not in the ``resettrace`` command's own process: ``resettrace run`` checks the spec
    and hands it to its command, whose modules it may not even find. A spec that cannot
    be installed, now or when a target's module is imported later, ends the process with
    one line on stderr and exit code 2, as ``resettrace run`` does for a bad spec.
    """
    env = os.environ if environ is None else environ
    path = env.get(ENV_INSTRUMENT, "").strip()
    if not path or _is_cli():
        return None
    global _FROM_ENV, _FROM_ENV_PATH
    if _FROM_ENV is None:
        _FROM_ENV_PATH = path
        # the first process is the program; the ones it starts (workers, subprocesses,
        # from other folders) never fail over a module they cannot find
        strict = not _run_worker()
        if not os.environ.get(ENV_RUN_OWNER, "").strip():
            os.environ[ENV_RUN_OWNER] = str(os.getpid())
        try:
            _FROM_ENV = _install(path, strict=strict, from_env=True)
        except InstrumentError as e:
            _spec_failed(str(e))
    return _FROM_ENV


_FROM_ENV: Callable[[], None] | None = None
_FROM_ENV_PATH = ""


# -- the processes of a ``resettrace run`` ----------------------------------------------------
def _run_worker() -> bool:
    """Whether this process was started by the main process of a ``resettrace run``
    (a multiprocessing worker, its resource tracker, a subprocess, a fork)."""
    owner = os.environ.get(ENV_RUN_OWNER, "").strip()
    return bool(owner) and owner != str(os.getpid())


def arrange_run(environ: Mapping[str, str] | None = None) -> None:
    """In a process of a ``resettrace run``: the first one marks itself the command's main
    process (``RESETTRACE_RUN_OWNER``: every process it starts, whichever way, knows it
    is not), its rank is resolved now (before the command's code changes the
    environment), and its run record is written at exit (:func:`resettrace.record.
    arrange_exit_record`)."""
    from resettrace.config import process_rank
    from resettrace.record import arrange_exit_record

    if not os.environ.get(ENV_RUN_OWNER, "").strip():
        os.environ[ENV_RUN_OWNER] = str(os.getpid())
    process_rank()  # published for the workers it starts
    arrange_exit_record(environ)


def check_spec(spec: Mapping[str, Any] | str | os.PathLike[str]) -> int:
    """Parse a spec (a mapping, a TOML path, an instrumentation's name, or several of
    those comma-separated) and register its phases without patching anything; the
    target count."""
    if isinstance(spec, str) and "," in spec and not os.path.exists(spec):
        return sum(check_spec(x.strip()) for x in spec.split(",") if x.strip())
    data = _sections(spec)
    _attributes(data.get("attributes", {}))
    _register(data.get("phases", []))
    return len(_targets(data.get("instrument", {})))
