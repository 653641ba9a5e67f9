"""The in-process OTLP receivers, driven by the real SDK OTLP exporters (gRPC and HTTP)."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode

from resettrace.testing.receivers import (
    BlackholeListener,
    GrpcReceiver,
    HttpReceiver,
    ReceivedSpan,
    refused_endpoint,
)

T0 = 1_700_000_000_123_456_789
PARENT_ATTRS = {"i": 7, "s": "hello", "f": 1.5, "b": True}
CHILD_ATTRS = {"n": -3, "who": "child", "ratio": 0.25, "ok": False, "seq": (1, 2, 3)}


def _grpc_exporter(endpoint: str, compression: str | None = None, **kw) -> SpanExporter:
    comp = grpc.Compression.Gzip if compression == "gzip" else None
    return GrpcSpanExporter(endpoint=endpoint, insecure=True, compression=comp, **kw)


def _http_exporter(endpoint: str, compression: str | None = None, **kw) -> SpanExporter:
    comp = {
        None: HttpCompression.NoCompression,
        "gzip": HttpCompression.Gzip,
        "deflate": HttpCompression.Deflate,
    }[compression]
    return HttpSpanExporter(endpoint=endpoint, compression=comp, **kw)


def _emit_parent_child(exporter: SpanExporter) -> tuple[trace.SpanContext, trace.SpanContext]:
    """Parent + child with explicit times through a SimpleSpanProcessor; flushes, shuts down."""
    provider = TracerProvider(resource=Resource.create({"service.name": "rx-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        tracer = provider.get_tracer("rx-test-scope")
        parent = tracer.start_span("parent", start_time=T0, attributes=PARENT_ATTRS)
        child = tracer.start_span(
            "child",
            context=trace.set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            start_time=T0 + 1_000,
            attributes=CHILD_ATTRS,
        )
        child.set_status(Status(StatusCode.ERROR, "boom"))
        child.end(end_time=T0 + 251_000)
        parent.end(end_time=T0 + 1_000_007)
        assert provider.force_flush(5_000)
        return parent.get_span_context(), child.get_span_context()
    finally:
        provider.shutdown()


def _check_parent_child(spans: list[ReceivedSpan], parent_ctx, child_ctx) -> None:
    by_name = {s.name: s for s in spans}
    assert sorted(by_name) == ["child", "parent"] and len(spans) == 2
    parent, child = by_name["parent"], by_name["child"]

    assert parent.trace_id == child.trace_id == format(parent_ctx.trace_id, "032x")
    assert parent.span_id == format(parent_ctx.span_id, "016x")
    assert child.span_id == format(child_ctx.span_id, "016x")
    assert len(parent.trace_id) == 32 and len(parent.span_id) == 16
    assert parent.parent_span_id is None
    assert child.parent_span_id == parent.span_id

    assert (parent.start_ns, parent.end_ns) == (T0, T0 + 1_000_007)
    assert (child.start_ns, child.end_ns) == (T0 + 1_000, T0 + 251_000)
    assert child.duration_ns == 250_000

    assert parent.attributes == PARENT_ATTRS
    assert child.attributes == CHILD_ATTRS
    for key, typ in (("i", int), ("s", str), ("f", float), ("b", bool)):
        assert type(parent.attributes[key]) is typ

    assert parent.status_code == 0 and child.status_code == 2 and child.status_message == "boom"
    assert child.kind == 3  # SPAN_KIND_CLIENT; parent is INTERNAL (1)
    assert parent.kind == 1
    for s in spans:
        assert s.resource["service.name"] == "rx-test"
        assert s.resource["telemetry.sdk.language"] == "python"
        assert s.scope_name == "rx-test-scope"


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_grpc_receiver_round_trip(compression) -> None:
    with GrpcReceiver() as rx:
        assert rx.endpoint.startswith("http://127.0.0.1:") and rx.port > 0
        parent_ctx, child_ctx = _emit_parent_child(_grpc_exporter(rx.endpoint, compression))
        spans = rx.wait_for(2, timeout=5)
        _check_parent_child(spans, parent_ctx, child_ctx)
        assert rx.requests == 2  # SimpleSpanProcessor: one export per ended span
        assert rx.spans() == spans and rx.spans() is not rx.spans()


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_http_receiver_round_trip(compression) -> None:
    with HttpReceiver() as rx:
        assert rx.endpoint == f"http://127.0.0.1:{rx.port}/v1/traces"
        parent_ctx, child_ctx = _emit_parent_child(_http_exporter(rx.endpoint, compression))
        spans = rx.wait_for(2, timeout=5)
        _check_parent_child(spans, parent_ctx, child_ctx)
        assert rx.requests == 2


def _post(url: str, body: bytes, content_type: str) -> tuple[int, str, bytes]:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type"), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def test_http_receiver_status_codes() -> None:
    empty = trace_service_pb2.ExportTraceServiceRequest().SerializeToString()
    with HttpReceiver() as rx:
        code, ctype, body = _post(rx.endpoint, empty, "application/x-protobuf")
        assert (code, ctype) == (200, "application/x-protobuf")
        resp = trace_service_pb2.ExportTraceServiceResponse()
        resp.ParseFromString(body)
        assert resp == trace_service_pb2.ExportTraceServiceResponse()
        assert rx.requests == 1 and rx.spans() == []

        assert _post(rx.base_url + "/v1/metrics", empty, "application/x-protobuf")[0] == 404
        assert _post(rx.endpoint, b"{}", "application/json")[0] == 415
        assert _post(rx.endpoint, b"\xff\xff\xff", "application/x-protobuf")[0] == 400
        assert rx.requests == 1  # rejected requests are not counted


def test_wait_for_times_out_with_count_and_clear_resets() -> None:
    with GrpcReceiver() as rx:
        _emit_parent_child(_grpc_exporter(rx.endpoint))
        assert len(rx.wait_for(2, timeout=5)) == 2
        t = time.monotonic()
        with pytest.raises(AssertionError, match=r"expected at least 3 span\(s\).* got 2"):
            rx.wait_for(3, timeout=0.2)
        assert time.monotonic() - t > 0.15  # it waited for its timeout
        rx.clear()
        assert rx.spans() == [] and rx.requests == 0
        with pytest.raises(AssertionError, match="got 0"):
            rx.wait_for(1, timeout=0.05)


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_stop_closes_the_port(kind) -> None:
    rx = GrpcReceiver() if kind == "grpc" else HttpReceiver()
    with rx:
        port = rx.port
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert not rx.running
    with pytest.raises(RuntimeError):
        rx.endpoint  # noqa: B018
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def _one_finished_span() -> ReadableSpan:
    provider = TracerProvider(resource=Resource.create({"service.name": "rx-test"}))
    span = provider.get_tracer("rx-test-scope").start_span("lonely", start_time=T0)
    span.end(end_time=T0 + 10)
    assert isinstance(span, ReadableSpan)
    return span


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_slow_receiver_delays_the_answer(kind) -> None:
    rx = GrpcReceiver(delay_s=0.4) if kind == "grpc" else HttpReceiver(delay_s=0.4)
    with rx:
        make = _grpc_exporter if kind == "grpc" else _http_exporter
        exporter = make(rx.endpoint, timeout=5)
        try:
            t = time.monotonic()
            result = exporter.export([_one_finished_span()])
            elapsed = time.monotonic() - t
        finally:
            exporter.shutdown()
        assert result is SpanExportResult.SUCCESS
        # it waited for the receiver's answer (and, with SUCCESS, did not give up at the
        # exporter's 5 s timeout)
        assert elapsed > 0.35, elapsed
        assert [s.name for s in rx.spans()] == ["lonely"]


def _timed_export(exporter: SpanExporter) -> tuple[SpanExportResult, float]:
    span = _one_finished_span()
    try:
        t = time.monotonic()
        result = exporter.export([span])
        return result, time.monotonic() - t
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_blackhole_export_fails_within_timeout(kind) -> None:
    with BlackholeListener() as hole:
        if kind == "grpc":
            exporter = _grpc_exporter(hole.endpoint, timeout=1)
        else:
            exporter = _http_exporter(hole.http_endpoint, timeout=1)
        result, elapsed = _timed_export(exporter)
        print(f"blackhole {kind}: {result.name} after {elapsed:.2f}s")
        assert result is SpanExportResult.FAILURE
        assert 0.5 < elapsed < 8, elapsed  # it really waited on the silent peer, then gave up
        assert hole.connections >= 1  # TCP was accepted: a hang, not a refusal


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_refused_export_fails_fast(kind) -> None:
    if kind == "grpc":
        exporter = _grpc_exporter(refused_endpoint(), timeout=1)
    else:
        exporter = _http_exporter(refused_endpoint("/v1/traces"), timeout=1)
    result, elapsed = _timed_export(exporter)
    print(f"refused {kind}: {result.name} after {elapsed:.2f}s")
    assert result is SpanExportResult.FAILURE
    assert elapsed < 8, elapsed


def test_refused_endpoint_is_not_listening() -> None:
    url = refused_endpoint()
    assert url.startswith("http://127.0.0.1:")
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert refused_endpoint("/v1/traces").endswith("/v1/traces")
