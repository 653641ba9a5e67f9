"""Wrapping targets in place, now or when their module is imported, and undoing it."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from resettrace.instrumentation.run import is_run_worker, spec_failed
from resettrace.instrumentation.spec import InstrumentError, Target
from resettrace.record import set_untraced_source
from resettrace.tracing.api import traced
from resettrace.tracing.session import add_default_attributes

log = logging.getLogger("resettrace.instrumentation")


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
        self.pending: dict[str, list[tuple[Target, Installed]]] = {}
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

    def patch_when_imported(self, targets: Sequence[Target], installed: Installed) -> None:
        """Patch ``targets`` (of ``installed``) when their modules are imported; those
        never imported are said at exit (:func:`warn_unpatched`)."""
        with self._lock:
            for tgt in targets:
                self.pending.setdefault(tgt.module, []).append((tgt, installed))
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)
        from resettrace.tracing import lifecycle

        lifecycle.at_exit("instrumentation", warn_unpatched)  # (once, however often given)

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
                    spec_failed(str(e))
                with self._lock:
                    self.pending.setdefault(name, []).extend(
                        (t, o) for t, o in waiting if not o.done)
                raise


HOOK = _ImportHook()


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
    with HOOK._lock:
        HOOK.callbacks.setdefault(module, []).append(callback)
        if HOOK not in sys.meta_path:
            sys.meta_path.insert(0, HOOK)

    def undo() -> None:
        with HOOK._lock:
            waiting = HOOK.callbacks.get(module, [])
            if callback in waiting:
                waiting.remove(callback)
                if not waiting:
                    del HOOK.callbacks[module]

    return undo


class Installed:
    """What one ``instrument()`` call installed: patches, pending targets, attributes."""

    def __init__(self, attributes: dict[str, Any], *, from_env: bool = False) -> None:
        self.patches: list[_Patch] = []
        self.attributes = attributes
        self._unset_attributes: Callable[[], None] = lambda: None
        self.done = False
        #: installed from ``RESETTRACE_INSTRUMENT``: a target that fails later ends the
        #: process with one line (:func:`spec_failed`)
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
        with HOOK._lock:
            for name in list(HOOK.pending):
                HOOK.pending[name] = [(t, o) for t, o in HOOK.pending[name] if o is not self]
                if not HOOK.pending[name]:
                    del HOOK.pending[name]
        self._unset_attributes()


def findable(module: str) -> bool:
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


def untraced_targets() -> list[str]:
    """The instrument targets of this process whose module was never imported, so never
    traced (a run record lists them: a job says the ones no process imported)."""
    with HOOK._lock:  # (a module whose import raised is said by the process itself)
        return sorted(t.name for m, ts in HOOK.pending.items() for t, _ in ts
                      if m not in HOOK.failed_imports)


set_untraced_source(untraced_targets)  # (a process's records list them)


def warn_unpatched() -> None:
    from resettrace.exit_record import run_main_process

    if is_run_worker():
        return  # a helper process of a ``resettrace run`` command: its main one speaks
    with HOOK._lock:
        waiting = {m: sorted(t.name for t, _ in ts) for m, ts in HOOK.pending.items()}
        failed = dict(HOOK.failed_imports)
    names = untraced_targets()
    if names and run_main_process():
        names = []  # its record lists them: the job says the ones no process imported
    if names and _started_workers():  # (a Stable-Baselines3 SubprocVecEnv's main process)
        log.info("resettrace: instrument target(s) never imported in this process, which "
                 "started worker processes that may have (resettrace run says the ones no "
                 "process of the job imported): %s", ", ".join(names))
        names = []
    if names:
        log.warning("resettrace: instrument target(s) never imported, so never traced: %s",
                    ", ".join(names))
    for module, error in sorted(failed.items()):
        if waiting.get(module):
            log.warning("resettrace: instrument target(s) never traced: importing their "
                        "module %r raised %s: %s", module, error, ", ".join(waiting[module]))


def _started_workers() -> bool:
    """Whether this process started multiprocessing workers (fork, forkserver, spawn):
    multiprocessing numbers each one it makes from one counter, which starts at 1."""
    mp = sys.modules.get("multiprocessing")
    counter = getattr(getattr(mp, "process", None), "_process_counter", None)
    return counter is not None and repr(counter) != "count(1)"
