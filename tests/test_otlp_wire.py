"""The export process's OTLP encoder: the same request, field for field, as the SDK's."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from resettrace.catalog import ATTR_EXPORT_DROPPED, INSTRUMENTATION_SCOPE
from resettrace.tracing.export.otlp_wire import WireEncoder
from resettrace.tracing.layout import RECORD_FIELDS
from resettrace.tracing.spans import build_spans

RECORDS = [  # env_step > physics, reset_done(k=3) > dr_reset > set_state (error) > mask
    [0, -1, 1_000, 90_000, -1, 0],
    [2, 0, 1_100, 40_000, -1, 0],
    [4, 0, 41_000, 89_000, 3, 0],
    [9, 2, 42_000, 88_000, -1, 0],
    [12, 3, 43_000, 80_000, -1, 1],
    [13, 4, 44_000, 45_500, -1, 0],
]
ATTRS = {"resettrace.backend.name": "mujoco", "resettrace.env.count": 1024,
         "resettrace.task.name": "g1_walk_flat", "mylab.ratio": 0.25, "mylab.flag": True,
         "mylab.neg": -7}
OFFSET = 1_700_000_000 * 10**9
RESOURCE = {"service.name": "resettrace", "process.pid": 42, "resettrace.worker.rank": 3}


def _name(i: int) -> str:
    return f"phase.{i}"


def _error(code: int) -> str:
    return "ValueError"


def _sdk_request() -> ExportTraceServiceRequest:
    class Keep(SpanProcessor):
        spans: list[Any] = []

        def on_end(self, span: Any) -> None:
            self.spans.append(span)

    keep = Keep()
    provider = TracerProvider(resource=Resource(RESOURCE))
    provider.add_span_processor(keep)
    tracer = provider.get_tracer(INSTRUMENTATION_SCOPE)
    build_spans(tracer, RECORDS, ATTRS, OFFSET, _error, _name, {ATTR_EXPORT_DROPPED: 5})
    return encode_spans(keep.spans)


def _add_trace(enc: WireEncoder, rid: int, root_attrs: dict[str, Any]) -> None:
    """Encode RECORDS as one trace, as the export process encodes a batch of them."""
    a = np.asarray(RECORDS, dtype=np.int64).reshape(-1, RECORD_FIELDS)
    enc.add_traces(rid, OFFSET, root_attrs, a, [len(a)])


def _wire_request(max_spans: int = 512) -> tuple[ExportTraceServiceRequest, int]:
    enc = WireEncoder(RESOURCE, _name, _error)
    enc.set_attributes(7, ATTRS)
    _add_trace(enc, 7, {ATTR_EXPORT_DROPPED: 5})
    payload = enc.take(max_spans)
    assert payload is not None
    return ExportTraceServiceRequest.FromString(payload.data), payload.count


def _spans_of(spans: Any) -> dict[str, Any]:
    """Spans by name, parents by name, ids and SDK-only flags left out."""
    names = {s.span_id: s.name for s in spans}
    out = {}
    for s in spans:
        d = MessageToDict(s)
        for k in ("traceId", "spanId", "parentSpanId", "flags"):
            d.pop(k, None)
        d["attributes"] = sorted(d.get("attributes", []), key=lambda a: a["key"])
        d["parent"] = names.get(s.parent_span_id)
        out[s.name] = d
    return out


def _comparable(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """The request's resource, scope and spans (see ``_spans_of``)."""
    (rs,) = request.resource_spans
    (ss,) = rs.scope_spans
    spans = _spans_of(ss.spans)
    assert len({s.trace_id for s in ss.spans}) == 1
    resource = sorted(MessageToDict(rs.resource)["attributes"], key=lambda a: a["key"])
    return {"resource": resource, "scope": ss.scope.name, "spans": spans}


def test_the_wire_request_decodes_to_what_the_sdk_sends() -> None:
    wire, count = _wire_request()
    assert count == len(RECORDS)
    assert _comparable(wire) == _comparable(_sdk_request())


def test_requests_hold_whole_traces() -> None:
    enc = WireEncoder(RESOURCE, _name, _error)
    for _ in range(5):
        _add_trace(enc, 0, {})
    sizes = []
    while (p := enc.take(13)) is not None:
        req = ExportTraceServiceRequest.FromString(p.data)
        spans = req.resource_spans[0].scope_spans[0].spans
        assert len(spans) == p.count and len({s.trace_id for s in spans}) == p.count // 6
        sizes.append(p.count)
    assert sizes == [12, 12, 6]
    big = WireEncoder(RESOURCE, _name, _error)
    _add_trace(big, 0, {})
    p = big.take(4)  # a trace larger than the cap goes whole
    assert p is not None and p.count == 6 and big.take(4) is None


def test_traces_encoded_together_match_the_sdk_one_by_one() -> None:
    """Many traces in one call, of several shapes and reset counts of every varint
    length: each decodes to what the SDK sends for it alone, with ids of its own."""
    counts = [0, 3, 127, 128, 300, 16_383, 16_384, 70_000, 2**40, 3]
    variants = []
    for i, k in enumerate(counts):
        records = [list(r) for r in RECORDS]
        records[2][4] = k
        for r in records:
            r[2] += 1_000_000 * i  # times of its own
            r[3] += 1_000_000 * i
        variants.append(records if i % 3 else records[:2])  # two shapes, interleaved
    enc = WireEncoder(RESOURCE, _name, _error)
    enc.set_attributes(7, ATTRS)
    enc.add_traces(7, OFFSET, {ATTR_EXPORT_DROPPED: 5},
                   np.array([r for v in variants for r in v], dtype=np.int64),
                   [len(v) for v in variants])
    payload = enc.take(10_000)
    assert payload is not None and enc.take(10_000) is None
    spans = ExportTraceServiceRequest.FromString(payload.data).resource_spans[0] \
        .scope_spans[0].spans
    assert payload.count == len(spans) == sum(map(len, variants))
    assert len({s.span_id for s in spans}) == len(spans)
    by_trace: dict[bytes, list[Any]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    assert len(by_trace) == len(variants)
    def canon(d: dict[str, Any]) -> str:
        return json.dumps(d, sort_keys=True)

    got = sorted(canon(_spans_of(t)) for t in by_trace.values())

    def sdk(records: list[list[int]]) -> dict[str, Any]:
        class Keep(SpanProcessor):
            def __init__(self) -> None:
                self.spans: list[Any] = []

            def on_end(self, span: Any) -> None:
                self.spans.append(span)

        keep = Keep()
        provider = TracerProvider(resource=Resource(RESOURCE))
        provider.add_span_processor(keep)
        build_spans(provider.get_tracer(INSTRUMENTATION_SCOPE), records, ATTRS, OFFSET,
                    _error, _name, {ATTR_EXPORT_DROPPED: 5})
        req = encode_spans(keep.spans)
        return _spans_of(req.resource_spans[0].scope_spans[0].spans)

    assert got == sorted(canon(sdk(v)) for v in variants)
