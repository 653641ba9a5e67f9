"""Ray: trace a job's actors and tasks the way its driver is traced, through Ray's own
``runtime_env``.

Ray starts actors in worker processes of its own (the raylet's), not forked from the
driver: a cluster started beforehand (``ray start``) never sees the driver's environment.
A job's ``runtime_env`` reaches every worker of the job on every node, so that is where
resettrace goes:

- ``resettrace run -- python driver.py`` sets ``RAY_RUNTIME_ENV_HOOK`` to
  :func:`runtime_env_hook`: every ``ray.init()`` of the driver (a local cluster it starts,
  or ``ray.init(address=...)`` to one started beforehand) gets :func:`runtime_env`'s
  additions, with no change to the code;
- without ``resettrace run``: ``ray.init(runtime_env=resettrace.ray.runtime_env())`` (or
  ``runtime_env(theirs)`` around a runtime env of the user's own).

What a worker gets: the driver's ``RESETTRACE`` and ``RESETTRACE_*`` variables (mode,
instrument spec, run record path, run id, exporter, ...) and its ``OTEL_*`` ones except
the ``..._HEADERS`` variables (credentials stay where the user put them: set those on the
nodes), and resettrace's start-up folder first on ``PYTHONPATH``, so a worker process installs the
spec before it imports the user's code, as every process of a ``resettrace run`` does.
Each worker keeps its run record current on disk (:func:`resettrace.record.
keep_record_current`): an actor that Ray force-kills (``ray.shutdown()``, ``ray.kill``,
RLlib's ``algo.stop()``) leaves its last snapshot, and the job's record holds it, marked
incomplete. resettrace must be installed on every node, and the record path must be one
the driver can read (a shared file system) for the job to hold the records of other nodes;
spans go wherever the exporter points (an OpenTelemetry Collector for many nodes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from resettrace.config import ENV_MODE, ENV_RUN_OWNER
from resettrace.launcher import ENV_PARENT_RANK

__all__ = ["runtime_env", "runtime_env_hook", "ENV_NEXT_HOOK"]

#: a ``RAY_RUNTIME_ENV_HOOK`` that was set before ``resettrace run`` set its own: run first
ENV_NEXT_HOOK = "RESETTRACE_RAY_NEXT_HOOK"
#: never copied to the workers: this process's own (its rank) or credentials
_NOT_COPIED = (ENV_PARENT_RANK, ENV_NEXT_HOOK)


def _copied(name: str) -> bool:
    if name in _NOT_COPIED:
        return False
    if name == ENV_MODE or name.startswith("RESETTRACE_"):
        return True
    return name.startswith("OTEL_") and not name.endswith("_HEADERS")


def runtime_env(runtime_env: Mapping[str, Any] | None = None, *,
                environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``runtime_env`` (default: none) with what traces the job's workers (the module
    docstring): variables it sets itself are kept; ``PYTHONPATH`` gets resettrace's
    start-up folder first."""
    from resettrace import _run

    env = os.environ if environ is None else environ
    out = dict(runtime_env or {})
    given = out.get("env_vars") or {}
    if not isinstance(given, Mapping):
        raise TypeError(f"runtime_env['env_vars'] must map variable names to values, not "
                        f"{type(given).__name__}")
    env_vars = {str(k): str(v) for k, v in given.items()}
    for name, value in env.items():
        if _copied(name):
            env_vars.setdefault(name, value)
    # the workers are not the job's main process (that is the driver)
    env_vars.setdefault(ENV_RUN_OWNER, env.get(ENV_RUN_OWNER, "").strip() or str(os.getpid()))
    boot = str(Path(_run.__file__).resolve().parent)
    path = env_vars.get("PYTHONPATH", "${PYTHONPATH}")
    if boot not in path.split(os.pathsep):
        env_vars["PYTHONPATH"] = boot + os.pathsep + path
    out["env_vars"] = env_vars
    return out


def runtime_env_hook(runtime_env_: dict[str, Any] | None) -> dict[str, Any]:
    """Ray's ``RAY_RUNTIME_ENV_HOOK`` (set by ``resettrace run``): the driver's runtime env
    (after a hook that was set before, ``RESETTRACE_RAY_NEXT_HOOK``) with :func:`runtime_env`'s
    additions."""
    nxt = os.environ.get(ENV_NEXT_HOOK, "").strip()
    if nxt:  # ``package.module.function``, as Ray names its hook
        import importlib

        module, _, name = nxt.rpartition(".")
        runtime_env_ = getattr(importlib.import_module(module), name)(runtime_env_)
    return runtime_env(runtime_env_)
