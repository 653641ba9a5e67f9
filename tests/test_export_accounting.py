"""Every span's fate reaches the report: receivers that are slow, refuse, or are not there.

Closed accounts, per exporter, once the session is shut down:

- delivered + failed + cut_off = spans sent to the export process;
- undelivered = failed + cut_off + spans dropped before export;
- delivered <= distinct spans the receiver holds <= delivered + timed_out;
- spans in requests the receiver refused are failed.

The receivers are real (gRPC and HTTP on 127.0.0.1); the shutdown timeouts and batches are
small so that each case takes a few seconds.
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers import record_traces
from resettrace.config import Config
from resettrace.testing.receivers import (
    BlackholeListener,
    GrpcReceiver,
    HttpReceiver,
    refused_endpoint,
)
from resettrace.tracing.session import Tracing

PROTOCOLS = {"grpc": GrpcReceiver, "http/protobuf": HttpReceiver}


def _session(endpoint: str, protocol: str, **kw: Any) -> Tracing:
    settings: dict[str, Any] = {"export_batch_size": 60, "export_delay_s": 0.05,
                                "shutdown_timeout_s": 1.5, "otlp_timeout_s": 2.0}
    settings.update(kw)
    return Tracing(Config(mode="trace", exporters=("otlp",), otlp_endpoint=endpoint,
                          otlp_protocol=protocol, **settings))


def _closed_accounts(report: dict[str, Any]) -> dict[str, Any]:
    otlp = report["exporters"]["otlp"]
    sent, dropped = report["spans_sent"], report["spans_dropped"]
    assert otlp["delivered"] + otlp["failed"] + otlp["cut_off"] == sent, otlp
    assert otlp["undelivered"] == otlp["failed"] + otlp["cut_off"] + dropped, (otlp, dropped)
    assert 0 <= otlp["timed_out"] <= otlp["failed"]
    assert report["spans_pending"] == 0
    return dict(otlp)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_slow_collector_cut_short_by_the_deadline_is_counted_exactly(protocol: str) -> None:
    """1 s per request, 1.5 s to shut down: some batches are acknowledged, one is under
    way when the time is up, the rest are never sent. Every batch the receiver got is
    delivered or timed out; the ones never sent are cut off (they were reported as
    nothing, or as delivered when they were not, before)."""
    with PROTOCOLS[protocol](delay_s=1.0) as rx:
        session = _session(rx.endpoint, protocol)
        record_traces(session, 400)  # 1,200 spans: 20 batches of 60
        session.force_flush(0.05)  # handed to the export process, not waited for ...
        rx.wait_for(1, timeout=60)  # ... until its export is under way (a loaded machine
        # starts the export process slowly: the deadline below must not cut it all)
        session.shutdown()
        held = len(rx.span_keys())
    otlp = _closed_accounts(session.export_report())
    assert otlp["delivered"] <= held <= otlp["delivered"] + otlp["timed_out"], (otlp, held)
    assert otlp["cut_off"] > 0 and held > 0  # the deadline cut it short, after some arrived


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_answers_slower_than_the_timeout_are_timed_out_not_lost(protocol: str) -> None:
    """Every request arrives and is answered after the exporter gave up: the receiver
    holds spans that were never acknowledged; they are all among ``timed_out``."""
    with PROTOCOLS[protocol](delay_s=0.5) as rx:
        session = _session(rx.endpoint, protocol, otlp_timeout_s=0.2, shutdown_timeout_s=3.0)
        record_traces(session, 100)
        session.force_flush(0.05)  # handed to the export process, not waited for ...
        rx.wait_for(1, timeout=60)  # ... until its export is under way (a loaded machine
        # starts the export process slowly: the deadline below must not cut it all)
        session.shutdown()
        held = len(rx.span_keys())
    otlp = _closed_accounts(session.export_report())
    assert held > 0 and otlp["delivered"] == 0
    assert held <= otlp["timed_out"], (otlp, held)


@pytest.mark.parametrize("protocol,refuse", [("grpc", "UNAVAILABLE"), ("http/protobuf", 503),
                                             ("http/protobuf", 413)])
def test_refused_requests_are_failed(protocol: str, refuse: Any) -> None:
    """A receiver that refuses (retried: UNAVAILABLE, 503; not retried: 413): nothing is
    delivered, each refused span is counted as failed, and what the deadline stopped is
    cut off."""
    with PROTOCOLS[protocol](refuse=refuse) as rx:
        session = _session(rx.endpoint, protocol)
        record_traces(session, 200)
        session.shutdown()
        refused = {(s.trace_id, s.span_id) for s in rx.refused}
    otlp = _closed_accounts(session.export_report())
    assert otlp["delivered"] == 0 and refused
    assert len(refused) <= otlp["failed"], (otlp, len(refused))
    assert otlp["undelivered"] == 600


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("down", ["refused", "blackhole"])
def test_an_endpoint_that_is_down_accounts_for_every_span(protocol: str, down: str) -> None:
    """Nothing listening, or a listener that never answers: every undelivered span is
    failed, cut off or dropped (4 of 2,982 were accounted for before)."""
    path = "/v1/traces" if protocol == "http/protobuf" else ""
    with BlackholeListener() as hole:
        endpoint = refused_endpoint(path) if down == "refused" else hole.endpoint + path
        session = _session(endpoint, protocol, otlp_timeout_s=0.3, shutdown_timeout_s=1.0)
        record_traces(session, 300)
        session.shutdown()
    otlp = _closed_accounts(session.export_report())
    assert otlp["delivered"] == 0 and otlp["undelivered"] == 900


def test_a_healthy_receiver_gets_everything_and_the_accounts_close() -> None:
    with GrpcReceiver() as rx:
        session = _session(rx.endpoint, "grpc")
        record_traces(session, 300)
        session.shutdown()
        held = len(rx.span_keys())
    otlp = _closed_accounts(session.export_report())
    assert otlp["delivered"] == held == 900 and otlp["cut_off"] == otlp["failed"] == 0


def test_an_export_process_killed_mid_call_reports_the_call_as_timed_out() -> None:
    """The export process is stopped (SIGSTOP) while a call is under way, and killed by
    the training process at the deadline without a last word: the batch it had announced
    was sent and never acknowledged (failed, timed out: its receiver holds it), and the
    rest was cut off."""
    import contextlib
    import os
    import signal

    with GrpcReceiver(delay_s=5.0) as rx:
        session = _session(rx.endpoint, "grpc", otlp_timeout_s=5.0, shutdown_timeout_s=0.5)
        proc = session.process
        assert proc is not None and proc._proc is not None
        record_traces(session, 100)
        proc.flush(0.01)  # hand everything over: the first batch goes out
        rx.wait_for(60, timeout=10)  # ... and is at the receiver, unanswered
        os.kill(proc._proc.pid, signal.SIGSTOP)
        try:
            session.shutdown()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc._proc.pid, signal.SIGCONT)
        held = len(rx.span_keys())
    otlp = _closed_accounts(session.export_report())
    assert held == 60 and otlp["delivered"] == 0
    assert otlp["timed_out"] == otlp["failed"] == 60 and otlp["cut_off"] == 240, otlp
