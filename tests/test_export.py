"""Span export: the JSON-lines file, the bounded queue and its drop count, shutdown."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import resettrace
from helpers import stand_rows
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.tracing.recorder import Recorder
from resettrace.tracing.session import Tracing


def test_span_file_has_one_json_object_per_span(tmp_path) -> None:
    path = tmp_path / "deep" / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{path}",)))
    b = resettrace.make_backend("mujoco", num_envs=8, tracing=session, task="g1_walk_flat")
    q, v = stand_rows(b, 2)
    timing = b.set_state([3, 6], q, v)["timing"]
    session.shutdown()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    names = [x["name"] for x in lines]
    assert names.count(C.SET_STATE.span) == 1
    root = next(x for x in lines if x["name"] == C.SET_STATE.span)
    assert root["parent_id"] is None and len(root["trace_id"]) == 32 and len(root["span_id"]) == 16
    for x in lines:
        assert set(x) == {"name", "trace_id", "span_id", "parent_id", "start_ns", "end_ns",
                          "status", "attributes", "resource"}
        assert x["resource"]["process.pid"] == os.getpid()  # the training process's
        assert x["resource"]["resettrace.worker.rank"] == 0
        assert x["trace_id"] == root["trace_id"]
        assert x["attributes"][C.ATTR_RESET_COUNT] == 2
        assert x["attributes"][C.ATTR_ENV_COUNT] == 8
        assert x["attributes"][C.ATTR_TASK] == "g1_walk_flat"
        if x is not root:
            assert x["parent_id"] == root["span_id"]
        # exact timestamps: span durations equal the timing dict (1 us)
        key = C.BY_SPAN[x["name"]].key
        if x is not root:
            assert abs((x["end_ns"] - x["start_ns"]) / 1e6 - timing[key]) < 1e-3
    assert abs(sum(timing.values()) - (root["end_ns"] - root["start_ns"]) / 1e6) < 1e-3
    b.close()


class _Stuck:
    """A tracer provider whose tracer blocks until released (an exporter that hangs)."""

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()
        outer = self

        class _Tracer:
            def start_span(self, *a, **k):
                outer.release.wait(10)
                raise RuntimeError("stuck provider")

        self._tracer = _Tracer()

    def get_tracer(self, *_a, **_k):
        return self._tracer


def test_full_queue_drops_and_counts_never_blocks() -> None:
    stuck = _Stuck()
    session = Tracing(Config(mode="trace", queue_size=2), tracer_provider=stuck)
    rec = session.recorder(backend="mujoco")
    assert isinstance(rec, Recorder)
    for _ in range(10):  # each a 2-span trace
        with rec.scope(C.RESET_DONE, 1), rec.scope(C.RESET_DONE_TERMINAL_OBS):
            pass
    # one trace is being built, two wait, the other seven are dropped: 14 spans
    assert session.dropped_spans >= 14
    assert session.stats()[C.RESET_DONE.key].count == 10  # timing sees every trace
    stuck.release.set()
    session.shutdown(timeout_s=1.0)
    report = session.export_report()
    assert report["spans_built"] == 0 and report["spans_pending"] == 0
    assert report["spans_dropped"] == 20  # every span accounted for: none silently lost


def test_a_provider_passed_in_is_not_shut_down() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    session = Tracing(Config(mode="trace"), tracer_provider=provider)
    rec = session.recorder()
    with rec.scope(C.PHYSICS):
        pass
    session.shutdown()
    assert [s.name for s in exporter.get_finished_spans()] == [C.PHYSICS.span]
    tracer = provider.get_tracer("still.alive")
    tracer.start_span("after").end()
    assert len(exporter.get_finished_spans()) == 2
    provider.shutdown()


def test_error_inside_a_phase_marks_the_span(trace_session) -> None:
    rec = trace_session.recorder()
    try:
        with rec.scope(C.SET_STATE, 1), rec.scope(C.SET_STATE_MASK):
            raise ValueError("bad ids")
    except ValueError:
        pass
    trace_session.force_flush()
    spans = {s.name: s for s in trace_session.exporters[0].get_finished_spans()}
    assert spans[C.SET_STATE_MASK.span].status.status_code.name == "ERROR"
    assert spans[C.SET_STATE.span].status.description == "ValueError"
    np.testing.assert_equal(len(spans), 2)


def _spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_traces_waiting_for_export_keep_the_attributes_they_closed_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However a recorder's attributes change while its traces wait to be written (set,
    updated, deleted, replaced, merged), each span carries those of its trace's close."""
    from resettrace.tracing.export import parent as X

    monkeypatch.setattr(X, "_WRITE_DELAY_S", 1e9)
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{out}",)))
    rec = session.recorder(backend="b")
    changes: dict[int, Any] = {
        5: lambda: rec.attributes.__setitem__("lab.k", 1),
        9: lambda: rec.attributes.update({"lab.k": 2}),
        12: lambda: rec.attributes.setdefault("lab.j", 0),
        14: lambda: rec.attributes.__delitem__("lab.k"),
        20: lambda: setattr(rec, "attributes", {**rec.attributes, "lab.k": 3}),
        26: lambda: rec.attributes.__ior__({"lab.k": 4}),
        33: lambda: rec.attributes.pop("lab.k"),
    }
    expected = []
    for i in range(40):
        if i in changes:
            changes[i]()
        expected.append(rec.attributes.get("lab.k"))
        with rec.scope(C.ENV_STEP):
            pass
    session.shutdown()
    got = [s["attributes"].get("lab.k") for s in _spans(out)]
    assert got == expected
    assert expected[4:6] == [None, 1] and expected[-1] is None


def test_traces_of_recorders_on_two_threads_reach_the_export_whole(tmp_path: Path) -> None:
    """Two threads record at once, each with its own recorder: the export's queue switches
    between them trace by trace, and every span arrives once, with its own attributes."""
    import threading

    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", exporters=(f"file:{out}",)))
    start = threading.Barrier(2)

    def work(name: str) -> None:
        rec = session.recorder(backend=name)
        start.wait()
        for _ in range(400):
            with rec.scope(C.DR_RESET, 2), rec.scope(C.SET_STATE):
                pass

    threads = [threading.Thread(target=work, args=(n,)) for n in ("t1", "t2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    session.shutdown()
    spans = _spans(out)
    assert len(spans) == 1600
    assert len({s["span_id"] for s in spans}) == 1600
    by = {n: [s for s in spans if s["attributes"][C.ATTR_BACKEND] == n] for n in ("t1", "t2")}
    assert [len(v) for v in by.values()] == [800, 800]
    report = session.export_report()
    assert report["spans_sent"] == 1600 and report["spans_not_delivered"] == 0
