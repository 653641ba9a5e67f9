"""Env counts that live on a device, read without waiting for it.

A bool mask on a CUDA device counts its True values on the device, and reading that
count on the host waits for the device: a sync inside the call being timed, which
changes the workload measured. So :func:`~resettrace.tracing.recorder.count_of` starts
the count there instead (a count kernel, a non-blocking copy into pinned host memory and
an event, on the mask's stream: launches, no wait) and the record holds a
:class:`DeferredCount`, an int of -2 or below standing for the count to come.

The trace that holds one is *parked* when it closes, and handed on to the sinks (the
aggregation, the spans, the export) once every count in it has arrived:

- at a later trace's close, when the device got there by then (an event query, never a
  wait); a training loop syncs the host with the device every step (it reads its done
  flags), so that is the common case;
- else at the next read of the statistics or flush of the session, which waits for the
  device up to ``wait_s``, off the training thread's trace (a read is where a loop logs).

Traces keep their order: one parked holds back those that close after it. A count that
never arrives (the device past the wait at shutdown, a count not started or failed, more
than :data:`MAX_PARKED` traces waiting) is recorded as no count, and counted
(:data:`COUNTS`, the run record's ``extra["device_counts"]``), never silently 0.

Nothing here runs until a process counts a mask on a device: until then every trace goes
from the recorder to its sinks as before, at no cost.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from resettrace.tracing import lifecycle
from resettrace.tracing.layout import NO_COUNT, R_COUNT, RECORD_FIELDS

__all__ = ["DeferredCount", "COUNTS", "MAX_PARKED", "STARTERS", "defer", "keep", "park",
           "settle", "report", "handle_of", "bind", "exit_wait"]

log = logging.getLogger("resettrace")

F = RECORD_FIELDS
#: traces parked at once (per recorder's sinks); past it the oldest is handed on with the
#: counts that have not arrived as no count (counted)
MAX_PARKED = 1024
#: counts started and not yet in a closed trace that are found by their handle: a count
#: read and never recorded (a user's own ``count_of`` call) is forgotten past them
_YOUNG_KEPT = 4096

#: what became of the counts started on a device in this process: ``deferred`` started,
#: ``arrived`` written into their traces, ``lost`` recorded as no count (never arrived)
COUNTS = {"deferred": 0, "arrived": 0, "lost": 0}

#: what the recorder module gives this one (:func:`bind`): it imports this, not the reverse
_HOST: dict[str, Any] = {}

_LOCK = threading.RLock()
_SERIAL = itertools.count(2)
_ACTIVE = [False]


class _Cell:
    """One count started on a device: ``pending`` until it arrived, then ``value``."""

    __slots__ = ("pending", "value", "__weakref__")

    def __init__(self, pending: Any) -> None:
        self.pending = pending
        self.value: int | None = None

    def ready(self) -> bool:
        """Whether the count arrived (asks the device; never waits)."""
        if self.value is not None:
            return True
        try:
            if not self.pending.ready():
                return False
            self.value = self.pending.value()
        except Exception as e:  # a failed count is no count, said once
            _note_failed(e)
            self.value = NO_COUNT
        self.pending = None  # (its device and host memory go)
        return True


def _note_failed(e: BaseException) -> None:
    _HOST["note_once"]("device-count-failed", "a count on a device failed (%s: %s); recorded "
              "without a count", type(e).__name__, e)


class DeferredCount(int):
    """A count started on a device (a bool mask's True values): an int of -2 or below that
    a record holds until the count arrives. Passed as a count (to a scope, ``lap``,
    ``set_count``) it stands for the same count; :meth:`wait` gives it on the host,
    waiting for the device."""

    _cell: _Cell

    def __new__(cls, handle: int, cell: _Cell) -> DeferredCount:
        self = super().__new__(cls, handle)
        self._cell = cell
        return self

    def done(self) -> bool:
        """Whether the count arrived (never waits)."""
        return self._cell.ready()

    def wait(self, timeout_s: float = 5.0) -> int | None:
        """The count, waiting for the device up to ``timeout_s``; None if it did not come
        (or failed)."""
        deadline = time.monotonic() + timeout_s
        while not self._cell.ready():
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.0002)
        v = self._cell.value
        return None if v is None or v < 0 else v

    def __repr__(self) -> str:
        v = self._cell.value
        return f"DeferredCount({'pending' if v is None else v})"


#: the counts started and alive, by handle (a parked trace holds its cells; the young
#: ring holds the last ones started until their trace closes)
_CELLS: weakref.WeakValueDictionary[int, _Cell] = weakref.WeakValueDictionary()
_YOUNG: deque[_Cell] = deque(maxlen=_YOUNG_KEPT)


class _TorchCount:
    """A CUDA tensor's True values, counted on its device and copied to pinned host
    memory on its current stream; ``ready`` queries the event recorded after the copy."""

    __slots__ = ("host", "event")

    def __init__(self, mask: Any, torch: Any) -> None:
        # the mask's device's current stream runs both (torch's rule for an op's stream)
        n = torch.count_nonzero(mask)  # on the device: queued, not waited for
        self.host = n.to("cpu", non_blocking=True)  # (pinned: the copy is queued too)
        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(mask.device))

    def ready(self) -> bool:
        return bool(self.event.query())

    def value(self) -> int:
        self.event.synchronize()  # (ready() said so: no wait)
        return int(self.host)


def _start_torch(mask: Any) -> Any:
    """A CUDA mask's count started, or None: another device, or a CUDA graph being
    captured (a copy to the host cannot be captured)."""
    torch = sys.modules["torch"]
    if mask.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return None
    return _TorchCount(mask, torch)


#: how a device array library's mask is counted without a wait, by the top-level module of
#: its type: a function of the mask giving an object with ``ready()`` (never waits) and
#: ``value()`` (the count, once ready), or None where it cannot
STARTERS: dict[str, Callable[[Any], Any]] = {"torch": _start_torch}


def defer(mask: Any) -> DeferredCount | None:
    """Start counting a bool mask's True values on its device: the record's handle, or
    None where this library or device cannot (the caller records no count)."""
    start = STARTERS.get(type(mask).__module__.partition(".")[0])
    if start is None:
        return None
    pending = start(mask)  # (a failure raises into count_of, which says it)
    if pending is None:
        return None
    cell = _Cell(pending)
    handle = DeferredCount(-next(_SERIAL), cell)
    with _LOCK:
        _CELLS[int(handle)] = cell
        _YOUNG.append(cell)
        COUNTS["deferred"] += 1
    if not _ACTIVE[0]:
        _activate()
    return handle


def keep(handle: DeferredCount) -> None:
    """A handle recorded again (passed on as a count): found when its trace closes."""
    cell = handle._cell
    with _LOCK:
        _CELLS[int(handle)] = cell
        _YOUNG.append(cell)


# -- parking ---------------------------------------------------------------------------------
_PARKINGS: weakref.WeakSet[_Parking] = weakref.WeakSet()


class _Parking:
    """The sinks of a recorder while counts on a device are in use: a trace with a count
    still on the device waits here, in order, until it arrived."""

    def __init__(self, sinks: Sequence[Any]) -> None:
        self.sinks = tuple(sinks)
        #: ``(trace, recorder, {handle: cell or None})`` in the order they closed
        self.parked: deque[tuple[Any, Any, dict[int, _Cell | None]]] = deque()
        _PARKINGS.add(self)

    def on_trace(self, trace: Any, recorder: Any) -> None:
        data = trace.data
        handles = [c for c in data[R_COUNT::F] if c < NO_COUNT] if len(data) else []
        with _LOCK:
            if not handles and not self.parked:
                self._hand_on(trace, recorder)
                return
            self.parked.append((trace, recorder, {h: _CELLS.get(h) for h in handles}))
            self._release(final=len(self.parked) > MAX_PARKED)

    def _release(self, final: bool = False, all_of_them: bool = False) -> None:
        """Hand on the parked traces whose counts arrived, in order; ``final``: the oldest
        one whatever (``all_of_them``: every one), its missing counts recorded as none."""
        parked = self.parked
        while parked:
            trace, recorder, cells = parked[0]
            arrived = all(c is not None and c.ready() for c in cells.values())
            if not arrived and not final:
                return
            parked.popleft()
            self._hand_on(_with_counts(trace, cells), recorder)
            final = all_of_them

    def _hand_on(self, trace: Any, recorder: Any) -> None:
        for sink in self.sinks:
            try:
                sink.on_trace(trace, recorder)
            except Exception:  # a sink must never break training
                log.exception("resettrace: a trace sink failed")

    def cells(self) -> list[_Cell]:
        return [c for _, _, cells in self.parked for c in cells.values() if c is not None]


def _with_counts(trace: Any, cells: dict[int, _Cell | None]) -> Any:
    """The trace with each handle replaced by the count that arrived, else no count."""
    values = {}
    for h, cell in cells.items():
        v = cell.value if cell is not None and cell.ready() else None
        values[h] = NO_COUNT if v is None else v
        COUNTS["arrived" if v is not None and v >= 0 else "lost"] += 1
    rows = [list(r) for r in trace]
    for r in rows:
        c = r[R_COUNT]
        if c < NO_COUNT:
            r[R_COUNT] = values.get(c, NO_COUNT)
    return _HOST["Trace"](rows)


def park(recorder: Any) -> None:
    """Route ``recorder``'s traces through a parking (once)."""
    sinks = recorder._sinks
    if len(sinks) == 1 and type(sinks[0]) is _Parking:
        return
    recorder._sinks = (_Parking(sinks),)


def _activate() -> None:
    """The first count started on a device: every recorder's traces are parked from now
    (those made later too, see Recorder.__init__)."""
    with _LOCK:
        if _ACTIVE[0]:
            return
        _ACTIVE[0] = True
        for rec in list(_HOST["recorders"]):
            park(rec)
    lifecycle.at_exit("spans", _settle_at_exit)  # (before the run record, workers too)


#: the longest shutdown timeout of this process's sessions (s): half of it at exit for
#: the counts still on the device
_EXIT_WAIT_S = [0.0]


def exit_wait(timeout_s: float) -> None:
    """A session's shutdown timeout (``shutdown_timeout_s``): at exit the traces still
    waiting for counts get half of the longest."""
    _EXIT_WAIT_S[0] = max(_EXIT_WAIT_S[0], timeout_s / 2)


def _settle_at_exit() -> None:
    settle(_EXIT_WAIT_S[0], final=True)


def active() -> bool:
    return _ACTIVE[0]


def settle(wait_s: float = 5.0, final: bool = False) -> None:
    """Hand on every parked trace whose counts arrive within ``wait_s`` (a read of the
    statistics, a flush: off the traced path). ``final`` (shutdown): the rest too, their
    missing counts recorded as none (counted in :data:`COUNTS`)."""
    if not _ACTIVE[0]:
        return
    with _LOCK:
        waiting = [c for p in list(_PARKINGS) for c in p.cells()]
    deadline = time.monotonic() + wait_s
    for cell in waiting:  # (without the lock: the training thread closes traces meanwhile)
        while not cell.ready() and time.monotonic() < deadline:
            time.sleep(0.0002)
    with _LOCK:
        for p in list(_PARKINGS):
            p._release(final=final, all_of_them=final)
    if final and COUNTS["lost"]:
        _HOST["note_once"]("device-count-lost", "%d env counts on a device never arrived; their "
                  "records have no count", COUNTS["lost"])


def report() -> dict[str, int] | None:
    """:data:`COUNTS` for the run record, or None when no count was started on a device."""
    return dict(COUNTS) if COUNTS["deferred"] else None


def bind(note_once: Callable[..., None], trace: Callable[[list[list[int]]], Any],
         recorders: Any) -> None:
    """The recorder's parts this module uses: its ``note_once``, its ``Trace`` type (a
    trace made from records) and the recorders alive (a collection)."""
    _HOST.update(note_once=note_once, Trace=trace, recorders=recorders)


def handle_of(c: int) -> int:
    """A record's count as a count to pass on: a handle as its :class:`DeferredCount`
    (no count where it is gone), any other as it is."""
    if c >= NO_COUNT:
        return c
    cell = _CELLS.get(c)
    return NO_COUNT if cell is None else DeferredCount(c, cell)


def after_fork_in_child() -> None:
    """The parked traces and counts are the parent's (it hands them on); the child's own
    counts start afresh (CUDA does not survive a fork)."""
    global _LOCK
    _LOCK = threading.RLock()  # (another thread of the parent may have held it)
    for p in list(_PARKINGS):
        p.parked.clear()
    _YOUNG.clear()
    _CELLS.clear()
    for k in COUNTS:
        COUNTS[k] = 0
