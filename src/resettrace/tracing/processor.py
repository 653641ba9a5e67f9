"""Aggregate phase durations into run statistics per timing key.

:class:`TimingSpanProcessor` is an OpenTelemetry ``SpanProcessor``: attach it to any
``TracerProvider`` and it aggregates every ended span whose name is in the catalog,
including spans that user code creates itself. It is also the recorder's sink
(:meth:`on_trace`), so resettrace's own phases are aggregated straight from the
hot-path records, without building SDK spans.

The spans that resettrace materialises from those same records carry the
instrumentation scope :data:`~resettrace.catalog.INSTRUMENTATION_SCOPE`; ``on_end``
skips them so nothing is counted twice.

Contract (as for every SDK processor): ``on_end`` runs on the thread that ended
the span; it never blocks on I/O and never raises.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from resettrace.catalog import (
    ALL_KEYS,
    ATTR_RESET_COUNT,
    BY_KEY,
    BY_SPAN,
    GAP_PARENT,
    INSTRUMENTATION_SCOPE,
    PHASES,
    RESET_DONE,
    RESET_DONE_COUNT,
    SET_STATE,
)
from resettrace.tracing.recorder import (
    R_COUNT,
    R_END,
    R_PARENT,
    R_PHASE,
    R_START,
    Record,
    closed_timing,
)

if TYPE_CHECKING:
    from resettrace.tracing.recorder import Recorder

log = logging.getLogger(__name__)

__all__ = ["KeyStats", "TimingSpanProcessor", "percentile", "parent_key"]

_MAX_OPEN_PARENTS = 10_000
_SET_STATE_SPAN = SET_STATE.span
#: queued traces that wake the aggregation thread
_DRAIN_BATCH = 32
#: traces aggregated between two GIL hand-backs of the aggregation thread
_DRAIN_CHUNK = 8

_LIVE: weakref.WeakSet[TimingSpanProcessor] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for processor in list(_LIVE):
        processor._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of already sorted values."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def parent_key(key: str) -> str | None:
    """The timing key a key's share is measured against (gaps: their own phase)."""
    if key in GAP_PARENT:
        return GAP_PARENT[key].key
    phase = BY_KEY.get(key)
    if phase is None or phase.parent is None:
        return None
    return BY_SPAN[phase.parent].key


