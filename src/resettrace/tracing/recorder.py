"""The hot-path recorder: nested phase scopes that only read the clock.

``with recorder.scope(PHASE):`` costs two ``perf_counter_ns`` reads and a list
append; no OpenTelemetry call is made on the training thread. When the outermost
scope closes, the finished tree of records (a *trace*) is handed to the sinks:
the :class:`~resettrace.tracing.processor.TimingSpanProcessor` aggregates it, and
in ``trace`` mode the :class:`~resettrace.tracing.materialise.SpanMaterializer`
turns it into real OpenTelemetry spans on its own thread.

With tracing off every component holds :data:`NOOP_RECORDER`, whose ``scope()``
returns one shared do-nothing scope and whose ``timing()`` is ``None``.

A record is a list of six ints ``[phase_index, parent_position, start_ns, end_ns,
count, error]``: ``parent_position`` is the parent's position in the trace or -1,
``count`` the envs reset (-1: not given), ``error`` 0 or the code of the exception
type that left the scope (:func:`error_name`). All ints, so a trace packs into one
``array('q')`` without a Python loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from resettrace.catalog import PHASES, Phase, children_of

__all__ = [
    "Recorder", "NoopRecorder", "NOOP_RECORDER", "Record", "TraceSink", "closed_timing",
    "use_clock",
]

Record = list  # [phase_index, parent_position, start_ns, end_ns, count, error]
R_PHASE, R_PARENT, R_START, R_END, R_COUNT, R_ERROR = range(6)
RECORD_FIELDS = 6
NO_COUNT = -1

#: exception type names by error code (code 0: no error); append-only
_ERROR_NAMES: list[str] = [""]
_ERROR_CODES: dict[str, int] = {}


def error_code(name: str) -> int:
    """The code of an exception type name (assigned on first use)."""
    code = _ERROR_CODES.get(name)
    if code is None:
        code = _ERROR_CODES[name] = len(_ERROR_NAMES)
        _ERROR_NAMES.append(name)
    return code


def error_name(code: int) -> str:
    return _ERROR_NAMES[code] if 0 < code < len(_ERROR_NAMES) else f"error {code}"

_perf_ns = time.perf_counter_ns


class TraceSink(Protocol):
    """Receives each finished trace. Called on the thread that closed the root scope."""

    def on_trace(self, records: Sequence[Record], recorder: Recorder) -> None: ...


class _NoopScope:
    __slots__ = ()

    def __enter__(self) -> _NoopScope:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def timing(self) -> None:
        return None


_NOOP_SCOPE = _NoopScope()


class NoopRecorder:
    """The recorder of tracing ``off``: one shared scope, nothing recorded."""

    enabled = False
    attributes: Mapping[str, Any] = {}

    def scope(self, phase: Phase, count: int = NO_COUNT) -> _NoopScope:
        return _NOOP_SCOPE


NOOP_RECORDER = NoopRecorder()


class _Scope:
    """One phase's reusable scope; a phase never nests inside itself.

    It holds direct references to its recorder's lists: every attribute lookup
    saved here is saved ~20 times per reset.
    """

    __slots__ = ("_rec", "_index", "_count", "_record", "_pos", "_stack", "_records")

    def __init__(self, rec: Recorder, index: int) -> None:
        self._rec = rec
        self._index = index
        self._count = NO_COUNT
        self._record: Record = []
        self._pos = -1
        self._stack = rec._stack
        self._records = rec._records

    def __enter__(self) -> _Scope:
        stack = self._stack
        records = self._records
        self._pos = pos = len(records)
        self._record = r = [self._index, stack[-1] if stack else -1, 0, 0, self._count, 0]
        stack.append(pos)
        records.append(r)
        r[2] = _perf_ns()  # R_START, last: bookkeeping is not timed
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._record[3] = _perf_ns()  # R_END
        if exc_type is not None:
            self._record[R_ERROR] = error_code(exc_type.__name__)
        stack = self._stack
        stack.pop()
        if not stack:
            self._rec._flush()

    def timing(self) -> dict[str, float]:
        """Closed timing dict of this scope's last run: its children's keys and the gap."""
        rec = self._rec
        trace = rec._records if rec._stack else rec._last
        return closed_timing(trace, self._pos, PHASES[self._index])


_CHILD_LAYOUT: dict[int, tuple[list[str | None], dict[str, float]]] = {}


def _child_layout(phase: Phase) -> tuple[list[str | None], dict[str, float]]:
    """Child key by phase index, and the zero dict of the phase's closed account."""
    layout = _CHILD_LAYOUT.get(phase.index)
    if layout is None:
        kids = children_of(phase)
        key_of: list[str | None] = [None] * len(PHASES)
        for p in kids:
            key_of[p.index] = p.key
        keys = [p.key for p in kids] + ([phase.gap_key] if phase.gap_key else [])
        layout = _CHILD_LAYOUT[phase.index] = (key_of, dict.fromkeys(keys, 0.0))
    return layout


def closed_timing(records: Sequence[Record], pos: int, phase: Phase) -> dict[str, float]:
    """Every child key of the record at ``pos`` (0.0 when not run), then its gap key.

    The gap is the record's duration minus the sum of its children, so the
    values add up to the record's duration exactly.
    """
    key_of, zeros = _child_layout(phase)
    out = zeros.copy()
    record = records[pos]
    total_ns = 0
    for j in range(pos + 1, len(records)):
        r = records[j]
        if r[1] == pos:  # R_PARENT: a direct child
            d = r[3] - r[2]
            total_ns += d
            out[key_of[r[0]]] += d * 1e-6
    if phase.gap_key:
        out[phase.gap_key] = (record[3] - record[2] - total_ns) * 1e-6
    return out


class Recorder:
    """Records nested phase scopes for one env (and its backend).

    ``attributes`` are attached to every exported span of this recorder (backend
    and task names, env count). Not thread-safe: one recorder per training thread.
    """

    enabled = True

    def __init__(self, sinks: Sequence[TraceSink] = (), *,
                 attributes: Mapping[str, Any] | None = None) -> None:
        self._sinks = tuple(sinks)
        self.attributes: dict[str, Any] = dict(attributes or {})
        self._records: list[Record] = []
        self._last: list[Record] = []
        self._stack: list[int] = []
        self._scopes = [_Scope(self, p.index) for p in PHASES]
        #: wall-clock ns minus perf_counter ns, to place records in real time
        self.epoch_offset_ns = time.time_ns() - time.perf_counter_ns()

    def scope(self, phase: Phase, count: int = NO_COUNT) -> _Scope:
        """The scope of ``phase``; ``count`` is the envs it resets (an attribute)."""
        s = self._scopes[phase.index]
        s._count = count
        return s

    def _flush(self) -> None:
        # the scopes hold self._records: hand the sinks a copy and reuse the list
        self._last = records = self._records[:]
        self._records.clear()
        for sink in self._sinks:
            sink.on_trace(records, self)



def use_clock(clock_ns: Callable[[], int] | None) -> None:
    """Replace the recorder clock (tests); ``None`` restores ``perf_counter_ns``."""
    global _perf_ns
    _perf_ns = time.perf_counter_ns if clock_ns is None else clock_ns
