"""The aggregation engine: recorder traces into run statistics per timing key.

:class:`Aggregator` is the recorders' sink in ``timing`` and ``trace`` mode
(:meth:`Aggregator.on_trace`): it queues each finished trace (O(1) on the training
thread) and a daemon thread folds the queue into per-key series (exact count, total and
max, a reservoir of samples), mergeable distributions and the cost model's sums. Its
percentiles follow :mod:`resettrace.distribution`'s rule: exact (numpy's linear definition)
while the reservoir holds every call, else read from the key's buckets within their bound.
Traces of one shape share a plan (:class:`_Plan`), so a trace costs a shape lookup and a
few appends to arrays, and folding many is a few numpy column sums per key.
It imports no OpenTelemetry: :class:`~resettrace.tracing.processor.TimingSpanProcessor` is the
``SpanProcessor`` adapter over it for SDK spans.

The rule, for traces and SDK spans alike: a phase adds its duration under its key; a
phase with a gap key adds ``duration - sum(declared children)`` under it (a child of
another phase nested under it stays inside that gap); a closed account
(:attr:`~resettrace.catalog.Phase.closed`, ``set_state``) adds its whole timing dict
(every registered child's key, 0.0 for what did not run, then the gap), so each of those
keys has one sample per call. A phase nested inside itself counts once, for the
outermost call.
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
import queue
import random
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from resettrace.catalog import (
    CATALOG,
    ENV_STEP,
    RESET_DONE,
    RESET_DONE_COUNT,
    SET_STATE,
    Catalog,
    Phase,
)
from resettrace.costmodel import FitSums
from resettrace.distribution import Distribution, percentile
from resettrace.tracing import devicecounts, lifecycle
from resettrace.tracing.layout import (
    NO_COUNT,
    R_COUNT,
    R_END,
    R_PARENT,
    R_PHASE,
    R_START,
    RECORD_FIELDS,
)
from resettrace.tracing.recorder import Record, Trace, TraceLog, note_once

if TYPE_CHECKING:
    from resettrace.tracing.recorder import Recorder

log = logging.getLogger(__name__)

__all__ = ["Aggregator", "KeyStats", "percentile"]

#: queued traces that wake the aggregation thread
_DRAIN_BATCH = 1024
#: traces aggregated between two GIL hand-backs of the aggregation thread
_DRAIN_CHUNK = 1024
#: buffered records that are folded into samples at once (and at every read)
_FOLD_RECORDS = 32_768
#: trace shapes whose plans are kept (traces of more shapes: the plans start afresh)
_MAX_PLANS = 256
#: traces that wait for the aggregation thread at most (a trace of a few records holds
#: under 1 KB: under 100 MB); beyond it traces are dropped and counted (``dropped_traces``)
DEFAULT_MAX_PENDING = 100_000




@dataclass(frozen=True)
class KeyStats:
    """Statistics of one key over a run: milliseconds for a timing key. A count key
    (``reset_done_count``: the envs each ``reset_done`` reset) keeps the same fields in
    envs: ``mean_ms`` is then envs per call and ``total_ms`` the envs reset in all (the
    fields keep their names: they are the run record's and timing.csv's columns)."""

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


class _Draws:
    """The reservoir's draws for a block of ``m`` items that follow ``count`` items: item
    i (0-based) replaces a slot drawn uniformly from [0, count + i + 1), kept when it is
    one of the reservoir's ``cap`` (drawn for all the items at once: a long run folds
    millions of values per key, most of them dropped); a slot drawn twice keeps its later
    item. Remembered by ``(cap, count, m)``: the series of one fold that have seen as many
    values (a plan's keys, as a rule) replace the same traces' values, drawn once for all
    of them; each key's reservoir is still a uniform sample of its own values."""

    __slots__ = ("_gen", "_seen")

    def __init__(self, gen: np.random.Generator) -> None:
        self._gen = gen
        self._seen: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, cap: int, count: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        """The kept items' places in the block and the slots they replace."""
        got = self._seen.get((cap, count, m))
        if got is not None:
            return got
        slots = (self._gen.random(m) * (count + np.arange(1, m + 1))).astype(np.int64)
        kept = np.flatnonzero(slots < cap)
        slots = slots[kept]
        n = len(kept)
        if n > 1:  # each slot's last item: sorted by slot, then by place (unique keys)
            keyed = np.sort(slots * n + np.arange(n))
            at = keyed % n
            last = np.empty(n, dtype=bool)
            last[-1] = True
            np.not_equal(slots[at[1:]], slots[at[:-1]], out=last[:-1])
            at = at[last]
            kept, slots = kept[at], slots[at]
        got = self._seen[(cap, count, m)] = (kept, slots)
        return got


class _Series:
    """Exact count/total/max plus a bounded reservoir of samples for percentiles."""

    __slots__ = ("count", "total", "max", "kept", "_buf", "_cap", "_rng", "_gen")

    def __init__(self, cap: int, rng: random.Random) -> None:
        self.count = 0
        self.total = 0.0
        self.max = -math.inf
        #: the samples kept (``samples``): the first ``kept`` float64s of a buffer that
        #: grows by half as it fills, up to the cap (no Python object per sample; a fold's
        #: block lands in place: a buffer grown a few percent at a time, as an ``array``'s
        #: is, was reallocated at nearly every fold of a long run)
        self.kept = 0
        self._buf = np.empty(0, dtype=np.float64)
        self._cap = cap
        self._rng = rng
        self._gen: np.random.Generator | None = None  # add_many's, once the reservoir is full

    @property
    def samples(self) -> np.ndarray:
        """The kept samples (a view)."""
        return self._buf[:self.kept]

    def _room(self, need: int) -> None:
        """A buffer of at least ``need`` samples (within the cap)."""
        if need > len(self._buf):
            buf = np.empty(min(self._cap, max(need, len(self._buf) * 3 // 2, 256)),
                           dtype=np.float64)
            buf[:self.kept] = self._buf[:self.kept]
            self._buf = buf

    def add(self, v: float) -> None:
        self.count += 1
        self.total += v
        if v > self.max:
            self.max = v
        if self.kept < self._cap:
            self._room(self.kept + 1)
            self._buf[self.kept] = v
            self.kept += 1
        else:  # reservoir sampling keeps a uniform sample of every value seen
            j = self._rng.randrange(self.count)
            if j < self._cap:
                self._buf[j] = v

    def add_many(self, values: np.ndarray, total: float | None = None,
                 top: float | None = None, draws: _Draws | None = None) -> None:
        """``add`` of every value in order: the same reservoir rule, in numpy passes (the
        slots drawn from a numpy generator seeded from the series' random source);
        ``total`` and ``top``: the values' sum and max, when already known; ``draws``:
        the reservoir's draws (shared by the series of one fold; else the series' own)."""
        m = len(values)
        if not m:
            return
        self.total += float(values.sum()) if total is None else total
        self.max = max(self.max, float(values.max()) if top is None else top)
        free = self._cap - self.kept
        if free > 0:
            h = min(free, m)
            self._room(self.kept + h)
            self._buf[self.kept:self.kept + h] = values[:h]
            self.kept += h
            self.count += h
            values = values[h:]
            m = len(values)
            if not m:
                return
        if draws is None:
            if self._gen is None:
                self._gen = np.random.default_rng(self._rng.getrandbits(64))
            draws = _Draws(self._gen)
        kept, slots = draws(self._cap, self.count, m)
        self.count += m
        if len(kept):
            self._buf[slots] = values[kept]


_K_ZERO = -2  # _Plan.k_at of an env step that reset nothing
#: a record's place in its trace's shape: its phase and its parent's position
_PLACE = operator.itemgetter(R_PHASE, R_PARENT)
_flat = itertools.chain.from_iterable


def _shapes(traces: Sequence[Sequence[Record]]) -> list[bytes]:
    """Each trace's shape: its records' phases and parent positions, as the bytes of their
    int64s (the key :meth:`Aggregator._packed` makes of a recorder trace's)."""
    shapes = []
    for t in traces:
        try:
            shapes.append(array("q", _flat(map(_PLACE, t))).tobytes())
        except (TypeError, ValueError, OverflowError):  # fields written by hand
            shapes.append(repr([tuple(_PLACE(r)) for r in t]).encode())
    return shapes


class _Plan:
    """How one shape of trace (its phases and parent links) becomes samples.

    Traces from one code path share a shape, so the rules of the module docstring are
    worked out once per shape: each sample row is one sample of one key, a sum of some
    of the trace's record durations minus some others. A trace then costs its durations
    and counts appended to arrays; folding many of them is a few numpy column sums per
    row.

    A phase entered inside itself is transparent: it adds no sample, and its children
    count as children of its own parent.
    """

    __slots__ = ("width", "keys", "live", "zero", "row_keys", "direct_cols", "summed",
                 "count_at", "k_at", "durations", "seqs", "ks", "counts")

    def __init__(self, records: Sequence[Record], catalog: Catalog) -> None:
        n = self.width = len(records)
        phases = [catalog[r[R_PHASE]] for r in records]
        skip = _recursive(records, phases) if len(set(phases)) < n else [False] * n
        parent_of = [-1] * n  # the effective parent: recursive records are skipped over
        for i in range(n):
            p = records[i][R_PARENT]
            parent_of[i] = parent_of[p] if p >= 0 and skip[p] else p
        declared: list[list[int]] = [[] for _ in range(n)]  # declared children per record
        for i in range(n):
            p = parent_of[i]
            if p >= 0 and not skip[i] and phases[i].parent == phases[p].span:
                declared[p].append(i)
        rows: list[tuple[str, list[int], list[int]]] = []
        self.count_at: list[int] = []
        for i in range(n):
            if skip[i]:
                continue  # a phase inside itself: its time is in the outer call's
            phase = phases[i]
            p = parent_of[i]
            parent = phases[p] if p >= 0 else None
            if parent is not None and phase.parent == parent.span:
                if parent.closed:
                    continue  # a sample of its parent's closed account below
            elif parent is not None:
                note_once(f"nesting:{phase.span}:{parent.span}",
                          "phase %r was recorded under %r, not under its "
                          "registered parent %r; its time stays in that phase's gap",
                          phase.span, parent.span, phase.parent)
            rows.append((phase.key, [i], []))
            kids = declared[i]
            if phase.closed:
                _, key_of, zeros = catalog.layout(phase)
                sums: dict[str, list[int]] = {k: [] for k in zeros}
                for j in kids:
                    sums[key_of[records[j][R_PHASE]]].append(j)
                rows.extend((key, cols, []) for key, cols in sums.items()
                            if key != phase.gap_key)
                rows.append((phase.gap_key, [i], kids))  # type: ignore[arg-type]
            elif phase.gap_key is not None:
                rows.append((phase.gap_key, [i], kids))
            if phase is RESET_DONE:
                self.count_at.append(i)
        # the trace's k (envs reset) for the cost model: its reset_done's count, else the
        # first set_state's (a set_state called on its own); an env step without either
        # reset nothing (k = 0, :data:`_K_ZERO`); else none (-1)
        at = self.count_at or [i for i in range(n) if phases[i] is SET_STATE][:1]
        self.k_at = at[0] if at else _K_ZERO if n and phases[0] is ENV_STEP else -1
        self.keys = [k for k, _, _ in rows]
        # the rows of a closed account's phases that cannot run in this shape (no record)
        # are zeros whatever the durations: no values, a count of zeros at the fold
        self.zero = [j for j, (_, plus, _) in enumerate(rows) if not plus]
        live = [j for j, (_, plus, _) in enumerate(rows) if plus]
        # the rows of values: first those that are one record's duration (most), gathered
        # in one pass, then the others, each a sum of some durations minus some others
        direct = [j for j in live if len(rows[j][1]) == 1 and not rows[j][2]]
        summed = [j for j in live if len(rows[j][1]) != 1 or rows[j][2]]
        #: per row of :meth:`values`, its key
        self.row_keys = [rows[j][0] for j in direct + summed]
        #: per key (row of the plan): its row in :meth:`values` (-1: a zero row)
        self.live = [-1] * len(rows)
        for row, j in enumerate(direct + summed):
            self.live[j] = row
        self.direct_cols = np.array([rows[j][1][0] for j in direct], dtype=np.intp)
        self.summed = [(len(direct) + i, np.array(rows[j][1], dtype=np.intp),
                        np.array(rows[j][2], dtype=np.intp)) for i, j in enumerate(summed)]
        # the buffered traces, in arrays (no object per trace for the garbage collector
        # to walk: a training step that allocates nothing else makes it collect nothing)
        self.durations = array("q")  # each trace's record durations (ns), trace after trace
        self.seqs = array("q")
        self.ks = array("d")  # each trace's k, when the plan has one
        self.counts = array("d")  # each trace's reset_done counts (-1: none given)

    def values(self) -> np.ndarray:
        """The values (ms) of every row that is not a zero row, for every buffered trace:
        ``(rows, traces)``, a row's values contiguous for the passes over each (the row
        sums in int64 ns, then ms)."""
        m = len(self.seqs)
        # (a view of the buffer: gone when this returns, before the buffer is cleared)
        d = np.frombuffer(self.durations, dtype=np.int64).reshape(m, self.width)
        v = np.empty((len(self.row_keys), m), dtype=np.float64)
        n = len(self.direct_cols)
        np.multiply(d[:, self.direct_cols].T, 1e-6, out=v[:n])  # (the gather, then ms)
        for j, plus, minus in self.summed:
            x = d[:, plus].sum(axis=1)
            if len(minus):
                x -= d[:, minus].sum(axis=1)
            np.multiply(x, 1e-6, out=v[j])
        del d
        return v


def _counts(values: list[Any]) -> array[float]:
    """Record counts as an array of floats, whole or not at all: a count that is not an
    int >= 0 (a record written by hand: the recorders store ints only) is -1, none, so one
    bad record never misaligns its plan's buffers nor stops the aggregation."""
    try:
        return array("d", array("q", values))  # int64s: what a record holds
    except (TypeError, ValueError, OverflowError):
        return array("d", [v if type(v) is int and 0 <= v < 1 << 63 else NO_COUNT
                           for v in values])


def _recursive(records: Sequence[Record], phases: Sequence[Phase]) -> list[bool]:
    """Per record: does its phase also open one of its ancestors?"""
    out = [False] * len(records)
    for i, r in enumerate(records):
        j = r[R_PARENT]
        while j >= 0:
            if records[j][R_PHASE] == r[R_PHASE]:
                out[i] = True
                note_once("recursion", "phase %r was entered inside itself; it counts "
                          "once, for the outermost call", phases[i].span)
                break
            j = records[j][R_PARENT]
    return out


class Aggregator:
    """Aggregates recorder traces (and, through :meth:`add`, any value) into per-key
    statistics. ``catalog``: the phases it knows (default: the process's
    :data:`~resettrace.catalog.CATALOG`); ``max_samples``: samples kept per key (the
    percentiles are exact up to that many calls, from the buckets beyond); ``seed``: of the
    reservoir sampling; ``max_pending``: traces that wait for the aggregation thread at
    most: a trace that finds the queue full is dropped, and counted in
    :attr:`dropped_traces` (training outpacing the thread for long keeps memory
    bounded; the statistics then miss exactly that many traces)."""

    def __init__(self, *, max_samples: int = 100_000, seed: int = 0,
                 catalog: Catalog = CATALOG, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.catalog = catalog
        self.max_pending = max_pending
        #: the queue length that wakes the aggregation thread
        self._wake_at = min(_DRAIN_BATCH, max_pending)
        #: recorder traces dropped because the queue was full (never aggregated)
        self.dropped_traces = 0
        # traces may end on several threads, and in a signal handler on a thread that holds it
        self._drop_lock = threading.RLock()
        self._max_samples = max_samples
        self._rng = random.Random(seed)
        self._gen: np.random.Generator | None = None  # the folds' reservoir draws
        self._lock = threading.Lock()
        self._series: dict[str, _Series] = {}
        #: per key, the sums of the cost model ``ms = a + b * k`` over its calls (recorder
        #: traces with a reset count; see :mod:`resettrace.costmodel`)
        self._fits: dict[str, FitSums] = {}
        #: per key, every call's value in mergeable exponential buckets (see
        #: :mod:`resettrace.distribution`): percentiles that combine across workers
        self._dists: dict[str, Distribution] = {}
        #: what else a fork or :meth:`clear` resets with the statistics (an adapter's)
        self.on_clear: list[Callable[[], None]] = []
        #: recorder traces and records aggregated so far
        self.traces_seen = 0
        self.records_seen = 0
        #: the recorders' finished traces waiting for the aggregation thread, as int64s (no
        #: object per trace); a trace closed by the compiled recorder is appended in C
        #: while it holds fewer than ``limit`` (no call of :meth:`on_trace`: the wake-ups,
        #: drops and start-up below stay with it)
        self.trace_queue = self._log = TraceLog()
        #: any other finished traces (sequences of records handed to :meth:`on_trace`)
        self._others: deque[Sequence[Record]] = deque()
        #: traces taken from the log and not aggregated yet (pending all the same)
        self._taken = 0
        self._closing = False  # shut down: the log takes no trace in C
        self._admit()
        # traces of one shape share a plan; their durations wait in it until folded
        self._plans: dict[bytes, _Plan] = {}
        self._plans_version = catalog.version
        self._seq = 0
        self._buffered = 0
        # the thread's wake-ups: a SimpleQueue, whose put() takes no lock of Python's (a
        # threading.Event's set() does, and a signal handler whose trace woke the thread
        # inside it, or a SIGTERM's SystemExit raised between its acquire and its with
        # block, left it held: the process hung)
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._woken = False
        self._worker: threading.Thread | None = None
        self._stopped = False
        lifecycle.track(self)

    def _after_fork_in_child(self) -> None:
        """A forked worker counts its own calls only: nothing of the parent's is kept
        (queue, buffered traces, samples), and threads, which do not survive a fork, are
        started afresh when needed."""
        self._lock = threading.Lock()
        self._wake = queue.SimpleQueue()
        self._woken = False
        self._worker = None
        self._log.clear()  # (the same log: a recorder looks it up on the sink)
        self._others.clear()
        self._taken = 0
        self._drop_lock = threading.RLock()
        self.dropped_traces = 0
        self._plans = {}
        self._buffered = 0
        self._series = {}
        self._fits = {}
        self._dists = {}
        for reset in self.on_clear:
            reset()
        self.traces_seen = self.records_seen = 0

    # -- aggregation ------------------------------------------------------------------------
    def add(self, key: str, value: float) -> None:
        """One sample of ``key`` (caller holds :attr:`lock`)."""
        self._add(key, value)

    @property
    def lock(self) -> threading.Lock:
        """Held while statistics change: an adapter adding samples takes it."""
        return self._lock

    def _add(self, key: str, value: float) -> None:
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = _Series(self._max_samples, self._rng)
        s.add(value)
        d = self._dists.get(key)
        if d is None:
            d = self._dists[key] = Distribution()
        d.add_one(value)

    def on_trace(self, records: Sequence[Record], recorder: Recorder | None = None) -> None:
        """Queue one finished recorder trace (training thread: O(1), no aggregation).

        A daemon thread aggregates queued traces in batches, mostly while the
        training thread is inside the engine with the GIL released; every read
        (``stats``, ``samples``, ``force_flush``) first aggregates what is queued.
        """
        if self._stopped:
            return  # a shut-down session keeps nothing (its recorders may live on)
        n = self.pending()
        if n >= self.max_pending:  # the thread is behind: memory stays bounded
            with self._drop_lock:
                self.dropped_traces += 1
            if self._worker is None:
                self._start_worker()
            self._wake_worker()
            return
        if type(records) is Trace:
            self._log.append(records)  # (a copy of its int64s)
        else:
            self._others.append(records)
        n += 1
        if n >= self._wake_at and (n == self._wake_at or self._worker is None):
            # once per batch (a busy thread drains on), or until the worker runs
            if self._worker is None:
                self._start_worker()
            self._wake_worker()

    def pending(self) -> int:
        """Finished traces waiting to be aggregated."""
        return len(self._log) + len(self._others) + self._taken

    def _wake_worker(self) -> None:
        """Wake the aggregation thread: from any thread, and from a signal handler landing
        anywhere in the training thread (no lock; one wake-up waits at a time)."""
        if not self._woken:
            self._woken = True
            self._wake.put(None)

    def _start_worker(self) -> None:
        # never waits: the lock may be held by this very thread, interrupted (in a read of
        # the statistics, or starting the worker) by a signal handler whose trace this is;
        # the next trace tries again
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True,
                                                name="resettrace-aggregate")
                self._worker.start()
        finally:
            self._lock.release()

    def _work(self) -> None:
        wake = self._wake
        while not self._stopped:
            try:
                wake.get(timeout=5.0)
            except queue.Empty:
                pass
            self._woken = False  # before the drain: traces queued from now wake it again
            while not wake.empty():
                wake.get_nowait()
            try:
                self._drain()
            except Exception:  # the thread outlives a batch it could not aggregate
                log.exception("resettrace: a batch of traces could not be aggregated")

    def _drain(self) -> None:
        """Aggregate every trace waiting, those that arrive meanwhile too: the log's a batch
        at a time (taken and aggregated in one hold of the lock, so a read that takes the
        lock next sees them), the others in batches."""
        on_worker = threading.current_thread() is self._worker
        if not on_worker and devicecounts.active():  # a read: traces whose counts on a
            devicecounts.settle(0.0, sink=self)  # device landed are handed on first
        others = self._others
        take = others.popleft
        while len(self._log) or others:
            if len(self._log):
                with self._lock:  # (held up, the traces stay where they count as pending)
                    # a batch at a time: a block of the batch's size, the one freed the
                    # batch before (the whole log after a hold-up is megabytes, cold)
                    fields, lens = self._log.take(_DRAIN_CHUNK)
                    self._taken = len(lens) // 8  # (pending still: max_pending holds)
                    self._admit()
                    try:
                        self._aggregate_fields(
                            np.frombuffer(fields, dtype=np.int64).reshape(-1, RECORD_FIELDS),
                            np.frombuffer(lens, dtype=np.int64))
                    finally:
                        self._taken = 0
                        self._admit()
                if on_worker:
                    time.sleep(0)  # hand the GIL back to the training thread between chunks
            while others:
                with self._lock:
                    self._aggregate([take() for _ in range(min(len(others), _DRAIN_CHUNK))])
                if on_worker:
                    time.sleep(0)

    def _admit(self) -> None:
        """The log's limit: traces the compiled recorder appends in C, within
        ``max_pending`` with those taken and not yet aggregated (beyond it, and for the
        trace at the wake-up mark, :meth:`on_trace` decides: a thread held up costs the
        training thread no call per trace); none once shut down."""
        self._log.limit = 0 if self._closing else max(0, self.max_pending - self._taken)
        self._log.wake = self._wake_at

    def _plans_current(self) -> None:
        """Plans made before a phase was registered start afresh (what they hold folded)."""
        if self._plans_version != self.catalog.version:
            self._fold()
            self._plans.clear()
            self._plans_version = self.catalog.version

    def _aggregate(self, traces: list[Sequence[Record]]) -> None:
        """Buffer traces' durations under the plans of their shapes (see :class:`_Plan`),
        record by record: per trace a shape and a plan lookup, then per plan its traces'
        durations and counts in one pass each (the recorders' traces come from the log,
        :meth:`_aggregate_fields`)."""
        self._plans_current()
        plans = self._plans
        groups: dict[_Plan, list[int]] = {}  # per plan, its traces' places in the batch
        shapes = _shapes(traces)
        for j, shape in enumerate(shapes):
            plan = plans.get(shape)
            if plan is None:
                if len(plans) >= _MAX_PLANS:  # too many shapes: start afresh
                    self._buffer(traces, groups)  # (what came before is folded too)
                    groups = {}
                    self._fold()
                    plans.clear()
                plan = plans[shape] = _Plan(traces[j], self.catalog)
            group = groups.get(plan)
            if group is None:
                groups[plan] = [j]
            else:
                group.append(j)
        self._buffer(traces, groups)
        self._seq += len(traces)
        self.traces_seen += len(traces)
        n = sum(map(len, traces))
        self.records_seen += n
        if self._buffered >= _FOLD_RECORDS:
            self._fold()

    def _aggregate_fields(self, fields: np.ndarray, lens: np.ndarray) -> None:
        """:meth:`_aggregate` of traces given as their records' fields one after another
        (``(records, RECORD_FIELDS)``) and each one's record count: in a few numpy passes
        (:meth:`_packed`), or, with more new shapes than the plans may hold, record by
        record."""
        self._plans_current()
        if not lens.all():  # empty traces: seen, nothing to aggregate
            self._seq += int((lens == 0).sum())
            self.traces_seen += int((lens == 0).sum())
            lens = lens[lens > 0]
        if not len(lens) or self._packed(fields, lens):
            return
        rows = fields.tolist()
        at = np.cumsum(lens).tolist()
        self._aggregate([rows[e - n:e] for e, n in zip(at, lens.tolist(), strict=True)])

    def _packed(self, fields: np.ndarray, lens: np.ndarray) -> bool:
        """:meth:`_aggregate_fields` with no Python step per trace (every trace has
        records): traces of one length read as an ``(n traces, width, RECORD_FIELDS)``
        view, their shapes told apart by one comparison (``np.unique`` over the (phase,
        parent) rows when they differ), each plan's traces buffered in a few numpy passes.
        False (nothing done) with more new shapes than the plans may hold."""
        m = len(lens)
        plans = self._plans
        # per shape: its key, plan (None: new), first trace, and its traces' records as
        # an (n traces, width, RECORD_FIELDS) array with their places in the batch
        found: list[tuple[bytes, _Plan | None, np.ndarray, np.ndarray]] = []
        new = 0
        low, high = int(lens.min()), int(lens.max())
        starts = np.cumsum(lens) - lens if high > low else None
        for width in np.unique(lens).tolist() if starts is not None else (low,):
            if starts is None:  # traces of one length (the usual batch): views, no gather
                idx = np.arange(m)
                block = fields.reshape(m, width, RECORD_FIELDS)
            else:
                idx = np.flatnonzero(lens == width)
                block = fields[starts[idx][:, None] + np.arange(width)]
            place = block[:, :, R_PHASE:R_PARENT + 1]  # (phase, parent): the shape
            # one shape (the usual batch): no sort (the two fields compared a field at a
            # time: an inner loop over the trace's records, not over a record's 2 fields)
            phase, parent = block[:, :, R_PHASE], block[:, :, R_PARENT]
            if (phase == phase[0]).all() and (parent == parent[0]).all():
                kinds = [(np.ascontiguousarray(place[0]).tobytes(), idx, block)]
            else:
                keyed = np.ascontiguousarray(place).reshape(len(idx), -1).view(
                    np.dtype((np.void, 16 * width))).ravel()
                shapes, inverse = np.unique(keyed, return_inverse=True)
                inverse = inverse.ravel()
                kinds = []
                for u in range(len(shapes)):
                    mine = np.flatnonzero(inverse == u)
                    kinds.append((shapes[u].tobytes(), idx[mine], block[mine]))
            for shape, members, rows in kinds:  # shape: the key _shapes() makes
                plan = plans.get(shape)
                new += plan is None
                found.append((shape, plan, members, rows))
        if new and len(plans) + new > _MAX_PLANS:
            return False  # the record-by-record path starts afresh
        seq0 = self._seq + 1  # the batch's first trace's arrival number
        for shape, plan, members, rows in found:
            if plan is None:
                plan = plans[shape] = _Plan(rows[0].tolist(), self.catalog)
            plan.seqs.frombytes((members + seq0).astype(np.int64).tobytes())
            d = rows[:, :, R_END] - rows[:, :, R_START]
            plan.durations.frombytes(np.ascontiguousarray(d).tobytes())
            if plan.k_at >= 0:
                plan.ks.frombytes(rows[:, plan.k_at, R_COUNT].astype(np.float64).tobytes())
            if plan.count_at:
                c = rows[:, plan.count_at, R_COUNT]
                plan.counts.frombytes(c.astype(np.float64).tobytes())
            self._buffered += len(members) * plan.width
        self._seq += m
        self.traces_seen += m
        self.records_seen += int(lens.sum())
        if self._buffered >= _FOLD_RECORDS:
            self._fold()
        return True

    def _buffer(self, traces: list[Sequence[Record]], groups: dict[_Plan, list[int]]
                ) -> None:
        """Append each plan's traces of this batch (``groups``: their places in it),
        record by record."""
        first = self._seq + 1  # the batch's first trace's arrival number
        for plan, places in groups.items():
            mine = [traces[j] for j in places]
            plan.seqs.extend([first + j for j in places])
            plan.durations.extend([r[R_END] - r[R_START] for r in _flat(mine)])
            if plan.k_at >= 0:
                k = plan.k_at
                plan.ks.extend(_counts([t[k][R_COUNT] for t in mine]))
            if plan.count_at:
                plan.counts.extend(_counts([t[i][R_COUNT] for t in mine
                                            for i in plan.count_at]))
            self._buffered += len(places) * plan.width

    def _fold(self) -> None:
        """Turn the buffered traces into samples, in arrival order (caller holds the lock)."""
        if not self._buffered:
            return
        self._buffered = 0
        # per key: its values from each plan (with their traces' arrival numbers, the
        # values' sum and max), for the reservoir, which keeps arrival order; the
        # distributions and the cost model's sums take a plan's every key at once
        parts: dict[str, list[tuple[np.ndarray, np.ndarray, float, float]]] = {}
        dists = self._dists
        if self._gen is None:
            self._gen = np.random.default_rng(self._rng.getrandbits(64))
        draws = _Draws(self._gen)
        for plan in self._plans.values():
            if not plan.seqs:
                continue
            seqs = np.array(plan.seqs, dtype=np.int64)
            m = len(seqs)
            values = plan.values()  # (the rows that are not zero rows)
            keys = plan.keys
            for key in keys:
                if key not in dists:
                    dists[key] = Distribution()
            live = plan.row_keys
            lows, tops = values.min(axis=1), values.max(axis=1)
            totals = values.sum(axis=1)
            Distribution.add_rows([dists[k] for k in live], values, lows, tops)
            for j in plan.zero:
                dists[keys[j]].add_zeros(m)
            if plan.k_at >= 0 or plan.k_at == _K_ZERO:
                ks = (np.array(plan.ks, dtype=np.float64) if plan.k_at >= 0
                      else np.zeros(m))
                for key in keys:
                    if key not in self._fits:
                        self._fits[key] = FitSums()
                if plan.k_at == _K_ZERO or bool((ks >= 0).all()):  # every trace counted
                    FitSums.add_rows([self._fits[k] for k in live], ks, values, totals)
                    counted_k = ks
                else:
                    counted = ks >= 0
                    counted_k = ks[counted]
                    FitSums.add_rows([self._fits[k] for k in live], counted_k,
                                     values[:, counted])
                FitSums.add_rows([self._fits[keys[j]] for j in plan.zero], counted_k, None)
            totals, top = totals.tolist(), tops.tolist()
            zeros = np.zeros(m if plan.zero else 0)  # (the zero rows' values)
            for j, key in enumerate(keys):
                row = plan.live[j]
                parts.setdefault(key, []).append(
                    (seqs, values[row], totals[row], top[row]) if row >= 0
                    else (seqs, zeros, 0.0, 0.0))
            if plan.count_at:  # each reset_done's count, in arrival order
                cs = np.array(plan.counts, dtype=np.float64).reshape(len(seqs), -1)
                has = cs >= 0
                if has.any():
                    counts = cs[has]
                    parts.setdefault(RESET_DONE_COUNT, []).append(
                        (np.repeat(seqs, has.sum(axis=1)), counts, float(counts.sum()),
                         float(counts.max())))
                    if RESET_DONE_COUNT not in dists:
                        dists[RESET_DONE_COUNT] = Distribution()
                    dists[RESET_DONE_COUNT].add(counts)
            for buffer in (plan.durations, plan.seqs, plan.ks, plan.counts):
                del buffer[:]
        for key, chunks in parts.items():
            if len(chunks) == 1:
                _, ordered, total, top = chunks[0]
            else:  # (the sum of the ordered values: a total whatever order plans came in)
                seqs = np.concatenate([c[0] for c in chunks])
                ordered = np.concatenate([c[1] for c in chunks])[np.argsort(seqs,
                                                                            kind="stable")]
                total, top = float(ordered.sum()), max(c[3] for c in chunks)
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = _Series(self._max_samples, self._rng)
            s.add_many(ordered, total, top, draws)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Aggregate every trace queued; False when traces still wait for their counts on
        a device (up to ``timeout_millis``, at most ``devicecounts.READ_WAIT_S``)."""
        ok = True
        if devicecounts.active():  # traces waiting for counts on a device: waited for
            devicecounts.settle(min(devicecounts.READ_WAIT_S, timeout_millis / 1000),
                                sink=self)
            ok = not devicecounts.waiting(self)
        self._drain()
        with self._lock:
            self._fold()
        return ok

    def shutdown(self) -> None:
        self._closing = True
        self._admit()  # every trace to on_trace, which keeps none from now
        self._drain()
        with self._lock:
            self._fold()
        self._stopped = True
        self._wake.put(None)

    # -- results ----------------------------------------------------------------------------
    def stats(self, keys: Iterable[str] | None = None) -> dict[str, KeyStats]:
        """Statistics per key seen so far (in catalog order, then the rest)."""
        self._drain()
        with self._lock:
            self._fold()
            # every call's value at hand: exact; a reservoir of some: from the buckets,
            # within their bound (the rule of :mod:`resettrace.distribution`)
            snapshot = {k: (s.count, s.total, s.max,
                            _exact_percentiles(s.samples, _QS) if s.kept == s.count
                            or k not in self._dists else Distribution.merged([self._dists[k]]))
                        for k, s in self._series.items()}
        out: dict[str, KeyStats] = {}
        order = self._order()
        for k in _ordered(snapshot if keys is None else [k for k in keys if k in snapshot],
                          order):
            count, total, mx, ordered = snapshot[k]
            pk = self.catalog.parent_key(k)
            share = None
            if pk is not None and pk in snapshot and snapshot[pk][1] > 0:
                share = total / snapshot[pk][1]
            p50, p90, p99 = (ordered if isinstance(ordered, list)
                             else [ordered.quantile(q / 100) for q in _QS])
            out[k] = KeyStats(count=count, mean_ms=total / count, p50_ms=p50, p90_ms=p90,
                              p99_ms=p99, max_ms=mx, total_ms=total, share_of_parent=share)
        return out

    def totals(self) -> dict[str, tuple[int, float, float]]:
        """Per key, the exact ``(count, total, max)`` so far, without the percentiles (no
        sorting: cheap enough for every metrics scrape)."""
        self._drain()
        with self._lock:
            self._fold()
            return {k: (s.count, s.total, s.max) for k, s in self._series.items()}

    def fit_sums(self) -> dict[str, FitSums]:
        """Per key, the sums of its cost model over every call with a reset count k (a
        copy; :meth:`FitSums.fit` gives ``a + b * k``), in catalog order."""
        self._drain()
        with self._lock:
            self._fold()
            return {k: self._fits[k].copy() for k in _ordered(self._fits, self._order())}

    def distributions(self) -> dict[str, Distribution]:
        """Per key, every call in mergeable exponential buckets (copies), in catalog order."""
        self._drain()
        with self._lock:
            self._fold()
            return {k: Distribution.merged([self._dists[k]])
                    for k in _ordered(self._dists, self._order())}

    def samples(self) -> dict[str, list[float]]:
        """The kept samples per key, in arrival order (all of them below ``max_samples``)."""
        self._drain()
        with self._lock:
            self._fold()
            return {k: self._series[k].samples.tolist()
                    for k in _ordered(self._series, self._order())}

    def clear(self) -> None:
        self._drain()
        with self._lock:
            self._fold()
            self._series.clear()
            self._fits.clear()
            self._dists.clear()
            for reset in self.on_clear:
                reset()
            self.traces_seen = self.records_seen = 0
            with self._drop_lock:
                self.dropped_traces = 0


    def _order(self) -> dict[str, int]:
        return {k: i for i, k in enumerate(self.catalog.all_keys())}


#: the percentiles a key's statistics give
_QS = (50, 90, 99)


def _exact_percentiles(samples: np.ndarray, qs: Sequence[float]) -> list[float]:
    """:func:`~resettrace.distribution.percentile` of the samples at each ``q``, from the
    order statistics it reads only (``np.partition``: no sort of every sample, no float
    object per sample), so the same values to the last bit."""
    a = np.asarray(samples, dtype=np.float64)
    n = len(a)
    if n == 0:
        return [math.nan] * len(qs)
    # each at its sorted place: the two neighbours each percentile reads
    at = {min(math.floor((n - 1) * q / 100.0) + d, n - 1) for q in qs for d in (0, 1)}
    part = np.partition(a, sorted(at))
    return [float(percentile(part, q)) for q in qs]  # type: ignore[arg-type]


def _ordered(keys: Iterable[str] | Mapping[str, Any], order: Mapping[str, int]) -> list[str]:
    return sorted(keys, key=lambda k: (order.get(k, len(order)), k))
