"""The processes of a ``resettrace run``: which one is the command's main process, its
run record, and how a spec of ``RESETTRACE_INSTRUMENT`` that cannot be installed ends one."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from resettrace.config import ENV_INSTRUMENT, ENV_RUN_OWNER, ENV_RUN_SUMMARY

log = logging.getLogger("resettrace.instrumentation")

#: the ``RESETTRACE_INSTRUMENT`` spec this process installs (for its error line)
env_spec_path = ""


def spec_failed(message: str) -> NoReturn:
    """End the process over a spec from ``RESETTRACE_INSTRUMENT`` that cannot be installed:
    one line on stderr, exit code 2, no exit hooks (no stats summary saying that nothing
    ran), wherever it happens (start-up, or a module imported later on any thread)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # ``resettrace run`` sets the summary variable in every process of its command
    where = "resettrace run" if ENV_RUN_SUMMARY in os.environ else \
        f"resettrace ({ENV_INSTRUMENT}={env_spec_path})"
    with contextlib.suppress(Exception):
        print(f"{where}: {message}", file=sys.stderr, flush=True)
    os._exit(2)


# -- the processes of a ``resettrace run`` ----------------------------------------------------
def is_run_worker() -> bool:
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
    from resettrace.exit_record import arrange_exit_record
    from resettrace.launcher import process_rank

    if not os.environ.get(ENV_RUN_OWNER, "").strip():
        os.environ[ENV_RUN_OWNER] = str(os.getpid())
    process_rank()  # published for the workers it starts
    arrange_exit_record(environ)


def check_spec(spec: Mapping[str, Any] | str | os.PathLike[str]) -> int:
    """Parse a spec (a mapping, a TOML path, an instrumentation's name, or several of
    those comma-separated) and register its phases without patching anything; the
    target count (what ``resettrace run`` does before it starts the command)."""
    from resettrace.instrumentation.spec import check

    if isinstance(spec, str) and "," in spec and not os.path.exists(spec):
        return sum(check_spec(x.strip()) for x in spec.split(",") if x.strip())
    return len(check(spec).register())
