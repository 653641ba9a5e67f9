"""What tracing does when the process forks and when it exits: one hook each, every part
in a stated order.

A forked child inherits its parent's objects but none of its threads, and must not write
to its parent's pipes or count its parent's calls. Every part with state of that kind
(the aggregation engine, the span materialiser, the span export sink, the metrics
export) calls :func:`track` when it is made; the one ``os.register_at_fork`` hook here
then calls each live part's ``_after_fork_in_child()`` in the forked child, in the order
they were made (a session makes its aggregation engine, then its span export, then its
metrics), after the process-wide steps given to :func:`at_fork` (the SIGTERM watcher's
wake-up fd, first). Before the fork, the same hook takes the locks given to
:func:`hold_across_fork` (work on another thread that a fork must not cut in two), and
lets them go after it in the parent.

At exit, one ``atexit`` hook (and, in a ``multiprocessing`` worker, which leaves through
``os._exit`` where ``atexit`` never runs, one ``multiprocessing`` finalizer armed by
:func:`arm_worker_exit`) runs the steps given to :func:`at_exit`, once per process, stage
by stage in the order of :data:`EXIT_STAGES`: the instrumentation's word about targets
never imported, then every span-exporting session's flush (bounded), then the run record
(written from statistics that include what was just flushed), then the default session's
shutdown. A worker runs the stages marked for workers only.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = ["ForkAware", "track", "at_fork", "hold_across_fork", "EXIT_STAGES", "at_exit",
           "arm_worker_exit", "uncut", "inside_uncut"]

log = logging.getLogger("resettrace")


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None: ...


_F = TypeVar("_F", bound=Callable[..., Any])
_lock = threading.Lock()
_parts: list[weakref.ref[Any]] = []
_steps: list[Callable[[], None]] = []


def track(part: ForkAware) -> None:
    """Call ``part._after_fork_in_child()`` in every forked child while ``part`` lives."""
    with _lock:
        if len(_parts) > 64 and len(_parts) % 64 == 0:  # forget the dead now and then
            _parts[:] = [ref for ref in _parts if ref() is not None]
        _parts.append(weakref.ref(part))


#: the code of the calls a SIGTERM must not cut in two (see :func:`uncut`)
_uncut: set[Any] = set()


def uncut(func: _F) -> _F:
    """Mark ``func`` as a call a SIGTERM must not cut in two: resettrace's SIGTERM handler,
    finding it under way on the main thread, lets it finish and takes the signal again a
    moment later. For the code that changes a queue and its counts a statement at a time
    (an exception raised between two of them would leave a trace counted and not queued,
    or written to the pipe and queued again). The function itself is returned unchanged."""
    _uncut.add(func.__code__)
    return func


def inside_uncut(frame: Any) -> bool:
    """Whether ``frame`` (the one a signal interrupted) runs inside an :func:`uncut` call."""
    while frame is not None:
        if frame.f_code in _uncut:
            return True
        frame = frame.f_back
    return False


def at_fork(step: Callable[[], None]) -> None:
    """A process-wide step run in every forked child, before the parts."""
    _steps.append(step)


#: seconds a fork waits for each lock given to :func:`hold_across_fork` (work that stalls,
#: a disk that hangs, does not stop the fork for longer)
HOLD_ACROSS_FORK_S = 5.0
_held: list[Callable[[], Any]] = []
_holding: list[Any] = []


def hold_across_fork(lock_of: Callable[[], Any]) -> None:
    """A lock no fork may cut into: ``lock_of()`` (the lock now, or None) is taken before
    the process forks (waiting at most :data:`HOLD_ACROSS_FORK_S`) and let go after it in
    the parent; the child's copy stays taken (its owner makes itself a new one)."""
    _held.append(lock_of)


def _before_fork() -> None:
    for lock_of in list(_held):
        lock = lock_of()
        if lock is not None and lock.acquire(timeout=HOLD_ACROSS_FORK_S):
            _holding.append(lock)


def _after_fork_in_parent() -> None:
    while _holding:
        _holding.pop().release()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _holding.clear()
    for step in list(_steps):
        step()
    alive = []
    for ref in _parts:
        part = ref()
        if part is not None:
            part._after_fork_in_child()
            alive.append(ref)
    _parts[:] = alive


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


#: the exit stages in the order they run, and whether a ``multiprocessing`` worker runs
#: them when it leaves (its main process speaks for the instrumentation, and owns the
#: default session's last word)
EXIT_STAGES: dict[str, bool] = {
    "instrumentation": False,  # targets never imported, so never traced: said once
    "spans": True,  # every span-exporting session flushed and stopped, bounded
    "run record": True,  # the run record, after the flush
    "default session": False,  # the default session shut down
}
_exit_steps: dict[str, list[Callable[[], None]]] = {stage: [] for stage in EXIT_STAGES}
_exited_pid: int | None = None
_worker_armed_pid: int | None = None


def at_exit(stage: str, step: Callable[[], None]) -> None:
    """Run ``step`` when this process exits, in ``stage`` (one of :data:`EXIT_STAGES`);
    a step given twice runs once. A step that raises is logged; the next ones still run."""
    if stage not in EXIT_STAGES:
        raise ValueError(f"unknown exit stage {stage!r}; the stages are "
                         f"{', '.join(EXIT_STAGES)}")
    with _lock:
        if step not in _exit_steps[stage]:
            _exit_steps[stage].append(step)


def run_exit(worker: bool = False) -> None:
    """The exit stages, once per process (``worker``: the stages a worker runs)."""
    global _exited_pid
    pid = os.getpid()
    with _lock:
        if _exited_pid == pid:
            return
        _exited_pid = pid
        steps = [(stage, list(_exit_steps[stage])) for stage, in_workers in EXIT_STAGES.items()
                 if in_workers or not worker]
    for stage, stage_steps in steps:
        for step in stage_steps:
            try:
                step()
            except Exception:  # exiting: report, never raise
                log.exception("resettrace: the %s step at exit failed", stage)


def arm_worker_exit() -> bool:
    """In a ``multiprocessing`` worker: run the workers' exit stages from multiprocessing's
    own exit path (once per process; call it again in a forked worker, whose finalizers
    multiprocessing cleared). False, and nothing armed, outside a worker."""
    global _worker_armed_pid
    import multiprocessing

    if multiprocessing.parent_process() is None:
        return False
    pid = os.getpid()
    with _lock:
        if _worker_armed_pid == pid:
            return True
        _worker_armed_pid = pid
    from multiprocessing import util

    util.Finalize(None, run_exit, args=(True,), exitpriority=100)
    return True


atexit.register(run_exit)
