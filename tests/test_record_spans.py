"""Every file format written from the records (the export process's path) is, byte for
byte, what the format writes for the SDK spans of the same traces; the export process
gives a span the same ids in every format it writes."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator

from helpers import record_traces
from resettrace import catalog as C
from resettrace.catalog import ATTR_EXPORT_DROPPED, INSTRUMENTATION_SCOPE
from resettrace.config import Config
from resettrace.testing.receivers import GrpcReceiver
from resettrace.tracing.export.exporters import make_exporter
from resettrace.tracing.export.records import SpanSource, TraceQueue, Traces
from resettrace.tracing.session import Tracing
from resettrace.tracing.spans import build_spans

FORMATS = ("file", "perfetto", "otlp-json", "jaeger-json")
OFFSET = 1_700_000_000_000_000_000
NAMES = {0: "env_step", 1: "reset_done", 2: 'set_state."q%s"\u00e9', 3: "physics"}
ERRORS = {1: "KeyError", 2: ""}
ATTRS = {"resettrace.backend.name": "mujoco", "x.float": 1.5, "x.nan": math.nan,
         "x.inf": -math.inf, "x.bool": True, "x.list": [1, 2], "x.pct": "100%s %(t)s",
         "x.quote": 'a"b\\c\n'}
#: [phase, parent, start, end, count, error]: counts given and inherited, errors with and
#: without a name, one-span traces, and a second trace of the first one's shape
TRACES = [
    [[0, -1, 100, 900, -1, 0], [1, 0, 200, 800, 5, 0], [2, 1, 300, 700, -1, 1],
     [3, 0, 800, 899, -1, 0]],
    [[0, -1, 1000, 1900, -1, 2]],
    [[1, -1, 2000, 2500, 3, 0], [2, 0, 2100, 2400, 300, 0]],
    [[0, -1, 3100, 3900, -1, 0], [1, 0, 3200, 3800, 7, 0], [2, 1, 3300, 3700, -1, 0],
     [3, 0, 3800, 3899, -1, 0]],
]


class _Ids(IdGenerator):
    """Hands out the ids the record path drew, in the order the SDK asks for them."""

    def __init__(self, batch: list[Traces]) -> None:
        self.traces = [t for tr in batch for t in tr.trace_ids]
        self.spans = [int(s) for tr in batch for s in tr.span_ids]

    def generate_trace_id(self) -> int:
        return self.traces.pop(0)

    def generate_span_id(self) -> int:
        return self.spans.pop(0)


class _Keep(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def _both(tmp_path: Path, traces: list[list[list[int]]] = TRACES
          ) -> tuple[list[Traces], list[ReadableSpan]]:
    """The traces as the record path holds them, and the same traces as SDK spans built
    as the export process builds them, with the same ids."""
    resource = Resource.create({"service.name": "svc", "process.pid": 4242, "host.name": "h"})
    queue = TraceQueue(SpanSource(dict(resource.attributes), NAMES.__getitem__,
                                  ERRORS.__getitem__))
    records = np.array([r for t in traces for r in t], dtype=np.int64)
    queue.add(ATTRS, "key", OFFSET, {ATTR_EXPORT_DROPPED: 3}, records, [len(t) for t in traces])
    assert queue.pending == len(records)
    batch = queue.take(10_000)
    assert queue.pending == 0 and [len(t) for t in batch] == [len(traces)]
    keep = _Keep()
    provider = TracerProvider(resource=resource, id_generator=_Ids(batch))
    provider.add_span_processor(keep)
    tracer = provider.get_tracer(INSTRUMENTATION_SCOPE)
    for t in traces:
        build_spans(tracer, t, ATTRS, OFFSET, ERRORS.__getitem__, NAMES.__getitem__,
                    {ATTR_EXPORT_DROPPED: 3})
    return batch, keep.spans


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_writes_the_same_bytes_from_records_as_from_sdk_spans(
        tmp_path: Path, fmt: str) -> None:
    batch, spans = _both(tmp_path)
    sdk = make_exporter(f"{fmt}:{tmp_path}/sdk.out", pid=1, rank=0)
    rec = make_exporter(f"{fmt}:{tmp_path}/rec.out", pid=1, rank=0)
    if hasattr(sdk, "_created_ns"):  # Perfetto's time origin: the exporter's creation
        sdk._created_ns = rec._created_ns = OFFSET + 5000  # type: ignore[attr-defined]
    # two writes each, cut between traces as the export process cuts batches
    assert sdk.export(spans[:5]).name == rec.export_traces([batch[0].part(0, 2)]).name \
        == "SUCCESS"
    sdk.export(spans[5:])
    rec.export_traces([batch[0].part(2, 4)])
    sdk.shutdown()
    rec.shutdown()
    written = (tmp_path / "rec.out").read_bytes()
    assert written == (tmp_path / "sdk.out").read_bytes()
    assert rec.exported_spans == sdk.exported_spans == len(spans)  # type: ignore[attr-defined]
    text = written.decode()
    assert re.search(r"rt[0-9a-f]{12}[SN]", text) is None  # no placeholder left
    assert f"{batch[0].trace_ids[3]:032x}" in text


def test_a_nan_attribute_no_longer_breaks_a_jaeger_file(tmp_path: Path) -> None:
    """A non-finite float attribute made the Jaeger UI JSON exporter raise (JSON has no
    NaN): the whole batch was lost. It is written as a string tag now."""
    batch, spans = _both(tmp_path)
    exporter = make_exporter(f"jaeger-json:{tmp_path}/j.json", pid=1, rank=0)
    assert exporter.export(spans).name == "SUCCESS"
    exporter.shutdown()
    data = json.loads((tmp_path / "j.json").read_text())
    tags = {t["key"]: t for t in data["data"][0]["spans"][0]["tags"]}
    assert tags["x.nan"] == {"key": "x.nan", "type": "string", "value": "nan"}
    assert tags["x.inf"]["value"] == "-inf"


def test_no_jaeger_span_ends_after_its_parent(tmp_path: Path) -> None:
    """Jaeger's times are microseconds: a start and a duration floored each on its own
    let a child end 1 us after a parent that ends with it (14 of 1,289 spans of a real
    run); both ends floored keep every child inside its parent, from records and from
    SDK spans alike."""
    rng = np.random.default_rng(5)
    traces = []
    for _ in range(300):  # three levels, children ending with their parent or before
        a = int(rng.integers(0, 10**6))
        z = a + int(rng.integers(2, 10_000))
        b = int(rng.integers(a, z))
        c = int(rng.integers(b, z + 1))
        y = z if rng.random() < 0.5 else int(rng.integers(c, z + 1))
        traces.append([[0, -1, a, z, -1, 0], [1, 0, b, y, 2, 0], [3, 1, c, y, -1, 0]])
    traces.append([[0, -1, 1999, 5001, -1, 0], [1, 0, 2000, 5001, 1, 0]])  # (ended at 5)
    batch, spans = _both(tmp_path, traces)
    for name, write in (("rec", lambda e: e.export_traces(batch)),
                        ("sdk", lambda e: e.export(spans))):
        exporter = make_exporter(f"jaeger-json:{tmp_path}/{name}.json", pid=1, rank=0)
        assert write(exporter).name == "SUCCESS"
        exporter.shutdown()
        late = 0
        for entry in json.loads((tmp_path / f"{name}.json").read_text())["data"]:
            by_id = {s["spanID"]: s for s in entry["spans"]}
            for s in entry["spans"]:
                for ref in s["references"]:
                    parent = by_id[ref["spanID"]]
                    assert s["startTime"] >= parent["startTime"]
                    late += (s["startTime"] + s["duration"]
                             > parent["startTime"] + parent["duration"])
        assert late == 0, name


def test_batches_are_whole_traces_and_a_big_trace_goes_alone() -> None:
    queue = TraceQueue(SpanSource({}, str, str))
    sizes = [3, 3, 8, 1, 2]
    rows = [[0, -1 if j == 0 else 0, 0, 1, -1, 0] for n in sizes for j in range(n)]
    queue.add({}, "a", 0, {}, np.array(rows, dtype=np.int64), sizes)
    queue.add({}, "b", 0, {}, np.array(rows[:3], dtype=np.int64), [3])
    taken = []
    while batch := queue.take(7):
        taken.append([t.spans for t in batch])
        for t in batch:
            assert all(t.records[a, 1] == -1 for _, a, _ in t.each())  # starts at a root
    assert taken == [[6], [8], [3, 3]] and queue.pending == 0
    ids = [t for batch in taken for t in batch]
    assert sum(ids) == sum(sizes) + 3


def test_the_export_process_gives_a_span_the_same_ids_in_every_format(tmp_path: Path) -> None:
    with GrpcReceiver() as rx:
        files = {fmt: tmp_path / f"spans.{fmt}" for fmt in FORMATS}
        session = Tracing(Config(mode="trace", otlp_endpoint=rx.endpoint, exporters=(
            "otlp", *(f"{fmt}:{path}" for fmt, path in files.items()))))
        record_traces(session, 20)
        rec = session.recorder(backend="test")
        with pytest.raises(KeyError), rec.scope(C.DR_RESET, 2):
            raise KeyError("user bug")
        assert session.force_flush(10)
        session.shutdown()
        received = rx.wait_for(61, timeout=10)
    report = session.export_report()
    for spec, sink in report["exporters"].items():
        assert (sink["delivered"], sink["failed"]) == (61, 0), spec
    want = {(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_ns, s.end_ns)
            for s in received}
    assert len(want) == 61
    lines = [json.loads(line) for line in files["file"].read_text().splitlines()]
    assert {(d["trace_id"], d["span_id"], d["parent_id"], d["name"], d["start_ns"],
             d["end_ns"]) for d in lines} == want
    otlp = [s for line in files["otlp-json"].read_text().splitlines()
            for s in json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]]
    assert {(s["traceId"], s["spanId"], s.get("parentSpanId"), s["name"],
             int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for s in otlp} == want
    jaeger = [s for entry in json.loads(files["jaeger-json"].read_text())["data"]
              for s in entry["spans"]]
    assert {(s["traceID"], s["spanID"], s["references"][0]["spanID"] if s["references"]
             else None) for s in jaeger} == {w[:3] for w in want}
    perfetto = [e for e in json.loads(files["perfetto"].read_text())["traceEvents"]
                if e["ph"] == "X"]
    tracks = {e["args"]["name"].split()[-1] for e in json.loads(
        files["perfetto"].read_text())["traceEvents"] if e["name"] == "thread_name"}
    assert tracks == {w[0] for w in want}  # each trace's track named with its id
    assert len(perfetto) == 61
    failed = [d for d in lines if d["status"] == "ERROR"]
    assert len(failed) == 1 and failed[0]["name"] == "dr_reset"


@pytest.mark.parametrize("encoder", ["records", "sdk"])
def test_both_encoders_write_the_same_spans(tmp_path: Path, encoder: str) -> None:
    """``span_encoder``: the records (default) or SDK spans, the same spans either way."""
    path = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{path}",), span_encoder=encoder))
    record_traces(session, 5, count=4)
    session.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(d["name"] for d in lines) == sorted(["dr_reset", "dr_reset.plan",
                                                       "set_state"] * 5)
    by_id: dict[str, dict[str, Any]] = {d["span_id"]: d for d in lines}
    for d in lines:
        assert d["attributes"]["resettrace.reset.count"] == 4
        if d["name"] != "dr_reset":
            assert by_id[d["parent_id"]]["name"] == "dr_reset"
            assert by_id[d["parent_id"]]["trace_id"] == d["trace_id"]
        else:
            assert d["attributes"][ATTR_EXPORT_DROPPED] == 0 and d["parent_id"] is None
    assert session.export_report()["exporters"][f"file:{path}"]["delivered"] == 15


def test_a_recorder_attribute_the_resource_holds_is_not_repeated_on_each_span(
        tmp_path: Path) -> None:
    """What belongs to the process (the task and backend a CLI run names on the resource)
    is carried once, as process tags, not on every span; a recorder whose value differs
    (a second env of another task in the process) keeps its own on its spans."""
    files = {fmt: tmp_path / f"spans.{fmt}" for fmt in ("jaeger-json", "otlp-json")}
    session = Tracing(Config(mode="trace", exporters=tuple(f"{f}:{p}" for f, p in files.items()),
                             resource_attributes={C.ATTR_TASK: "walk", C.ATTR_BACKEND: "mujoco"}))
    same = session.recorder(backend="mujoco", task="walk", env_count=8)
    other = session.recorder(backend="mujoco", task="run", env_count=4)
    for rec in (same, other):
        with rec.scope(C.SET_STATE, 2):
            pass
    session.shutdown()
    data = json.loads(files["jaeger-json"].read_text())["data"]
    assert len(data) == 2
    for entry in data:
        process = {t["key"]: t["value"] for t in entry["processes"]["p1"]["tags"]}
        assert process[C.ATTR_TASK] == "walk" and process[C.ATTR_BACKEND] == "mujoco"
        (span,) = entry["spans"]
        tags = {t["key"]: t["value"] for t in span["tags"]}
        assert C.ATTR_BACKEND not in tags and tags[C.ATTR_RESET_COUNT] == 2
        assert tags.get(C.ATTR_TASK) in (None, "run")
        assert tags[C.ATTR_ENV_COUNT] == (8 if C.ATTR_TASK not in tags else 4)
    assert sorted(str(e["spans"][0]["tags"]).count("run") for e in data) == [0, 1]
    otlp = [s for line in files["otlp-json"].read_text().splitlines()
            for s in json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]]
    keys = sorted(tuple(sorted(a["key"] for a in s["attributes"])) for s in otlp)
    assert [C.ATTR_TASK in k for k in keys].count(True) == 1
    assert not any(C.ATTR_BACKEND in k for k in keys)
