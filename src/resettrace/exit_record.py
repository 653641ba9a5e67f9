"""A process's own run record (``RESETTRACE_RUN_JSON``): kept current by snapshots every
``RESETTRACE_RECORD_PERIOD`` seconds while it records (so a process killed without warning
leaves its last one), and written complete at exit, in a ``multiprocessing`` worker too;
``resettrace run``'s main process also writes those of the processes that never recorded.
The record itself is :mod:`resettrace.record`'s."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from resettrace.config import ENV_RUN_ID, ENV_RUN_JSON
from resettrace.outputs import expand_path
from resettrace.record import RunRecord, untraced_targets, write_run
from resettrace.version import __version__

log = logging.getLogger("resettrace")

__all__ = ["arrange_exit_record", "keep_record_current", "record_period", "run_main_process",
           "snapshot_period"]


_EXIT: dict[str, Any] = {"pid": None, "written": None}

#: the snapshots of this process's record: the pid whose thread runs, the period (s), the
#: thread's stop event; ``lock`` orders a snapshot before the record written at exit
_SNAP: dict[str, Any] = {"pid": None, "period": 0.0, "stop": None, "lock": None}
#: the first snapshot of a process comes this soon after its first recording (s), so that
#: its job knows of it early (at most the period)
_FIRST_SNAPSHOT = 0.5


def snapshot_period() -> float | None:
    """Seconds between this process's snapshots; None when it takes none."""
    return _SNAP["period"] or None


