"""Records as OpenTelemetry SDK spans: one span per record, with its exact times, its
parent, its reset count and its error; the in-process materializer
(:mod:`resettrace.tracing.materializer`) and the export process
(:mod:`resettrace.tracing.export`) both build spans with :func:`build_spans`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from resettrace.catalog import ATTR_RESET_COUNT
from resettrace.tracing.layout import R_COUNT, R_END, R_ERROR, R_PARENT, R_PHASE, R_START
from resettrace.tracing.recorder import Record

__all__ = ["build_spans"]


def build_spans(tracer: Any, records: Sequence[Record], attrs: Mapping[str, Any], offset: int,
                error_names: Callable[[int], str], span_names: Callable[[int], str],
                root_attrs: Mapping[str, Any] | None = None) -> None:
    """Start and end one SDK span per record, with exact times and parent links.

    ``offset`` turns record clocks into Unix epoch ns; ``span_names`` maps a record's
    phase index to its span name; ``root_attrs`` go on the trace's root span only.
    """
    spans: list[Any] = []
    counts: list[int] = []
    root_ctx = otel_context.Context()
    for r in records:
        parent = r[R_PARENT]
        count = r[R_COUNT]
        if count < 0 and parent >= 0:
            count = counts[parent]
        counts.append(count)
        ctx = root_ctx if parent < 0 else trace.set_span_in_context(spans[parent], root_ctx)
        span_attrs = dict(attrs)
        if count >= 0:
            span_attrs[ATTR_RESET_COUNT] = count
        if parent < 0 and root_attrs:
            span_attrs.update(root_attrs)
        span = tracer.start_span(span_names(r[R_PHASE]), context=ctx,
                                 start_time=r[R_START] + offset, attributes=span_attrs)
        if r[R_ERROR]:
            span.set_status(Status(StatusCode.ERROR, error_names(r[R_ERROR])))
        spans.append(span)
    for r, span in zip(reversed(records), reversed(spans), strict=True):
        span.end(end_time=r[R_END] + offset)  # children end before their parents
