"""What tracing does when the process forks: one hook, every part in a stated order.

A forked child inherits its parent's objects but none of its threads, and must not write
to its parent's pipes or count its parent's calls. Every part with state of that kind
(the aggregation engine, the span materialiser, the span export sink, the metrics
export) calls :func:`track` when it is made; the one ``os.register_at_fork`` hook here
then calls each live part's ``_after_fork_in_child()`` in the forked child, in the order
they were made (a session makes its aggregation engine, then its span export, then its
metrics), after the process-wide steps given to :func:`at_fork` (the SIGTERM watcher's
wake-up fd, first).

Exit is the session's: :func:`resettrace.tracing.session.shutdown_all` flushes every
span-exporting session at interpreter exit and when a ``multiprocessing`` worker leaves.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["ForkAware", "track", "at_fork"]


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None: ...


_lock = threading.Lock()
_parts: list[weakref.ref[Any]] = []
_steps: list[Callable[[], None]] = []


def track(part: ForkAware) -> None:
    """Call ``part._after_fork_in_child()`` in every forked child while ``part`` lives."""
    with _lock:
        if len(_parts) > 64 and len(_parts) % 64 == 0:  # forget the dead now and then
            _parts[:] = [ref for ref in _parts if ref() is not None]
        _parts.append(weakref.ref(part))


def at_fork(step: Callable[[], None]) -> None:
    """A process-wide step run in every forked child, before the parts."""
    _steps.append(step)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    for step in list(_steps):
        step()
    alive = []
    for ref in _parts:
        part = ref()
        if part is not None:
            part._after_fork_in_child()
            alive.append(ref)
    _parts[:] = alive


os.register_at_fork(after_in_child=_after_fork_in_child)
