"""File exporters for trace viewers: Chrome trace JSON (Perfetto) and OTLP-JSON (Jaeger)."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import PROCESS_PID, SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from resettrace import catalog as C
from resettrace.tracing.export.exporters import make_exporter
from resettrace.tracing.export.file_formats import (
    ChromeTraceSpanExporter,
    OtlpJsonSpanExporter,
)

SERVICE = "ff-test"
PID = 4242
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def _provider(exporter: Any, resource: Resource | None = None) -> TracerProvider:
    if resource is None:
        resource = Resource.create({SERVICE_NAME: SERVICE, PROCESS_PID: PID})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _trace(provider: TracerProvider, t0: int, resets: int = 3) -> tuple[Any, Any]:
    """A set_state span with one forward-kinematics child, at explicit ns times after t0."""
    tracer = provider.get_tracer(C.INSTRUMENTATION_SCOPE)
    attrs = {C.ATTR_RESET_COUNT: resets, C.ATTR_BACKEND: "mujoco"}
    parent = tracer.start_span(C.SET_STATE.span, start_time=t0 + 1_000,
                               attributes={**attrs, "test.ratio": 0.25})
    child = tracer.start_span(C.SET_STATE_FORWARD_KINEMATIC.span,
                              context=trace.set_span_in_context(parent),
                              start_time=t0 + 1_234_567, attributes=attrs)
    child.end(end_time=t0 + 5_000_321)
    parent.end(end_time=t0 + 9_876_543)
    return parent, child


def _future_t0() -> int:
    # after the exporter's creation, as for spans of a live run
    return time.time_ns() + 5_000_000_000


def _events(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    return doc, [e for e in events if e["ph"] == "X"], [e for e in events if e["ph"] == "M"]


def _otlp_spans(path: Path) -> list[dict[str, Any]]:
    return [s for line in path.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"]
            for ss in rs["scopeSpans"] for s in ss["spans"]]


def _hex_id(span: Any) -> str:
    return format(span.get_span_context().span_id, "016x")


# --- Chrome trace JSON -----------------------------------------------------------------------

def test_chrome_trace_has_one_nested_complete_event_per_span(tmp_path) -> None:
    path = tmp_path / "deep" / "trace.json"
    exporter = ChromeTraceSpanExporter(path)
    provider = _provider(exporter)
    t0 = _future_t0()
    traces = [_trace(provider, t0 + i * 20_000_000, resets=i + 1) for i in range(3)]
    assert exporter.force_flush()
    doc, xs, ms = _events(path)

    assert doc["displayTimeUnit"] == "ms"
    origin = int(doc["otherData"]["time_origin_unix_ns"])
    assert origin == exporter.time_origin_ns and origin < t0
    assert len(xs) == 6 and exporter.exported_spans == 6
    names = {(m["name"], m["tid"]): m["args"]["name"] for m in ms if m["pid"] == PID}
    track = {name.split()[-1]: tid for (kind, tid), name in names.items()
             if kind == "thread_name"}  # a trace's id: its track
    tids = set()
    for i, (parent, child) in enumerate(traces):
        mine = {e["name"]: e for e in xs
                if e["tid"] == track[format(parent.get_span_context().trace_id, "032x")]}
        p, c = mine[parent.name], mine[child.name]
        for span, ev in ((parent, p), (child, c)):
            assert ev["name"] == span.name and ev["cat"] == C.SET_STATE.span
            assert ev["ts"] == (span.start_time - origin) / 1000
            assert ev["dur"] == (span.end_time - span.start_time) / 1000
            assert round(ev["ts"] * 1000) == span.start_time - origin  # ns kept
            assert ev["pid"] == PID
            assert ev["args"][C.ATTR_RESET_COUNT] == i + 1
            assert ev["args"][C.ATTR_BACKEND] == "mujoco"
            assert not {"trace_id", "span_id", "parent_id"} & set(ev["args"])
        assert p["args"]["test.ratio"] == 0.25
        # the child stacks inside its parent on the trace's own track
        assert c["tid"] == p["tid"]
        assert p["ts"] < c["ts"] and c["ts"] + c["dur"] < p["ts"] + p["dur"]
        tids.add(p["tid"])
    assert tids == {1, 2, 3}
    assert names[("process_name", 0)] == f"resettrace {SERVICE}"
    assert {names[("thread_name", t)] for t in tids} == {
        f"trace {n + 1} {p.get_span_context().trace_id:032x}"
        for n, (p, _) in enumerate(traces)}
    assert len(ms) == 4  # one process name, three thread names: none repeated
    provider.shutdown()


def test_chrome_trace_frames_of_one_phase_merge_by_name(tmp_path) -> None:
    """A viewer that names a frame by its name and args (speedscope) sees the calls of a
    phase in a trace as one frame: no span ids in the args."""
    path = tmp_path / "trace.json"
    exporter = ChromeTraceSpanExporter(path)
    provider = _provider(exporter)
    tracer = provider.get_tracer(C.INSTRUMENTATION_SCOPE)
    t0 = _future_t0()
    step = tracer.start_span(C.ENV_STEP.span, start_time=t0)
    for i in range(4):  # four physics substeps
        tracer.start_span(C.PHYSICS.span, context=trace.set_span_in_context(step),
                          start_time=t0 + 10 + 100 * i).end(end_time=t0 + 90 + 100 * i)
    step.end(end_time=t0 + 1000)
    provider.shutdown()
    _, xs, _ = _events(path)
    frames = {(e["name"], json.dumps(e["args"], sort_keys=True)) for e in xs}
    assert len(xs) == 5 and len(frames) == 2


def test_chrome_trace_time_origin_can_be_pinned(tmp_path) -> None:
    path = tmp_path / "trace.json"
    t0 = 1_700_000_000_000_000_000
    exporter = ChromeTraceSpanExporter(path, time_origin_ns=t0)
    provider = _provider(exporter, Resource({}))
    parent, _ = _trace(provider, t0)
    provider.shutdown()
    doc, xs, ms = _events(path)
    assert doc["otherData"]["time_origin_unix_ns"] == str(t0)
    p = next(e for e in xs if e["name"] == C.SET_STATE.span)
    assert p["ts"] == 1.0 and p["dur"] == 9875.543
    # no process.pid or service.name in the resource: this process, unknown service
    assert {e["pid"] for e in xs + ms} == {os.getpid()}
    assert any(m["args"]["name"] == "resettrace unknown_service" for m in ms)


def test_chrome_trace_is_valid_json_after_every_export_and_after_shutdown(tmp_path) -> None:
    path = tmp_path / "trace.json"
    exporter = ChromeTraceSpanExporter(path)
    provider = _provider(exporter)
    t0 = _future_t0()
    _trace(provider, t0)
    assert len(_events(path)[1]) == 2  # each export is written at once
    _trace(provider, t0 + 50_000_000)
    assert len(_events(path)[1]) == 4
    assert exporter.force_flush()
    provider.shutdown()
    _, xs, _ = _events(path)
    assert len(xs) == 4 and exporter.exported_spans == 4
    assert len({(e["tid"], e["name"]) for e in xs}) == 4
    late = provider.get_tracer(__name__).start_span(C.SET_STATE.span)
    late.end()
    assert exporter.export([late]) is SpanExportResult.FAILURE


class _FailingOnce:
    """A file wrapper whose next write lands half its bytes on disk, then fails (disk full)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.armed = True

    def write(self, data: bytes) -> int:
        if self.armed:
            self.armed = False
            self._f.write(data[: len(data) // 2])
            self._f.flush()
            raise OSError(28, "No space left on device")
        return int(self._f.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@pytest.mark.parametrize("cls", [ChromeTraceSpanExporter, OtlpJsonSpanExporter])
def test_a_failed_write_drops_its_spans_and_leaves_no_garbage(tmp_path, caplog, cls) -> None:
    path = tmp_path / "out.json"
    exporter = cls(path)
    provider = _provider(exporter)
    t0 = _future_t0()
    _trace(provider, t0)
    exporter._file = _FailingOnce(exporter._file)  # a fault in the writes to come
    with caplog.at_level(logging.ERROR):
        parent, child = _trace(provider, t0 + 50_000_000)  # child fails, parent succeeds
    assert any("No space left" in r.getMessage() for r in caplog.records)
    provider.shutdown()
    assert exporter.dropped_spans == 1 and exporter.exported_spans == 3
    if cls is ChromeTraceSpanExporter:  # the second trace's track: its parent, no child
        _, xs, ms = _events(path)
        tid = next(m["tid"] for m in ms if m["name"] == "thread_name" and m["args"][
            "name"].endswith(f"{parent.get_span_context().trace_id:032x}"))
        assert len(xs) == 3 and [e["name"] for e in xs if e["tid"] == tid] == [parent.name]
    else:
        ids = {s["spanId"] for s in _otlp_spans(path)}
        assert len(ids) == 3 and _hex_id(parent) in ids and _hex_id(child) not in ids


# --- OTLP-JSON -------------------------------------------------------------------------------

def test_otlp_json_lines_hold_hex_ids_string_times_and_typed_attributes(tmp_path) -> None:
    path = tmp_path / "deep" / "trace.jsonl"
    exporter = OtlpJsonSpanExporter(path)
    provider = _provider(exporter)
    t0 = _future_t0()
    traces = [_trace(provider, t0 + i * 20_000_000, resets=i + 1) for i in range(3)]
    assert exporter.force_flush()
    lines = path.read_text().splitlines()
    assert len(lines) > 1  # several writes: one ExportTraceServiceRequest per line
    for line in lines:
        request = json.loads(line)
        assert set(request) == {"resourceSpans"}
        for rs in request["resourceSpans"]:
            res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            assert res[SERVICE_NAME] == {"stringValue": SERVICE}
            assert res[PROCESS_PID] == {"intValue": str(PID)}
            assert [ss["scope"]["name"] for ss in rs["scopeSpans"]] == [C.INSTRUMENTATION_SCOPE]
    spans = {s["spanId"]: s for s in _otlp_spans(path)}
    assert len(spans) == 6 and exporter.exported_spans == 6
    for i, (parent, child) in enumerate(traces):
        p, c = spans[_hex_id(parent)], spans[_hex_id(child)]
        for span, out in ((parent, p), (child, c)):
            ctx = span.get_span_context()
            assert HEX32.match(out["traceId"]) and HEX16.match(out["spanId"])
            assert out["traceId"] == format(ctx.trace_id, "032x")
            assert out["name"] == span.name
            assert out["startTimeUnixNano"] == str(span.start_time)
            assert out["endTimeUnixNano"] == str(span.end_time)
            assert out["kind"] == 1  # SPAN_KIND_INTERNAL, an integer as OTLP/JSON requires
            attrs = {a["key"]: a["value"] for a in out["attributes"]}
            assert attrs[C.ATTR_RESET_COUNT] == {"intValue": str(i + 1)}
            assert attrs[C.ATTR_BACKEND] == {"stringValue": "mujoco"}
        assert "parentSpanId" not in p
        assert HEX16.match(c["parentSpanId"]) and c["parentSpanId"] == p["spanId"]
        assert {a["key"]: a["value"] for a in p["attributes"]}["test.ratio"] == {
            "doubleValue": 0.25}
    provider.shutdown()


def _hex_to_b64(request: dict[str, Any]) -> dict[str, Any]:
    for rs in request["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return request


def test_otlp_json_round_trips_into_export_trace_service_request(tmp_path) -> None:
    path = tmp_path / "trace.jsonl"
    exporter = OtlpJsonSpanExporter(path)
    provider = _provider(exporter)
    t0 = _future_t0()
    spans: list[Any] = [s for i in range(2) for s in _trace(provider, t0 + i * 20_000_000)]
    provider.shutdown()
    parsed = {}
    for line in path.read_text().splitlines():
        msg = ParseDict(_hex_to_b64(json.loads(line)), ExportTraceServiceRequest())
        for rs in msg.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    parsed[s.span_id] = s
    assert len(parsed) == 4
    for span in spans:
        ctx = span.get_span_context()
        pb = parsed[ctx.span_id.to_bytes(8, "big")]
        assert pb.trace_id == ctx.trace_id.to_bytes(16, "big")
        assert pb.start_time_unix_nano == span.start_time
        assert pb.end_time_unix_nano == span.end_time
        want_parent = span.parent.span_id.to_bytes(8, "big") if span.parent else b""
        assert pb.parent_span_id == want_parent


def test_otlp_json_is_valid_after_every_export_and_after_shutdown(tmp_path) -> None:
    path = tmp_path / "trace.jsonl"
    exporter = OtlpJsonSpanExporter(path)
    provider = _provider(exporter)
    t0 = _future_t0()
    _trace(provider, t0)
    assert len(_otlp_spans(path)) == 2  # every line parses after each export
    _trace(provider, t0 + 50_000_000)
    assert len(_otlp_spans(path)) == 4
    provider.shutdown()
    assert len({s["spanId"] for s in _otlp_spans(path)}) == 4
    assert path.read_text().endswith("}\n")


# --- shared contract -------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [ChromeTraceSpanExporter, OtlpJsonSpanExporter])
def test_unwritable_path_returns_failure_without_raising(tmp_path, caplog, cls) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    exporter = cls(blocker / "sub" / "trace.json")
    tracer = TracerProvider().get_tracer(__name__)
    span = tracer.start_span(C.SET_STATE.span)
    span.end()
    with caplog.at_level(logging.ERROR):
        assert exporter.export([span]) is SpanExportResult.FAILURE
        assert exporter.export([span]) is SpanExportResult.FAILURE
    assert [r.levelno for r in caplog.records].count(logging.ERROR) == 1  # not one per span
    assert exporter.dropped_spans == 2 and exporter.exported_spans == 0
    exporter.shutdown()
    assert blocker.read_text() == "not a folder"


def test_make_exporter_builds_the_file_format_exporters(tmp_path) -> None:
    chrome = make_exporter(f"perfetto:{tmp_path / 'a.json'}")
    otlp = make_exporter(f"otlp-json:{tmp_path / 'b.jsonl'}")
    assert isinstance(chrome, ChromeTraceSpanExporter)
    assert isinstance(otlp, OtlpJsonSpanExporter)
    assert chrome.path == tmp_path / "a.json" and otlp.path == tmp_path / "b.jsonl"
