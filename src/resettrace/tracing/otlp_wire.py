"""OTLP protobuf encoded straight from recorder records, for the span export process.

Building an SDK span and then encoding it costs the export process about 90 us of CPU
per span; writing the protobuf wire format of ``ExportTraceServiceRequest`` from the
packed records costs a few. :class:`WireEncoder` does the latter: every byte string
that repeats (a phase's name field, a recorder's attributes, the resource, a reset
count) is encoded once and reused, so a span is one ``bytes.join`` of its ids, times
and those pieces. The result decodes, field for field, to what the SDK exporter sends
for the same spans (a test checks it with the official protobuf classes).

:func:`make_wire_exporter` gives the SDK's OTLP exporter (gRPC or HTTP) a way to send
such a request as it is, with its own transport, retries, headers and timeout; it
returns ``None`` when the installed SDK does not have the internals this needs, and the
export process then builds SDK spans as before.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from resettrace.catalog import ATTR_RESET_COUNT, INSTRUMENTATION_SCOPE

__all__ = ["WireEncoder", "Payload", "make_wire_exporter"]

_Q = struct.Struct("<Q")
_SPAN_KIND_INTERNAL = b"\x30\x01"  # field 6 (kind), varint 1
_STATUS_ERROR_CODE = b"\x18\x02"  # Status field 3 (code), varint 2 = ERROR
_STATUS_UNSET = b"\x7a\x00"  # an empty Status (field 15), as the SDK sends


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings, bytes, messages)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    if isinstance(value, bool):
        return _varint(2 << 3) + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return _varint(3 << 3) + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return _varint(4 << 3 | 1) + struct.pack("<d", value)
    return _field(1, str(value).encode())


def key_value(key: str, value: Any) -> bytes:
    """One encoded ``KeyValue`` attribute, as a repeated field of tag 9 (Span.attributes)
    or 1 (Resource.attributes): the caller adds the field tag."""
    return _field(1, key.encode()) + _field(2, _any_value(value))


def _attributes(number: int, attrs: Mapping[str, Any]) -> bytes:
    return b"".join(_field(number, key_value(k, v)) for k, v in attrs.items())


class Payload:
    """An encoded request and the number of spans in it."""

    __slots__ = ("data", "count")

    def __init__(self, data: bytes, count: int) -> None:
        self.data = data
        self.count = count


class WireEncoder:
    """Encodes recorder traces as OTLP spans; :meth:`take` cuts them into requests."""

    def __init__(self, resource: Mapping[str, Any], span_name: Callable[[int], str],
                 error_name: Callable[[int], str]) -> None:
        self._resource = _field(1, _attributes(1, resource))  # ResourceSpans.resource
        self._scope = _field(1, _field(1, INSTRUMENTATION_SCOPE.encode()))  # ScopeSpans.scope
        self._span_name = span_name
        self._error_name = error_name
        self._names: dict[int, bytes] = {}
        self._counts: dict[int, bytes] = {}
        self._attrs: dict[int, bytes] = {}
        self._rng = random.Random()
        self._spans: list[bytes] = []  # each a ScopeSpans.spans field
        self._trace_ends: list[int] = []  # span counts at the end of each trace

    def set_attributes(self, rid: int, attrs: Mapping[str, Any]) -> None:
        """The span attributes of recorder ``rid`` (sent again when they change)."""
        self._attrs[rid] = _attributes(9, attrs)

    @property
    def pending(self) -> int:
        return len(self._spans)

    def add_trace(self, rid: int, records: Sequence[Sequence[int]], offset: int,
                  root_attrs: Mapping[str, Any]) -> None:
        """Encode one trace (records as the recorder made them, clocks + ``offset``)."""
        getrandbits = self._rng.getrandbits
        trace_id = _field(1, getrandbits(128).to_bytes(16, "big"))
        span_ids = [getrandbits(64).to_bytes(8, "big") for _ in records]
        attrs = self._attrs.get(rid, b"")
        root = _attributes(9, root_attrs)
        names, count_fields = self._names, self._counts
        counts: list[int] = []
        spans = self._spans
        pack = _Q.pack
        for i, r in enumerate(records):
            phase, parent, start, end, count, error = r
            if count < 0 and parent >= 0:
                count = counts[parent]
            counts.append(count)
            name = names.get(phase)
            if name is None:
                name = names[phase] = _field(5, self._span_name(phase).encode())
            parts = [trace_id, b"\x12\x08", span_ids[i]]
            if parent >= 0:
                parts += (b"\x22\x08", span_ids[parent])
            parts += (name, _SPAN_KIND_INTERNAL, b"\x39", pack(start + offset), b"\x41",
                      pack(end + offset), attrs)
            if count >= 0:
                c = count_fields.get(count)
                if c is None:
                    c = count_fields[count] = _field(9, key_value(ATTR_RESET_COUNT, count))
                parts.append(c)
            if parent < 0:
                parts.append(root)
            if error:
                parts.append(_field(15, _field(2, self._error_name(error).encode())
                                    + _STATUS_ERROR_CODE))
            else:
                parts.append(_STATUS_UNSET)
            body = b"".join(parts)
            spans.append(b"\x12" + _varint(len(body)) + body)
        self._trace_ends.append(len(spans))

    def take(self, max_spans: int) -> Payload | None:
        """The next request: whole traces up to ``max_spans`` spans (one trace if larger)."""
        if not self._spans:
            return None
        ends = self._trace_ends
        n = ends[0]
        for e in ends:
            if e > max_spans:
                break
            n = e
        batch, self._spans = self._spans[:n], self._spans[n:]
        self._trace_ends = [e - n for e in ends if e > n]
        scope_spans = _field(2, self._scope + b"".join(batch))  # ResourceSpans.scope_spans
        request = _field(1, self._resource + scope_spans)  # Request.resource_spans
        return Payload(request, n)


def make_wire_exporter(config: Any) -> Any:
    """The SDK OTLP exporter for ``config``, able to send a :class:`Payload` through its
    ``export_payload``; ``None`` when the installed SDK lacks the internals it needs."""
    try:
        if config.otlp_protocol == "grpc":
            return _grpc_exporter(config)
        return _http_exporter(config)
    except (ImportError, AttributeError, TypeError):
        return None


def _grpc_exporter(config: Any) -> Any:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    if not (hasattr(OTLPSpanExporter, "_translate_data")
            and hasattr(OTLPSpanExporter, "_count_data") and hasattr(OTLPSpanExporter,
                                                                       "_export")):
        return None

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    passthrough = hasattr(OTLPSpanExporter, "_initialize_channel_and_stub")

    class _RawStub:
        """The TraceService stub, taking requests already encoded as they are."""

        def __init__(self, channel: Any) -> None:
            self.Export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=lambda r: r if isinstance(r, bytes) else
                r.SerializeToString(),
                response_deserializer=ExportTraceServiceResponse.FromString)

    class WireGrpcExporter(OTLPSpanExporter):
        def _initialize_channel_and_stub(self) -> None:
            super()._initialize_channel_and_stub()
            self._client = _RawStub(self._channel)  # type: ignore[assignment]

        def _translate_data(self, data: Any) -> Any:
            if isinstance(data, Payload):  # bytes go out as they are (else parsed first)
                return data.data if passthrough else \
                    ExportTraceServiceRequest.FromString(data.data)
            return super()._translate_data(data)

        def _count_data(self, data: Any) -> int:
            return data.count if isinstance(data, Payload) else super()._count_data(data)

        def export_payload(self, payload: Payload) -> Any:
            return self._export(payload)  # type: ignore[arg-type]

    return WireGrpcExporter(endpoint=config.endpoint,
                            insecure=config.endpoint.startswith("http://"),
                            timeout=config.otlp_timeout_s)


def _http_exporter(config: Any) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=config.endpoint, timeout=config.otlp_timeout_s)
    client = getattr(exporter, "_client", None)
    if client is None or not hasattr(client, "export"):
        return None

    def export_payload(payload: Payload) -> Any:
        if getattr(exporter, "_shutdown", False):
            return SpanExportResult.FAILURE
        result = client.export(payload.data)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE

    exporter.export_payload = export_payload  # type: ignore[attr-defined]
    return exporter