@dataclass(frozen=True)
class KeyStats:
    """Statistics of one timing key over a run (milliseconds, or envs for counts)."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    total_ms: float
    share_of_parent: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Series:
    """Exact count/total/max plus a bounded reservoir of samples for percentiles."""

    __slots__ = ("count", "total", "max", "samples", "_cap", "_rng")

    def __init__(self, cap: int, rng: random.Random) -> None:
        self.count = 0
        self.total = 0.0
        self.max = -math.inf
        self.samples: list[float] = []
        self._cap = cap
        self._rng = rng

    def add(self, v: float) -> None:
        self.count += 1
        self.total += v
        if v > self.max:
            self.max = v
        if len(self.samples) < self._cap:
            self.samples.append(v)
        else:  # reservoir sampling keeps a uniform sample of every value seen
            j = self._rng.randrange(self.count)
            if j < self._cap:
                self.samples[j] = v


class TimingSpanProcessor(SpanProcessor):
    """Aggregates catalog spans and recorder traces into per-key statistics.

    ``skip_scope``: spans of this instrumentation scope are ignored by ``on_end``
    (default: resettrace's own materialised spans, already aggregated from records).
    """

    def __init__(self, *, max_samples: int = 100_000,
                 skip_scope: str | None = INSTRUMENTATION_SCOPE, seed: int = 0) -> None:
        self._max_samples = max_samples
        self._skip_scope = skip_scope
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._series: dict[str, _Series] = {}
        # children's summed durations of still-open SDK spans that have a gap key
        self._open_children: OrderedDict[int, float] = OrderedDict()
        #: recorder traces and records aggregated so far
        self.traces_seen = 0
        self.records_seen = 0
        self._pending: deque[Sequence[Record]] = deque()
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        self._stopped = False
        _LIVE.add(self)

    def _after_fork_in_child(self) -> None:
        """Threads do not survive a fork: start a fresh aggregation thread when needed."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._worker = None

    # -- aggregation ------------------------------------------------------------------------
    def _add(self, key: str, value: float) -> None:
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = _Series(self._max_samples, self._rng)
        s.add(value)

    def on_trace(self, records: Sequence[Record], recorder: Recorder | None = None) -> None:
        """Queue one finished recorder trace (training thread: O(1), no aggregation).

        A daemon thread aggregates queued traces in batches, mostly while the
        training thread is inside the engine with the GIL released; every read
        (``stats``, ``samples``, ``force_flush``) first aggregates what is queued.
        """
        pending = self._pending
        pending.append(records)
        if len(pending) >= _DRAIN_BATCH and not self._wake.is_set():
            if self._worker is None:
                self._start_worker()
            self._wake.set()

    def _start_worker(self) -> None:
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True,
                                                name="resettrace-aggregate")
                self._worker.start()

    def _work(self) -> None:
        while not self._stopped:
            self._wake.wait(0.5)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        pending = self._pending
        while pending:
            with self._lock:
                for _ in range(min(len(pending), _DRAIN_CHUNK)):
                    self._aggregate(pending.popleft())
            if threading.current_thread() is self._worker:
                time.sleep(0)  # hand the GIL back to the training thread between chunks

    def _aggregate(self, records: Sequence[Record]) -> None:
        """Add one trace's phases; each ``set_state`` adds all 16 contract keys (0.0
        for phases it did not run), so every set_state key has one sample per call."""
        n = len(records)
        self.traces_seen += 1
        self.records_seen += n
        child_ns = [0] * n
        for i in range(n - 1, -1, -1):  # children come after their parent
            r = records[i]
            phase = PHASES[r[R_PHASE]]
            d = r[R_END] - r[R_START]
            p = r[R_PARENT]
            if p >= 0:
                child_ns[p] += d
            if phase.parent == _SET_STATE_SPAN:
                continue  # added with its parent's closed account below
            self._add(phase.key, d * 1e-6)
            if phase is SET_STATE:
                for key, value in closed_timing(records, i, phase).items():
                    self._add(key, value)
            elif phase.gap_key is not None:
                self._add(phase.gap_key, (d - child_ns[i]) * 1e-6)
            if phase is RESET_DONE and r[R_COUNT] >= 0:
                self._add(RESET_DONE_COUNT, float(r[R_COUNT]))

    # -- SpanProcessor ------------------------------------------------------------------------
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self._on_end(span)
        except Exception:  # a processor must never break the caller
            log.exception("TimingSpanProcessor: failed to aggregate span %r", span.name)

    def _on_end(self, span: ReadableSpan) -> None:
        phase = BY_SPAN.get(span.name)
        if phase is None or span.start_time is None or span.end_time is None:
            return
        scope = span.instrumentation_scope
        if self._skip_scope is not None and scope is not None and scope.name == self._skip_scope:
            return
        d = span.end_time - span.start_time
        ctx = span.get_span_context()
        with self._lock:
            self._add(phase.key, d * 1e-6)
            if phase.gap_key is not None:
                kids = self._open_children.pop(ctx.span_id, 0.0) if ctx else 0.0
                self._add(phase.gap_key, (d - kids) * 1e-6)
            if phase is RESET_DONE:
                count = (span.attributes or {}).get(ATTR_RESET_COUNT)
                if count is not None:
                    self._add(RESET_DONE_COUNT, float(count))  # type: ignore[arg-type]
            parent = BY_SPAN.get(phase.parent) if phase.parent else None
            if parent is not None and parent.gap_key is not None and span.parent is not None:
                pid = span.parent.span_id
                self._open_children[pid] = self._open_children.get(pid, 0.0) + d
                if len(self._open_children) > _MAX_OPEN_PARENTS:
                    self._open_children.popitem(last=False)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._drain()
        return True

    def shutdown(self) -> None:
        self._drain()
        self._stopped = True
        self._wake.set()

    # -- results ----------------------------------------------------------------------------
    def stats(self, keys: Iterable[str] | None = None) -> dict[str, KeyStats]:
        """Statistics per key seen so far (in catalog order, then the rest)."""
        self._drain()
        with self._lock:
            snapshot = {k: (s.count, s.total, s.max, sorted(s.samples))
                        for k, s in self._series.items()}
        out: dict[str, KeyStats] = {}
        for k in _ordered(snapshot if keys is None else [k for k in keys if k in snapshot]):
            count, total, mx, ordered = snapshot[k]
            pk = parent_key(k)
            share = None
            if pk is not None and pk in snapshot and snapshot[pk][1] > 0:
                share = total / snapshot[pk][1]
            out[k] = KeyStats(count=count, mean_ms=total / count, p50_ms=percentile(ordered, 50),
                              p90_ms=percentile(ordered, 90), p99_ms=percentile(ordered, 99),
                              max_ms=mx, total_ms=total, share_of_parent=share)
        return out

    def samples(self) -> dict[str, list[float]]:
        """The kept samples per key, in arrival order (all of them below ``max_samples``)."""
        self._drain()
        with self._lock:
            return {k: list(self._series[k].samples) for k in _ordered(self._series)}

    def clear(self) -> None:
        self._drain()
        with self._lock:
            self._series.clear()
            self._open_children.clear()
            self.traces_seen = self.records_seen = 0


_ORDER = {k: i for i, k in enumerate(ALL_KEYS)}


def _ordered(keys: Iterable[str] | Mapping[str, Any]) -> list[str]:
    return sorted(keys, key=lambda k: (_ORDER.get(k, len(_ORDER)), k))
