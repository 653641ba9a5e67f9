"""The folder ``resettrace run`` puts first on ``PYTHONPATH``: its ``sitecustomize``
installs ``RESETTRACE_INSTRUMENT`` in every Python process of the command.

:func:`helper_environment` is the environment that undoes it, for resettrace's own helper
processes (the export child, the test receivers)."""

from __future__ import annotations

import os

from resettrace.config import ENV_INSTRUMENT, ENV_RUN_PREFIX

__all__ = ["helper_environment"]


def helper_environment() -> dict[str, str]:
    """This process's environment for a helper process of resettrace's own (the export
    child): without ``RESETTRACE_INSTRUMENT``, ``resettrace run``'s variables and this
    folder on ``PYTHONPATH`` (its ``sitecustomize``), which are for the user's processes."""
    env = dict(os.environ)
    for name in list(env):
        if name == ENV_INSTRUMENT or name.startswith(ENV_RUN_PREFIX):
            del env[name]
    run_dir = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.abspath(p) != run_dir]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    else:
        env.pop("PYTHONPATH", None)
    return env
