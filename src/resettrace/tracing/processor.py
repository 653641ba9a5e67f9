"""Aggregate SDK spans as recorder traces are: the ``SpanProcessor`` adapter over the
aggregation engine (:mod:`resettrace.tracing.aggregate`).

:class:`TimingSpanProcessor` is an OpenTelemetry ``SpanProcessor``: attach it to any
``TracerProvider`` and it aggregates every ended span whose name is in the catalog,
including spans that user code creates itself, by the engine's rule. It is also a
recorder sink (:meth:`on_trace`, the engine's). The spans that resettrace materialises
from records carry the instrumentation scope
:data:`~resettrace.catalog.INSTRUMENTATION_SCOPE`; ``on_end`` skips them so nothing is
counted twice. An SDK span whose name is not in the catalog is aggregated under its
:func:`~resettrace.catalog.default_key` and listed by
:meth:`TimingSpanProcessor.unregistered_spans`.

Contract (as for every SDK processor): ``on_end`` runs on the thread that ended
the span; it never blocks on I/O and never raises.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from resettrace.catalog import (
    ATTR_RESET_COUNT,
    CATALOG,
    INSTRUMENTATION_SCOPE,
    RESET_DONE,
    RESET_DONE_COUNT,
    Catalog,
    Phase,
    default_key,
)
from resettrace.tracing.aggregate import Aggregator, KeyStats, percentile
from resettrace.tracing.recorder import Record, note_once

if TYPE_CHECKING:
    from resettrace.costmodel import FitSums
    from resettrace.distribution import Distribution
    from resettrace.tracing.recorder import Recorder

log = logging.getLogger(__name__)

__all__ = ["KeyStats", "TimingSpanProcessor", "percentile"]

_MAX_OPEN_PARENTS = 10_000


class TimingSpanProcessor(SpanProcessor):
    """Aggregates catalog spans and recorder traces into per-key statistics.

    Attach it to a ``TracerProvider`` (``provider.add_span_processor(...)``) to
    aggregate SDK spans that your code creates with catalog span names, or hand its
    :meth:`on_trace` to recorders. ``skip_scope``: spans of this instrumentation scope
    are ignored by ``on_end`` (default: resettrace's own materialised spans, already
    aggregated from records). ``catalog``: the phases it knows (default: the
    process's :data:`~resettrace.catalog.CATALOG`).
    """

    def __init__(self, *, max_samples: int = 100_000,
                 skip_scope: str | None = INSTRUMENTATION_SCOPE, seed: int = 0,
                 catalog: Catalog = CATALOG) -> None:
        self.engine = Aggregator(max_samples=max_samples, seed=seed, catalog=catalog)
        self.catalog = catalog
        self._skip_scope = skip_scope
        self._unregistered: dict[str, str] = {}
        # open SDK spans that close an account (a gap or a closed account) by span id, and
        # the ended declared children of those: span id -> [(phase, ms)]
        self._accounts: OrderedDict[int, Phase] = OrderedDict()
        self._open_children: OrderedDict[int, list[tuple[Phase, float]]] = OrderedDict()
        self.engine.on_clear.append(self._clear_open)

    def _clear_open(self) -> None:
        self._accounts = OrderedDict()
        self._open_children = OrderedDict()

    # -- the engine's ---------------------------------------------------------------------------
    def on_trace(self, records: Sequence[Record], recorder: Recorder | None = None) -> None:
        self.engine.on_trace(records, recorder)

    @property
    def traces_seen(self) -> int:
        return self.engine.traces_seen

    @property
    def records_seen(self) -> int:
        return self.engine.records_seen

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.engine.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.engine.shutdown()

    def stats(self, keys: Iterable[str] | None = None) -> dict[str, KeyStats]:
        return self.engine.stats(keys)

    def totals(self) -> dict[str, tuple[int, float, float]]:
        return self.engine.totals()

    def fit_sums(self) -> dict[str, FitSums]:
        return self.engine.fit_sums()

    def distributions(self) -> dict[str, Distribution]:
        return self.engine.distributions()

    def samples(self) -> dict[str, list[float]]:
        return self.engine.samples()

    def clear(self) -> None:
        self.engine.clear()

    # -- SpanProcessor ------------------------------------------------------------------------
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Remember open spans that close an account, so that only their children wait."""
        try:
            phase = self.catalog.get(span.name)
            if phase is None or phase.gap_key is None:
                return
            scope = span.instrumentation_scope
            if self._skip_scope is not None and scope is not None and \
                    scope.name == self._skip_scope:
                return
            with self.engine.lock:
                self._accounts[span.get_span_context().span_id] = phase
                if len(self._accounts) > _MAX_OPEN_PARENTS:
                    self._accounts.popitem(last=False)
        except Exception:  # a processor must never break the caller
            log.exception("TimingSpanProcessor: on_start failed for %r", span.name)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self._on_end(span)
        except Exception:  # a processor must never break the caller
            log.exception("TimingSpanProcessor: failed to aggregate span %r", span.name)

    def _on_end(self, span: ReadableSpan) -> None:
        if span.start_time is None or span.end_time is None:
            return
        scope = span.instrumentation_scope
        if self._skip_scope is not None and scope is not None and scope.name == self._skip_scope:
            return
        phase = self.catalog.get(span.name)
        d_ms = (span.end_time - span.start_time) * 1e-6
        ctx = span.get_span_context()
        parent_id = span.parent.span_id if span.parent is not None else -1
        with self.engine.lock:
            sid = ctx.span_id if ctx else -1
            kids = self._open_children.pop(sid, None)
            self._accounts.pop(sid, None)
            parent = self._accounts.get(parent_id)
            declared = phase is not None and parent is not None and phase.parent == parent.span
            if phase is None:
                self.engine.add(self._derived_key(span.name), d_ms)
                return
            # a declared child of an open closed account is added with that account
            self._account(phase, d_ms, kids,
                          deferred=declared and parent is not None and parent.closed)
            if phase is RESET_DONE:
                count = (span.attributes or {}).get(ATTR_RESET_COUNT)
                if count is not None:
                    self.engine.add(RESET_DONE_COUNT, float(count))  # type: ignore[arg-type]
            if declared:
                self._open_children.setdefault(parent_id, []).append((phase, d_ms))
                if len(self._open_children) > _MAX_OPEN_PARENTS:
                    _, orphans = self._open_children.popitem(last=False)
                    for kid, ms in orphans:  # the parent never ended here
                        owner = self.catalog.get(kid.parent) if kid.parent else None
                        if owner is not None and owner.closed:
                            self.engine.add(kid.key, ms)

    def _account(self, phase: Phase, d_ms: float, kids: list[tuple[Phase, float]] | None,
                 *, deferred: bool) -> None:
        """One ended SDK span of ``phase``: its key, and its gap or closed account."""
        if not deferred:
            self.engine.add(phase.key, d_ms)
        if phase.gap_key is None:
            return
        declared = [(k, ms) for k, ms in (kids or ()) if k.parent == phase.span]
        if phase.closed:
            out = self.catalog.layout(phase)[2].copy()
            for kid, ms in declared:
                out[kid.key] += ms
            out[phase.gap_key] = d_ms - sum(ms for _, ms in declared)
            for key, value in out.items():
                self.engine.add(key, value)
        else:
            self.engine.add(phase.gap_key, d_ms - sum(ms for _, ms in declared))

    def _derived_key(self, name: str) -> str:
        key = self._unregistered.get(name)
        if key is None:
            key = self._unregistered[name] = default_key(name)
            note_once("unregistered:" + name, "span %r is not a registered phase; aggregated "
                      "as %r (register it with resettrace.register_phase)", name, key)
        return key

    def unregistered_spans(self) -> dict[str, str]:
        """SDK span names seen that are not in the catalog, with the key they went under."""
        with self.engine.lock:
            return dict(self._unregistered)
