"""Span exporters and the factory that turns ``RESETTRACE_EXPORTER`` specs into them.

``file:PATH``
    :class:`JsonLinesSpanExporter`: one JSON object per span and line with
    ``name``, ``trace_id``, ``span_id``, ``parent_id`` (hex, ``null`` for a root),
    ``start_ns``, ``end_ns`` (Unix epoch nanoseconds), ``status``, ``attributes`` and
    ``resource`` (service, host, pid and worker rank of the process).

File paths may hold ``{pid}`` and ``{rank}``; a file is written by one session only, which
holds it from its set-up to its end (another process given the same path meanwhile writes
``NAME.pPID.SUFFIX`` and says so at its set-up: :mod:`resettrace.tracing.export.parent`). Every path
opens by the rules of :mod:`resettrace.outputs`: a symbolic link or anything but a regular
file is refused (the exporter writes nothing and its spans count as not delivered), and an
existing file that is not a span file of the same format is left as it is, the spans going
to ``NAME.1.SUFFIX`` beside it.
``perfetto:PATH`` / ``otlp-json:PATH`` / ``jaeger-json:PATH``
    :mod:`resettrace.tracing.export.file_formats`: Chrome trace JSON, OTLP-JSON, Jaeger UI JSON.
``otlp``
    OpenTelemetry's OTLP exporter (gRPC or HTTP/protobuf) to a collector.
``memory``
    OpenTelemetry's ``InMemorySpanExporter`` (tests).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from resettrace import outputs
from resettrace.catalog import ATTR_WORKER_RANK
from resettrace.config import (
    ENV_OTLP_CERTIFICATE,
    ENV_OTLP_HTTP_CREDENTIAL_PROVIDER,
    Config,
    EndpointRefused,
    sdk_environ,
)
from resettrace.tracing.export.file_formats import (
    FileExporter,
    nothing_to_commit,
    record_span_attributes,
)
from resettrace.tracing.export.records import Slot, TextTemplates, Traces
from resettrace.tracing.layout import R_ERROR, R_PARENT, R_PHASE

log = logging.getLogger(__name__)

__all__ = ["JsonLinesSpanExporter", "span_to_dict", "make_exporter", "EndpointRefused"]


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    parent = span.parent
    resource = span.resource.attributes if span.resource is not None else {}
    return {
        "name": span.name,
        "trace_id": format(ctx.trace_id, "032x") if ctx else None,
        "span_id": format(ctx.span_id, "016x") if ctx else None,
        "parent_id": format(parent.span_id, "016x") if parent is not None else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "resource": {k: resource[k] for k in _RESOURCE_KEYS if k in resource},
    }


#: resource attributes written on every JSON line: which process a span came from
_RESOURCE_KEYS = ("service.name", "host.name", "process.pid", ATTR_WORKER_RANK)


class JsonLinesSpanExporter(FileExporter):
    """Spans as JSON lines, written in complete lines: a write that fails (a full disk)
    is counted as not delivered and truncated away, so the file always ends on a whole
    line. The file belongs to one process (see :func:`resettrace.outputs.open_output`)."""

    kind = outputs.SPANS_JSONL

    _templates: TextTemplates | None = None

    def _encode(self, spans: Sequence[ReadableSpan]) -> tuple[bytes, Callable[[], None]]:
        data = "".join(json.dumps(span_to_dict(s), separators=(",", ":"), default=str) + "\n"
                       for s in spans).encode()
        return data, nothing_to_commit

    def _encode_traces(self, batch: Sequence[Traces]) -> tuple[bytes, Callable[[], None]]:
        if self._templates is None:
            self._templates = TextTemplates(_jsonl_trace)
        text = "".join(text for _, _, text in self._templates.traces(batch))
        return text.encode(), nothing_to_commit


def _jsonl_trace(traces: Traces, rows: list[list[int]], counts: list[int], slot: Slot) -> str:
    """A trace's lines, as :func:`span_to_dict` gives them for its SDK spans."""
    src = traces.source
    resource = {k: src.resource[k] for k in _RESOURCE_KEYS if k in src.resource}
    lines = []
    for i in reversed(range(len(rows))):  # in the order SDK spans end: children first
        r = rows[i]
        d = {"name": src.span_name(r[R_PHASE]), "trace_id": slot.text("t"),
             "span_id": slot.text(f"s{i}"),
             "parent_id": slot.text(f"s{r[R_PARENT]}") if r[R_PARENT] >= 0 else None,
             "start_ns": slot.number(f"b{i}"), "end_ns": slot.number(f"e{i}"),
             "status": "ERROR" if r[R_ERROR] else "UNSET",
             "attributes": record_span_attributes(traces, r, counts[i], slot.number(f"c{i}")),
             "resource": resource}
        lines.append(json.dumps(d, separators=(",", ":"), default=str) + "\n")
    return "".join(lines)


