"""Installing a spec: ``instrument()`` and ``RESETTRACE_INSTRUMENT``."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from resettrace.config import ENV_INSTRUMENT, ENV_RUN_OWNER
from resettrace.instrumentation import run
from resettrace.instrumentation.patching import HOOK, Installed, findable
from resettrace.instrumentation.run import is_run_worker, spec_failed
from resettrace.instrumentation.spec import InstrumentError, check, named

log = logging.getLogger("resettrace.instrumentation")


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
    # everything that can be checked is checked before anything is registered or patched
    checked = check(spec)
    for tgt in checked.targets:
        if tgt.module not in sys.modules and not findable(tgt.module):
            if strict:
                raise InstrumentError(f"instrument target {tgt.name!r}: no module named "
                                      f"{tgt.module!r}")
    targets = checked.register()
    installed = Installed(checked.attributes, from_env=from_env)
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
        HOOK.patch_when_imported(later, installed)
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
    global _FROM_ENV
    if _FROM_ENV is None:
        run.env_spec_path = path
        # the first process is the program; the ones it starts (workers, subprocesses,
        # from other folders) never fail over a module they cannot find
        strict = not is_run_worker()
        if not os.environ.get(ENV_RUN_OWNER, "").strip():
            os.environ[ENV_RUN_OWNER] = str(os.getpid())
        try:
            _FROM_ENV = _install(path, strict=strict, from_env=True)
        except InstrumentError as e:
            spec_failed(str(e))
    return _FROM_ENV


_FROM_ENV: Callable[[], None] | None = None
