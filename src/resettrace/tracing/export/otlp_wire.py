"""OTLP protobuf encoded straight from recorder records, for the span export process.

Building an SDK span and then encoding it costs the export process tens of times what
writing the protobuf wire format of ``ExportTraceServiceRequest`` from the packed records
costs (``resettrace bench export``; figures in docs/benchmarks.md). :class:`WireEncoder`
does the latter: every byte string that repeats (a phase's name field, a recorder's
attributes, the resource, a reset count) is encoded once and reused, so a span is one
``bytes.join`` of its ids, times and those pieces. The result decodes, field for field,
to what the SDK exporter sends for the same spans (a test checks it with the official
protobuf classes).

:func:`make_wire_exporter` gives the SDK's OTLP exporter (gRPC or HTTP) a way to send
such a request as it is, with its own transport, retries, headers and timeout; it
returns ``None`` when the installed SDK does not have the internals this needs, and the
export process then builds SDK spans as before.
"""

from __future__ import annotations

import random
import struct
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from resettrace.catalog import ATTR_RESET_COUNT, INSTRUMENTATION_SCOPE
from resettrace.tracing.export.records import Traces
from resettrace.tracing.layout import (
    R_COUNT,
    R_END,
    R_ERROR,
    R_PARENT,
    R_PHASE,
    R_START,
    RECORD_FIELDS,
)

__all__ = ["WireEncoder", "Payload", "make_wire_exporter"]

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


_U64 = np.dtype("<u8")  # fixed64 and ids, little-endian on every machine
#: a count below _VARINT_LIMITS[i] takes i bytes as a varint (0: no count, none sent)
assert R_END == R_START + 1  # a span's times are one slice of its record
_VARINT_LIMITS = np.array([0] + [1 << (7 * i) for i in range(1, 9)], dtype=np.int64)
_MAX_SHAPES = 512  # trace shapes kept; beyond that the cache starts again


def _value(body: bytearray, slots: list[tuple[int, int]], tag: bytes, index: int) -> None:
    """A field of 8 bytes (an id or a time) whose value each trace writes in."""
    body.extend(tag)
    slots.append((len(body), index))
    body.extend(bytes(8))


class _Shape:
    """The encoding of every trace of one shape: the same phases under the same parents,
    with the same errors and reset counts of the same varint lengths.

    ``template`` is the trace's spans with zeros where the values of one trace go.
    ``pos8`` are the byte positions of its 8-byte values, filled from ``values[src]``,
    where ``values`` is the trace id halves, the span ids, then each record's start and
    end; ``cpos`` those of the reset-count varints: the count of record ``crow``, shifted
    right by ``cshift``, low 7 bits, or'ed with ``ccont`` (the continuation bit).
    """

    __slots__ = ("template", "pos8", "src", "cpos", "crow", "cshift", "ccont")

    def __init__(self, enc: WireEncoder, rid: Any, records: np.ndarray, lengths: np.ndarray,
                 root_attrs: bytes) -> None:
        n = len(records)
        attrs = enc._attrs.get(rid, b"")
        count_key = _field(1, ATTR_RESET_COUNT.encode())
        out = bytearray()
        pos8: list[int] = []
        src: list[int] = []
        cpos: list[int] = []
        crow: list[int] = []
        cshift: list[int] = []
        ccont: list[int] = []
        count_row = list(range(n))  # the record whose count a span carries
        for i in range(n):
            rec = records[i]
            phase, parent = int(rec[R_PHASE]), int(rec[R_PARENT])
            count, error = int(rec[R_COUNT]), int(rec[R_ERROR])
            if count < 0 and parent >= 0:
                count_row[i] = count_row[parent]  # no count of its own: its parent's
            length = int(lengths[count_row[i]])
            name = enc._names.get(phase)
            if name is None:
                name = enc._names[phase] = _field(5, enc._span_name(phase).encode())
            body = bytearray()
            slots: list[tuple[int, int]] = []  # (offset in body, index into values)
            body.extend(b"\x0a\x10")  # trace_id: two values
            slots += [(2, 0), (10, 1)]
            body.extend(bytes(16))
            _value(body, slots, b"\x12\x08", 2 + i)
            if parent >= 0:
                _value(body, slots, b"\x22\x08", 2 + parent)
            body.extend(name + _SPAN_KIND_INTERNAL)
            _value(body, slots, b"\x39", 2 + n + 2 * i)
            _value(body, slots, b"\x41", 3 + n + 2 * i)
            body.extend(attrs)
            varint_at = -1
            if length:  # KeyValue{key, AnyValue{int_value: varint of `length` bytes}}
                any_value = b"\x18" + bytes(length)
                kv = count_key + b"\x12" + _varint(len(any_value)) + any_value
                body.extend(b"\x4a" + _varint(len(kv)))
                varint_at = len(body) + len(kv) - length
                body.extend(kv)
            if parent < 0:
                body.extend(root_attrs)
            if error:
                body.extend(_field(15, _field(2, enc._error_name(error).encode())
                                   + _STATUS_ERROR_CODE))
            else:
                body.extend(_STATUS_UNSET)
            head = b"\x12" + _varint(len(body))
            at = len(out) + len(head)
            for offset, index in slots:
                pos8.append(at + offset)
                src.append(index)
            for b in range(length):
                cpos.append(at + varint_at + b)
                crow.append(count_row[i])
                cshift.append(7 * b)
                ccont.append(0x80 if b < length - 1 else 0)
            out += head + body
        self.template = np.frombuffer(bytes(out), dtype=np.uint8)
        self.pos8 = (np.array(pos8, dtype=np.intp)[:, None] + np.arange(8)).ravel()
        self.src = np.array(src, dtype=np.intp)
        self.cpos = np.array(cpos, dtype=np.intp)
        self.crow = np.array(crow, dtype=np.intp)
        self.cshift = np.array(cshift, dtype=np.int64)
        self.ccont = np.array(ccont, dtype=np.int64)