def make_exporter(spec: str, config: Config | None = None, *, pid: int | None = None,
                  rank: int | None = None) -> SpanExporter:
    """An exporter from one ``RESETTRACE_EXPORTER`` item (already validated by Config).

    File paths may hold ``{pid}`` and ``{rank}``: ``pid`` (default this process) and
    ``rank`` (default the config's worker rank) fill them in.
    """
    kind, _, arg = spec.partition(":")
    pid = os.getpid() if pid is None else pid
    if rank is None:
        rank = config.worker_rank if config is not None else 0
    if arg:
        arg = outputs.expand_path(arg, pid=pid, rank=rank)
    if kind == "file":
        return JsonLinesSpanExporter(arg, pid=pid)
    if kind == "memory":
        return InMemorySpanExporter()
    if kind == "perfetto":
        from resettrace.tracing.export.file_formats import ChromeTraceSpanExporter

        return ChromeTraceSpanExporter(arg, pid=pid)
    if kind == "otlp-json":
        from resettrace.tracing.export.file_formats import OtlpJsonSpanExporter

        return OtlpJsonSpanExporter(arg, pid=pid)
    if kind == "jaeger-json":
        from resettrace.tracing.export.file_formats import JaegerJsonSpanExporter

        return JaegerJsonSpanExporter(arg, pid=pid)
    if kind == "otlp":
        return make_otlp_exporter(config if config is not None else Config())
    raise ValueError(f"unknown exporter {spec!r}")


def make_otlp_exporter(config: Config) -> SpanExporter:
    """The SDK's OTLP span exporter for ``config.otlp_protocol`` and ``config.endpoint``
    (made without the ``OTEL_*`` variables it would fail on: :func:`~resettrace.config.
    sdk_environ`)."""
    if config.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        with sdk_environ():
            return GrpcExporter(**otlp_arguments(config))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    with sdk_environ():
        return HttpExporter(**otlp_arguments(config))


def otlp_arguments(config: Config, *, timeout_s: float | None = None,
                   metrics: bool = False) -> dict[str, Any]:
    """The SDK OTLP exporter's arguments for ``config`` (trace or metrics exporter): the
    endpoint, TLS and compression resolved by resettrace, never left to the SDK's own
    reading of the environment (which would accept what the config refused). A trace
    endpoint the environment named unusably raises ``ValueError``: no other one is used."""
    if config.otlp_refused and not metrics:
        raise EndpointRefused(config.otlp_refused)
    timeout = config.otlp_timeout_s if timeout_s is None else timeout_s
    if config.otlp_protocol == "grpc":
        from grpc import Compression as GrpcCompression

        compression = {"none": GrpcCompression.NoCompression, "gzip": GrpcCompression.Gzip,
                       "deflate": GrpcCompression.Deflate}[config.otlp_compression]
        return {"endpoint": config.endpoint, "insecure": config.insecure,
                "timeout": timeout, "compression": compression}
    from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression

    http = {"none": HttpCompression.NoCompression, "gzip": HttpCompression.Gzip,
            "deflate": HttpCompression.Deflate}[config.otlp_compression]
    args: dict[str, Any] = {"endpoint": config.endpoint, "timeout": timeout,
                            "compression": http}
    signal = "METRICS" if metrics else "TRACES"
    if (os.environ.get(ENV_OTLP_CERTIFICATE.format(signal=f"{signal}_"))
            or os.environ.get(ENV_OTLP_CERTIFICATE.format(signal=""))) and not os.environ.get(
            ENV_OTLP_HTTP_CREDENTIAL_PROVIDER.format(signal=signal)):
        args["session"] = _certificate_session()
    return args


def _certificate_session() -> Any:
    """A ``requests`` session in which the certificate the exporter is given wins over
    ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` (plain ``requests`` lets those replace
    it, and an OTLP/HTTP collector with a private CA then fails verification)."""
    import requests

    class _Session(requests.Session):
        def merge_environment_settings(self, url: Any, proxies: Any, stream: Any,
                                       verify: Any, cert: Any) -> Any:
            merged = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if verify is None and self.verify not in (True, None):
                merged["verify"] = self.verify
            return merged

    return _Session()
