"""Span exporters and the factory that turns ``RESETTRACE_EXPORTER`` specs into them.

``file:PATH``
    :class:`JsonLinesSpanExporter`: one JSON object per span and line with
    ``name``, ``trace_id``, ``span_id``, ``parent_id`` (hex, ``null`` for a root),
    ``start_ns``, ``end_ns`` (Unix epoch nanoseconds), ``status`` and ``attributes``.
``perfetto:PATH`` / ``otlp-json:PATH``
    :mod:`resettrace.tracing.file_formats`: Chrome trace JSON, OTLP-JSON.
``otlp``
    OpenTelemetry's OTLP exporter (gRPC or HTTP/protobuf) to a collector.
``memory``
    OpenTelemetry's ``InMemorySpanExporter`` (tests).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from resettrace.config import Config

log = logging.getLogger(__name__)

__all__ = ["JsonLinesSpanExporter", "span_to_dict", "make_exporter"]


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": format(ctx.trace_id, "032x") if ctx else None,
        "span_id": format(ctx.span_id, "016x") if ctx else None,
        "parent_id": format(parent.span_id, "016x") if parent is not None else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends spans to a file as JSON lines; the file is created on first export."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.exported_spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        try:
            lines = "".join(json.dumps(span_to_dict(s), separators=(",", ":")) + "\n"
                            for s in spans)
            with self._lock:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = self.path.open("w", encoding="utf-8")
                self._file.write(lines)
                self.exported_spans += len(spans)
        except OSError as e:
            log.error("resettrace: cannot write spans to %s: %s", self.path, e)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if self._file is not None:
                self._file.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None


def make_exporter(spec: str, config: Config | None = None) -> SpanExporter:
    """An exporter from one ``RESETTRACE_EXPORTER`` item (already validated by Config)."""
    kind, _, arg = spec.partition(":")
    if kind == "file":
        return JsonLinesSpanExporter(arg)
    if kind == "memory":
        return InMemorySpanExporter()
    if kind == "perfetto":
        from resettrace.tracing.file_formats import ChromeTraceSpanExporter

        return ChromeTraceSpanExporter(arg)
    if kind == "otlp-json":
        from resettrace.tracing.file_formats import OtlpJsonSpanExporter

        return OtlpJsonSpanExporter(arg)
    if kind == "otlp":
        return make_otlp_exporter(config if config is not None else Config())
    raise ValueError(f"unknown exporter {spec!r}")


def make_otlp_exporter(config: Config) -> SpanExporter:
    """The SDK's OTLP span exporter for ``config.otlp_protocol`` and ``config.endpoint``."""
    if config.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=config.endpoint, insecure=config.endpoint.startswith(
            "http://"), timeout=config.otlp_timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=config.endpoint, timeout=config.otlp_timeout_s)
