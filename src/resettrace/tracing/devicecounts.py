"""Env counts that live on a device, read without waiting for it.

A bool mask on a CUDA device counts its True values on the device, and reading that
count on the host waits for the device: a sync inside the call being timed, which
changes the workload measured. So :func:`~resettrace.tracing.recorder.count_of` starts
the count there instead (a count kernel and a non-blocking copy into pinned host memory
that holds -1 until the copy lands, on the mask's stream: launches, no wait) and the
record holds a :class:`DeferredCount`, an int of -2 or below standing for the count to
come. Whether it came is a read of that host memory: no CUDA call after the launches
(an event query would break a CUDA graph being captured meanwhile).

The trace that holds one is *parked* when it closes, and handed on to the sinks (the
aggregation, the spans, the export) once every count in it has arrived:

- at a later trace's close or a read of the statistics, whichever finds the device got
  there (never a wait); a training loop syncs the host with the device every step (it
  reads its done flags), so by the next step it has;
- a flush waits for the device (:data:`READ_WAIT_S` at most), the session's shutdown and
  the process's exit too (half the shutdown timeout), off the traced path.

Traces keep their order per recorder: one parked holds back those that close after it.
The sinks are called outside any lock of this module, by one thread at a time per
recorder's sinks. A count that never arrives (the device still busy at shutdown, a count
that failed or was dropped before its trace closed, more than :data:`MAX_PARKED` traces
waiting on one recorder's sinks) is recorded as no count, and counted (:data:`COUNTS`,
the run record's ``extra["device_counts"]``), never silently 0.

Nothing here runs until a process counts a mask on a device: until then every trace goes
from the recorder to its sinks as before, at no cost. From then on, every trace of the
process goes through :class:`_Parking`'s Python hand-over instead of the compiled one.
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

__all__ = ["DeferredCount", "COUNTS", "MAX_PARKED", "READ_WAIT_S", "STARTERS", "defer",
           "keep", "park", "settle", "report", "handle_of", "bind", "exit_wait", "waiting"]

log = logging.getLogger("resettrace")

F = RECORD_FIELDS
#: traces parked at once on one recorder's sinks; past it the oldest is handed on with
#: the counts that have not arrived as no count (counted)
MAX_PARKED = 1024
#: how long a flush (and a change of attributes) waits for the counts of parked traces
READ_WAIT_S = 5.0

#: the counts on a device in the traces handed on in this process: ``deferred`` recorded
#: (``arrived`` + ``lost`` once none waits), ``arrived`` written into their records,
#: ``lost`` recorded as no count
COUNTS = {"deferred": 0, "arrived": 0, "lost": 0}

_SERIAL = itertools.count(2)
_ACTIVE = [False]
#: what the recorder module gives this one (:func:`bind`): it imports this, not the reverse
_HOST: dict[str, Any] = {}
_COUNTS_LOCK = threading.RLock()  # (a signal handler may record inside it)


class _Cell:
    """One count started on a device: ``pending`` until it arrived, then ``value`` (-1:
    it failed)."""

    __slots__ = ("pending", "value", "__weakref__")

    def __init__(self, pending: Any) -> None:
        self.pending = pending
        self.value: int | None = None

    def ready(self) -> bool:
        """Whether the count arrived (never waits; any thread)."""
        if self.value is not None:
            return True
        p = self.pending
        if p is None:  # (another thread took it meanwhile)
            return self.value is not None
        try:
            v = p.value()
        except Exception as e:  # a failed count is no count, said once
            _HOST["note_once"]("device-count-failed", "a count on a device failed (%s: "
                               "%s); recorded without a count", type(e).__name__, e)
            v = NO_COUNT
        if v is None:
            return False
        if self.value is None:
            self.value = v
        self.pending = None  # (its host memory goes)
        return True


def _wait(cells: Sequence[_Cell], deadline: float) -> None:
    """Until every cell's count arrived or ``deadline`` (monotonic s), polling with a
    growing pause (the GIL is left to the training thread)."""
    pause = 1e-4
    for cell in cells:
        while not cell.ready():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(pause, left))
            pause = min(pause * 2, 5e-3)


class DeferredCount(int):
    """A count started on a device (a bool mask's True values): an int of -2 or below that
    a record holds until the count arrives. Passed as a count (to a scope, ``lap``,
    ``set_count``) it stands for the same count; :meth:`wait` gives it on the host,
    waiting for the device. Copied, it is itself; pickled, its count if it arrived, else
    no count (-1): a handle means nothing in another process."""

    _cell: _Cell

    def __new__(cls, handle: int, cell: _Cell) -> DeferredCount:
        self = super().__new__(cls, handle)
        self._cell = cell
        return self

    def done(self) -> bool:
        """Whether the count arrived (never waits)."""
        return self._cell.ready()

    def wait(self, timeout_s: float = READ_WAIT_S) -> int | None:
        """The count, waiting for the device up to ``timeout_s``; None if it did not come
        (or failed)."""
        _wait([self._cell], time.monotonic() + timeout_s)
        v = self._cell.value if self._cell.ready() else None
        return None if v is None or v < 0 else v

    def __copy__(self) -> DeferredCount:
        return self

    def __deepcopy__(self, memo: Any) -> DeferredCount:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        v = self._cell.value if self._cell.ready() else None
        return int, (NO_COUNT if v is None else v,)

    def __repr__(self) -> str:
        v = self._cell.value
        return f"DeferredCount({'pending' if v is None else v})"


#: the counts started and alive, by handle (a :class:`DeferredCount` someone holds, or a
#: parked trace, keeps its cell)
_CELLS: weakref.WeakValueDictionary[int, _Cell] = weakref.WeakValueDictionary()


#: the cells started or passed on last (:data:`_HELD_MAX` at most, any thread), so that
#: each lives until the trace that records it closed (and holds it while parked)
_HELD: deque[_Cell] = deque()
#: the cells held at most: a trace holding more counts on a device than this loses the
#: oldest (counted)
_HELD_MAX = 4096


class _TorchCount:
    """A CUDA tensor's True values, counted on its device and copied into pinned host
    memory that holds -1 until the copy lands, both queued on the device's current
    stream (torch's rule for an op's stream). Whether it landed is a read of host memory:
    no CUDA call (an event query is illegal while a CUDA graph is being captured, on any
    thread)."""

    __slots__ = ("host",)

    def __init__(self, mask: Any, torch: Any) -> None:
        n = torch.count_nonzero(mask)  # on the device: queued, not waited for
        host = torch.full((), -1, dtype=torch.int64, pin_memory=True)
        host.copy_(n, non_blocking=True)  # queued after the count
        self.host = host

    def value(self) -> int | None:
        v = int(self.host)  # (host memory: the copy's 8 bytes land at once)
        return None if v < 0 else v


def _start_torch(mask: Any) -> Any:
    """A CUDA mask's count started, or None: another device, or a CUDA graph being
    captured on the mask's device (a copy to the host cannot be captured)."""
    dev = mask.device
    if dev.type != "cuda":
        return None
    torch = sys.modules["torch"]
    if dev.index is None or dev.index == torch.cuda.current_device():
        capturing = torch.cuda.is_current_stream_capturing()
    else:
        with torch.cuda.device(dev):
            capturing = torch.cuda.is_current_stream_capturing()
    return None if capturing else _TorchCount(mask, torch)


#: how a device array library's mask is counted without a wait, by the top-level module of
#: its type: a function of the mask giving an object whose ``value()`` is the count once
#: it arrived and None before (never waits), or None where it cannot
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
    _CELLS[int(handle)] = cell
    _hold(cell)
    if not _ACTIVE[0]:
        _activate()
    return handle


def keep(handle: DeferredCount) -> None:
    """A handle recorded again (passed on as a count): found when its trace closes."""
    cell = handle._cell
    _CELLS[int(handle)] = cell
    if not _HELD or _HELD[-1] is not cell:  # (a scope re-entered in a loop: once)
        _hold(cell)


def _hold(cell: _Cell) -> None:
    _HELD.append(cell)  # (one call: atomic across threads)
    while len(_HELD) > _HELD_MAX:  # the oldest: recorded in traces closed since, mostly
        try:
            _HELD.popleft()
        except IndexError:  # (another thread took it)
            break


def handle_of(c: int) -> int:
    """A record's count as a count to pass on: a handle as its :class:`DeferredCount`
    (no count where it is gone), any other as it is."""
    if c >= NO_COUNT:
        return c
    cell = _CELLS.get(c)
    return NO_COUNT if cell is None else DeferredCount(c, cell)


# -- parking ---------------------------------------------------------------------------------
#: the parkings that hold traces (strong: a parked trace outlives its recorder)
_BUSY: set[_Parking] = set()
#: every parking (a fork gives each a fresh lock)
_PARKINGS: weakref.WeakSet[_Parking] = weakref.WeakSet()


class _Parking:
    """The sinks of a recorder while counts on a device are in use: a trace with a count
    still on the device waits here, in order, until it arrived. One thread at a time
    hands traces on (:attr:`releasing`), outside the lock: a sink that takes a lock of
    its own never waits for this one's holder, and a trace closed meanwhile (on any
    thread, or by a signal handler) is queued behind."""

    def __init__(self, sinks: Sequence[Any]) -> None:
        self.sinks = tuple(sinks)
        #: ``(trace, recorder, {handle: cell or None})`` in the order they closed
        self.parked: deque[tuple[Any, Any, dict[int, _Cell | None]]] = deque()
        self._fresh_lock()
        _PARKINGS.add(self)

    def _fresh_lock(self) -> None:
        self.lock = threading.RLock()  # (a signal handler's trace may close inside it)
        #: notified when the parking empties (a final pump waits on it)
        self.emptied = threading.Condition(self.lock)
        #: the thread handing traces on, or None
        self.releasing: int | None = None
        #: a final pump asked for while another thread hands on: that one goes on to the
        #: end, counts that did not land as none
        self.final_wanted = False

    @lifecycle.uncut
    def on_trace(self, trace: Any, recorder: Any) -> None:
        cells: dict[int, _Cell | None] = {}
        counts = trace.data[R_COUNT::F]
        if len(counts) and min(counts) < NO_COUNT:  # (one pass in C)
            handles = [c for c in counts if c < NO_COUNT]
            cells = {h: _CELLS.get(h) for h in set(handles)}
            with _COUNTS_LOCK:
                COUNTS["deferred"] += len(handles)
        with self.lock:
            if not cells and not self.parked and self.releasing is None:
                direct = True
            else:
                direct = False
                self.parked.append((trace, recorder, cells))
                if len(self.parked) == 1:
                    _BUSY.add(self)  # (one call: atomic; no other lock inside this one)
        if direct:
            self._hand_on(trace, recorder)
        else:
            self.pump()

    @lifecycle.uncut
    def pump(self, final: bool = False, wait_s: float = READ_WAIT_S) -> None:
        """Hand on the parked traces whose counts arrived, in order, and the oldest past
        :data:`MAX_PARKED` whatever (``final``: every one, counts that did not land as
        none). A call while another thread hands on returns at once (that one takes what
        is parked meanwhile); a final one asks it to go on to the end and waits for it,
        up to ``wait_s``."""
        me = threading.get_ident()
        deadline = time.monotonic() + wait_s
        while True:
            with self.lock:
                if self.releasing is not None:
                    if final:
                        # the one handing on goes on to the end; from another thread,
                        # wait for it (the same thread: a signal handler inside it, which
                        # returns with the traces still parked)
                        self.final_wanted = True
                        if self.releasing != me:
                            while self.parked and self.releasing is not None:
                                left = deadline - time.monotonic()
                                if left <= 0:
                                    break
                                self.emptied.wait(left)
                            if self.releasing is None and self.parked:
                                continue  # (it stopped: this call goes on from here)
                            if self.parked:  # given up: a later hand-on is not final
                                self.final_wanted = False
                    return
                self.releasing = me
            try:
                while True:
                    with self.lock:
                        parked = self.parked
                        if not parked:
                            break
                        trace, recorder, cells = parked[0]
                        if not self._due(final):
                            break
                        parked.popleft()
                    self._hand_on(_with_counts(trace, cells) if cells else trace, recorder)
            finally:
                with self.lock:
                    self.releasing = None
                    again = bool(self.parked) and self._due(final)
                    if not self.parked:
                        self.final_wanted = False
                        _BUSY.discard(self)
                    self.emptied.notify_all()  # (a final pump waits: done, or stopped)
            if not again:  # (a trace parked while this one handed on, due now)
                return

    def _due(self, final: bool) -> bool:
        """Whether the first parked trace goes on now (caller holds the lock)."""
        parked = self.parked
        return (final or self.final_wanted or len(parked) > MAX_PARKED
                or all(c is None or c.ready() for c in parked[0][2].values()))

    def _hand_on(self, trace: Any, recorder: Any) -> None:
        for sink in self.sinks:
            try:
                sink.on_trace(trace, recorder)
            except Exception:  # a sink must never break training
                log.exception("resettrace: a trace sink failed")

    def cells(self) -> list[_Cell]:
        with self.lock:
            return [c for _, _, cells in self.parked for c in cells.values()
                    if c is not None]

    def attributes_changing(self, attributes: Any) -> None:
        """A recorder's attributes are about to change: its parked traces are handed on
        first, with the attributes they closed with (their counts waited for, up to
        :data:`READ_WAIT_S`: a change of attributes is rare, and asked for; one whose count
        takes longer keeps waiting, and goes on with the new attributes)."""
        if any(rec.attributes is attributes for _, rec, _ in list(self.parked)):
            _wait(self.cells(), time.monotonic() + READ_WAIT_S)
            self.pump()


def _with_counts(trace: Any, cells: dict[int, _Cell | None]) -> Any:
    """The trace with each handle replaced by the count that arrived, else no count."""
    values: dict[int, int] = {}
    for h, cell in cells.items():
        v = cell.value if cell is not None and cell.ready() else None
        values[h] = NO_COUNT if v is None or v < 0 else v
    rows = [list(r) for r in trace]
    arrived = lost = 0
    for r in rows:
        c = r[R_COUNT]
        if c < NO_COUNT:
            r[R_COUNT] = v = values.get(c, NO_COUNT)
            if v >= 0:
                arrived += 1
            else:
                lost += 1
    with _COUNTS_LOCK:
        COUNTS["arrived"] += arrived
        COUNTS["lost"] += lost
    return _HOST["Trace"](rows)


def park(recorder: Any) -> None:
    """Route ``recorder``'s traces through a parking (once)."""
    sinks = recorder._sinks
    if len(sinks) == 1 and type(sinks[0]) is _Parking:
        return
    parking = _Parking(sinks)
    _HOST["watch_attributes"](parking)
    recorder._sinks = (parking,)


def bind(note_once: Callable[..., None], trace: Callable[[list[list[int]]], Any],
         recorders: Any, watch_attributes: Callable[[Any], None]) -> None:
    """The recorder's parts this module uses: its ``note_once``, its ``Trace`` type (a
    trace made from records), the recorders alive (a collection) and its
    ``watch_attributes``."""
    _HOST.update(note_once=note_once, Trace=trace, recorders=recorders,
                 watch_attributes=watch_attributes)


def _activate() -> None:
    """The first count started on a device: every recorder's traces are parked from now
    (those made later too, see Recorder.__init__)."""
    with _COUNTS_LOCK:
        if _ACTIVE[0]:
            return
        _ACTIVE[0] = True
    for rec in list(_HOST["recorders"]):
        park(rec)
    lifecycle.at_exit("spans", _settle_at_exit)  # (before the run record, workers too)


def active() -> bool:
    return _ACTIVE[0]


def settle(wait_s: float = READ_WAIT_S, final: bool = False, sink: Any = None) -> None:
    """Hand on every parked trace whose counts arrive within ``wait_s`` (a read of the
    statistics, a flush: off the traced path). ``final`` (shutdown): the rest too, their
    missing counts recorded as none (counted in :data:`COUNTS`); ``sink``: only the
    traces going to it (a session's, at its shutdown)."""
    if not _ACTIVE[0]:
        return
    busy = [p for p in list(_BUSY) if sink is None or sink in p.sinks]
    # the counts get the time (half of it when final: the rest for a hand-on under way)
    _wait([c for p in busy for c in p.cells()],
          time.monotonic() + (wait_s / 2 if final else wait_s))
    deadline = time.monotonic() + (wait_s / 2 if final else 0.0)
    for p in busy:
        p.pump(final=final, wait_s=max(0.0, deadline - time.monotonic()))
    if final and COUNTS["lost"]:
        _HOST["note_once"]("device-count-lost", "%d env counts on a device never arrived; "
                           "their records have no count", COUNTS["lost"])


#: the longest shutdown timeout of this process's sessions (s): half of it at exit for
#: the counts still on the device
_EXIT_WAIT_S = [0.0]


def exit_wait(timeout_s: float) -> None:
    """A session's shutdown timeout (``shutdown_timeout_s``): at exit the traces still
    waiting for counts get half of the longest."""
    _EXIT_WAIT_S[0] = max(_EXIT_WAIT_S[0], timeout_s / 2)


def _settle_at_exit() -> None:
    settle(_EXIT_WAIT_S[0], final=True)


def waiting(sink: Any) -> int:
    """The traces parked on their way to ``sink``."""
    return sum(len(p.parked) for p in list(_BUSY) if sink in p.sinks)


def report() -> dict[str, int] | None:
    """:data:`COUNTS` for the run record, with ``pending`` (in traces still parked: a
    record written while the run goes on), or None when no count on a device was
    recorded."""
    if not COUNTS["deferred"]:
        return None
    with _COUNTS_LOCK:
        out = dict(COUNTS)
    out["pending"] = out["deferred"] - out["arrived"] - out["lost"]
    return out


def after_fork_in_child() -> None:
    """The parked traces and counts are the parent's (it hands them on); the child's own
    counts start afresh (CUDA does not survive a fork)."""
    global _COUNTS_LOCK
    _COUNTS_LOCK = threading.RLock()
    for p in list(_PARKINGS):
        p.parked.clear()
        p._fresh_lock()
    _BUSY.clear()
    _HELD.clear()
    _CELLS.clear()
    for k in COUNTS:
        COUNTS[k] = 0