class WireEncoder:
    """Encodes recorder traces as OTLP spans; :meth:`take` cuts them into requests.

    Traces repeat a few shapes (the same phases under the same parents), so each shape is
    encoded once, as a template; the traces of one shape are then encoded together by a
    handful of array operations that write their ids, times and reset counts into copies
    of the template.
    """

    def __init__(self, resource: Mapping[str, Any], span_name: Callable[[int], str],
                 error_name: Callable[[int], str]) -> None:
        self._resource = _field(1, _attributes(1, resource))  # ResourceSpans.resource
        self._scope = _field(1, _field(1, INSTRUMENTATION_SCOPE.encode()))  # ScopeSpans.scope
        self._span_name = span_name
        self._error_name = error_name
        self._names: dict[int, bytes] = {}
        self._attrs: dict[Any, bytes] = {}
        self._shapes: dict[tuple[Any, ...], _Shape] = {}
        self._rand = random.Random().getrandbits
        self._traces: deque[tuple[bytes, int]] = deque()  # (encoded spans, span count)
        self._pending = 0

    def set_attributes(self, rid: Any, attrs: Mapping[str, Any]) -> None:
        """The span attributes of recorder ``rid`` (sent again when they change)."""
        self._attrs[rid] = _attributes(9, attrs)
        self._shapes.clear()

    @property
    def pending(self) -> int:
        return self._pending

    def add_record_traces(self, traces: Traces) -> None:
        """Encode :class:`~resettrace.tracing.export.records.Traces` with the ids they
        were given (the same spans in every format the export process writes)."""
        key = traces.attrs_key
        if key not in self._attrs:
            self.set_attributes(key, traces.attrs)
        halves = b"".join(t.to_bytes(16, "big") for t in traces.trace_ids)
        trace_words = np.frombuffer(halves, dtype=_U64).reshape(-1, 2)
        sizes = np.diff(np.asarray(traces.starts)).tolist()
        self.add_traces(key, 0, traces.root_attrs, traces.records, sizes,
                        ids=(trace_words, traces.span_ids.byteswap()))

    def add_traces(self, rid: Any, offset: int, root_attrs: Mapping[str, Any],
                   records: np.ndarray, sizes: Sequence[int],
                   ids: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Encode traces of recorder ``rid`` with the same root attributes: ``records``
        (int64, ``(sum(sizes), RECORD_FIELDS)``) holds them one after another, ``sizes``
        their record counts. The traces of one shape are encoded in one pass. ``ids``:
        the words of each trace's id (``(traces, 2)``) and of each record's span id, as
        written (little-endian words of the big-endian ids); else drawn here."""
        lengths = np.searchsorted(_VARINT_LIMITS, records[:, R_COUNT], side="right")
        structure = np.concatenate((records[:, (R_PHASE, R_PARENT, R_ERROR)],
                                    lengths[:, None]), axis=1)
        groups: dict[bytes, list[int]] = {}
        trace_of: dict[int, int] = {}  # first record -> trace index
        at = 0
        for t, n in enumerate(sizes):
            if n:
                groups.setdefault(structure[at:at + n].tobytes(), []).append(at)
                trace_of[at] = t
            at += n
        root = tuple(root_attrs.items())
        for key_bytes, starts in groups.items():
            n = len(key_bytes) // (4 * 8)
            key = (rid, root, key_bytes)
            shape = self._shapes.get(key)
            first = starts[0]
            if shape is None:
                if len(self._shapes) >= _MAX_SHAPES:
                    self._shapes.clear()
                shape = self._shapes[key] = _Shape(
                    self, rid, records[first:first + n], lengths[first:first + n],
                    _attributes(9, root_attrs))
            k = len(starts)
            recs = records[first:first + n][None] if k == 1 else records[
                (np.array(starts)[:, None] + np.arange(n)).ravel()].reshape(k, n, RECORD_FIELDS)
            if ids is None:
                words = k * (2 + n)
                group_ids = np.frombuffer(self._rand(64 * words).to_bytes(8 * words, "little"),
                                          dtype=_U64).reshape(k, 2 + n)
            else:
                rows = (np.array(starts)[:, None] + np.arange(n)).ravel()
                group_ids = np.concatenate(
                    (ids[0][[trace_of[a] for a in starts]], ids[1][rows].reshape(k, n)),
                    axis=1)
            times = (recs[:, :, R_START:R_END + 1] + offset).astype(_U64).reshape(k, 2 * n)
            size = len(shape.template)
            out = np.empty((k, size), dtype=np.uint8)
            out[:] = shape.template
            values = np.concatenate((group_ids, times), axis=1)
            out[:, shape.pos8] = np.ascontiguousarray(values[:, shape.src]).view(np.uint8)
            if len(shape.cpos):
                out[:, shape.cpos] = (recs[:, shape.crow, R_COUNT] >> shape.cshift) & 0x7F \
                    | shape.ccont
            blob = out.tobytes()
            self._traces.extend((blob[i * size:(i + 1) * size], n) for i in range(k))
            self._pending += k * n

    def take(self, max_spans: int) -> Payload | None:
        """The next request: whole traces up to ``max_spans`` spans (one trace if larger)."""
        traces = self._traces
        if not traces:
            return None
        data, n = traces.popleft()
        parts = [data]
        while traces and n + traces[0][1] <= max_spans:
            data, k = traces.popleft()
            parts.append(data)
            n += k
        self._pending -= n
        scope_spans = _field(2, self._scope + b"".join(parts))  # ResourceSpans.scope_spans
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

    import grpc

    class _RawStub:
        """The TraceService stub, taking requests already encoded as they are; it marks
        ``owner.timed_out`` when an attempt ran out of time (sent, not acknowledged)."""

        def __init__(self, channel: Any, owner: Any) -> None:
            self._export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=lambda r: r if isinstance(r, bytes) else
                r.SerializeToString(),
                response_deserializer=ExportTraceServiceResponse.FromString)
            self._owner = owner

        def Export(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (the gRPC name)
            try:
                return self._export(*args, **kwargs)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    self._owner.timed_out = True
                raise

    class WireGrpcExporter(OTLPSpanExporter):
        timed_out = False  # the last export_payload: an attempt timed out

        def _initialize_channel_and_stub(self) -> None:
            super()._initialize_channel_and_stub()
            self._client = _RawStub(self._channel, self)  # type: ignore[assignment]

        def _translate_data(self, data: Any) -> Any:
            if isinstance(data, Payload):  # bytes go out as they are (else parsed first)
                return data.data if passthrough else \
                    ExportTraceServiceRequest.FromString(data.data)
            return super()._translate_data(data)

        def _count_data(self, data: Any) -> int:
            return data.count if isinstance(data, Payload) else super()._count_data(data)

        def export_payload(self, payload: Payload) -> Any:
            self.timed_out = False
            return self._export(payload)  # type: ignore[arg-type]

    from resettrace.config import sdk_environ
    from resettrace.tracing.export.exporters import otlp_arguments

    with sdk_environ():
        return WireGrpcExporter(**otlp_arguments(config))


def _http_exporter(config: Any) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    from resettrace.config import sdk_environ
    from resettrace.tracing.export.exporters import otlp_arguments

    with sdk_environ():
        exporter = OTLPSpanExporter(**otlp_arguments(config))
    client = getattr(exporter, "_client", None)
    if client is None or not hasattr(client, "export"):
        return None

    def export_payload(payload: Payload) -> Any:
        exporter.timed_out = False  # type: ignore[attr-defined]
        if getattr(exporter, "_shutdown", False):
            return SpanExportResult.FAILURE
        result = client.export(payload.data)
        if result.success:
            return SpanExportResult.SUCCESS
        # sent and no response in time (a connect timeout never reached the receiver)
        name = type(getattr(result, "error", None)).__name__
        exporter.timed_out = "Timeout" in name and "Connect" not in name  # type: ignore[attr-defined]
        return SpanExportResult.FAILURE

    exporter.export_payload = export_payload  # type: ignore[attr-defined]
    return exporter