def record_period(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between the snapshots of a process's record (``RESETTRACE_RECORD_PERIOD``,
    default 5; 0: only at exit; :func:`resettrace.config.run_number`)."""
    from resettrace.config import run_number

    return run_number("record_period_s", environ)


def keep_record_current(session: Any) -> bool:
    """Keep this process's record current on disk while it runs: a snapshot
    (``complete`` false; :func:`record_of_session` with ``snapshot``) soon after it first
    records, then every :func:`record_period` seconds, each an atomic replace of the file
    it writes at exit; a process killed without warning (SIGKILL, an OOM kill, Ray's
    force kill) leaves its last one. On a thread of its own; once per process (a forked
    worker starts its own). True when running."""

    if _SNAP["pid"] == os.getpid():
        return True
    period = record_period()
    _SNAP["period"] = period
    if period <= 0 or not os.environ.get(ENV_RUN_JSON, "").strip():
        return False
    _SNAP["pid"] = os.getpid()
    stop = _SNAP["stop"] = threading.Event()
    _SNAP["lock"] = threading.Lock()
    thread = threading.Thread(target=_snapshots, args=(session, period, stop),
                              name="resettrace-record", daemon=True)
    thread.start()
    return True


def _snapshots(session: Any, period: float, stop: Any, cpu: list[float] | None = None
               ) -> None:
    """The snapshot thread: a snapshot every ``period`` s until ``stop`` is set (``cpu``:
    the thread CPU time of each is appended to it: ``bench snapshots``)."""
    wait = min(_FIRST_SNAPSHOT, period)
    while not stop.wait(wait):
        wait = period
        try:
            t0 = time.thread_time()
            _write_snapshot(session)
            if cpu is not None:
                cpu.append(time.thread_time() - t0)
        except Exception as e:  # noqa: BLE001 - a snapshot never ends the process
            from resettrace.envvars import say_once

            say_once(f"resettrace: a snapshot of the run record was not written: {e}")


def _write_snapshot(session: Any) -> None:
    lock = _SNAP["lock"]
    with lock:
        if _EXIT["written"] == os.getpid() or _SNAP["pid"] != os.getpid():
            return  # the record of its exit is written (or being written): the last word
        template = os.environ.get(ENV_RUN_JSON, "").strip()
        proc = session.aggregator
        if not template or session.closed or proc is None or not proc.totals() or \
                _jobs_path_not_mine(template):
            return
        write_run(template, session, snapshot=True)


def _snapshot_lock() -> Any:
    """The lock a snapshot holds while it writes, when this process writes them: no fork
    may come while it does (the write holds its folder's ``flock``, and a child would keep
    a copy of it, and the lock, for its life: the parent's next write would wait forever)."""
    return _SNAP["lock"] if _SNAP["pid"] == os.getpid() else None


def _forget_snapshots() -> None:  # in a forked child: the parent's thread is not here
    _SNAP["pid"] = None


def _arm_fork_steps() -> None:
    from resettrace.tracing import lifecycle

    lifecycle.hold_across_fork(_snapshot_lock)
    lifecycle.at_fork(_forget_snapshots)


_arm_fork_steps()


def arrange_exit_record(environ: Mapping[str, str] | None = None) -> bool:
    """Arrange that this process writes its record at exit to ``RESETTRACE_RUN_JSON``
    (``{pid}`` and ``{rank}`` expand; without either, only the first process of the job
    writes it): at normal exit, when a multiprocessing worker leaves (fork, forkserver,
    spawn), and never when it recorded nothing. Once it records (its first session, or
    one inherited over a fork), SIGTERM ends it through its exit hooks (a pool's
    ``terminate()`` too), and a worker's SIGTERM is watched for
    (:func:`resettrace.tracing.exits.watch_sigterm`); a process that never records
    keeps the default action, so it ends at once, as it would without resettrace. True
    when arranged."""
    env = os.environ if environ is None else environ
    template = env.get(ENV_RUN_JSON, "").strip()
    if not template:
        return False
    if _EXIT["pid"] == os.getpid():
        return True
    from multiprocessing import util

    from resettrace.tracing import lifecycle
    from resettrace.tracing.session import ON_SESSION

    _EXIT["pid"] = os.getpid()
    if "{pid}" not in template and "{rank}" not in template and not _job_worker():
        from resettrace import outputs

        try:  # the job's one path: another job that writes it meanwhile keeps its file
            outputs.claim_output(template, outputs.JSON)
        except OSError:
            pass  # a refused path is said when the record is written
    lifecycle.at_exit("run record", _write_exit_record)
    util.register_after_fork(_EXIT_TOKEN, _arm_worker)  # a worker forked later (or spawned)
    if _on_session not in ON_SESSION:
        ON_SESSION.append(_on_session)
    _arm_worker(_EXIT_TOKEN)
    return True


def _on_session(session: Any) -> None:
    """A session was made in a process that writes its record: SIGTERM must now end it
    through its exit hooks (where the record is written)."""
    from resettrace.tracing.exits import install_sigterm_exit, watch_sigterm

    if session.config.enabled:
        from resettrace.launcher import remember_launcher

        install_sigterm_exit()
        watch_sigterm()
        remember_launcher()  # found while Ray / torch.distributed still say it
        keep_record_current(session)


class _Token:
    """An object multiprocessing's after-fork registry can hold weakly."""


_EXIT_TOKEN = _Token()


def _arm_worker(_token: Any) -> None:
    """In a multiprocessing worker (it leaves through ``os._exit``, where atexit never
    runs): its exit stages, the record after the span flush, run from multiprocessing's
    own exit path (:func:`resettrace.tracing.lifecycle.arm_worker_exit`)."""
    from resettrace.tracing import lifecycle
    from resettrace.tracing.api import default_session

    if not lifecycle.arm_worker_exit():
        return
    _EXIT["pid"] = os.getpid()
    session = default_session()
    if session is not None:  # inherited over the fork: it may have recorded already
        _on_session(session)


def _write_exit_record() -> None:
    """Write this process's record (once), if its default session recorded anything."""
    from resettrace.tracing.api import default_session
    from resettrace.tracing.exits import holding_signals

    if _EXIT["written"] == os.getpid():
        return
    lock = _snapshot_lock()
    if lock is not None:
        _SNAP["stop"].set()
        lock.acquire()  # a snapshot being written finishes first: this record replaces it
    _EXIT["written"] = os.getpid()
    if lock is not None:
        lock.release()
    # held from the start: reading the statistics aggregates what is queued, and a
    # SystemExit raised meanwhile would leave the record unwritten
    with holding_signals(redeliver=True):
        template = os.environ.get(ENV_RUN_JSON, "").strip()
        session = default_session()
        if not template:
            return
        if session is None or not session.stats():
            if run_main_process():  # it says which targets it never imported (its workers
                _write_untraced(template)  # may have): the job says what none imported
            return  # nothing recorded here: nothing to say
        if _jobs_path_not_mine(template):
            return  # one path for the job: the first process writes it
        try:
            write_run(template, session)
        except (OSError, ValueError) as e:
            print(f"resettrace: the run record was not written: {e}", file=sys.stderr)


def _write_untraced(template: str) -> None:
    """The record of a run's main process that recorded nothing: who it was and the
    instrument targets it never imported."""
    from resettrace.launcher import identity, process_rank
    from resettrace.tables import write_json

    untraced = untraced_targets()
    if not untraced:
        return
    rank = process_rank(publish=False)
    who = identity(rank)
    rec = RunRecord(command=list(sys.argv), host=socket.gethostname(), pid=os.getpid(),
                    rank=who.rank, identity=who.identity, launcher=who.launcher,
                    world_size=who.world_size, version=__version__,
                    run_id=os.environ.get(ENV_RUN_ID) or None,
                    extra={"untraced": untraced})
    try:
        write_json(Path(expand_path(template, pid=os.getpid(), rank=rank)), rec.to_json())
    except (OSError, ValueError) as e:
        print(f"resettrace: the run record was not written: {e}", file=sys.stderr)


def run_main_process() -> bool:
    """Whether this is the main process of a ``resettrace run`` command (its record is
    written even when it recorded nothing: it lists the targets it never imported)."""
    from resettrace.config import ENV_RUN_SUMMARY

    return ENV_RUN_SUMMARY in os.environ and not _job_worker() and bool(
        os.environ.get(ENV_RUN_JSON, "").strip())


def _jobs_path_not_mine(template: str) -> bool:
    """Whether ``template`` is the job's one path (no ``{pid}`` or ``{rank}``) and this
    process not the job's first (the first process writes it)."""
    return "{pid}" not in template and "{rank}" not in template and _job_worker()


def _job_worker() -> bool:
    """Whether this process was started by another process of the same job."""
    from resettrace.config import ENV_RUN_OWNER

    owner = os.environ.get(ENV_RUN_OWNER, "").strip()
    return bool(owner) and owner != str(os.getpid())
