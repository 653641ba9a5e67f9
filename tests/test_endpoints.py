"""Data and credentials go only where the user pointed them: OTLP endpoints (TLS, headers,
compression, malformed values) and the Prometheus listener's address."""

from __future__ import annotations

import contextlib
import logging
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import record_traces
from resettrace.config import Config
from resettrace.testing.receivers import (
    BlackholeListener,
    GrpcReceiver,
    HttpReceiver,
    self_signed_certificate,
)
from resettrace.tracing.session import Tracing

TOKEN = "Bearer s3cret-token"


@contextlib.contextmanager
def _default_port_listener(port: int) -> Iterator[BlackholeListener]:
    """A listener on the default collector port (where a silent fallback would send)."""
    try:
        hole = BlackholeListener(port=port).start()
    except OSError as e:
        pytest.fail(f"port {port} is taken on this machine ({e}): the test needs it free")
    try:
        yield hole
    finally:
        hole.stop()


@pytest.fixture
def clean_otlp_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith(("OTEL_", "RESETTRACE")) or name in ("REQUESTS_CA_BUNDLE",
                                                                "SSL_CERT_FILE"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_a_scheme_less_grpc_endpoint_means_tls_and_reaches_the_tls_collector(
        tmp_path: Path, clean_otlp_env: pytest.MonkeyPatch) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT=127.0.0.1:PORT`` with insecure false (valid for gRPC in
    the OpenTelemetry specification): the spans and the authorization header reach the TLS
    collector, and nothing reaches the plaintext default (it used to get both)."""
    cert, key = self_signed_certificate(str(tmp_path))
    env = clean_otlp_env
    with GrpcReceiver(tls=(cert, key)) as rx, _default_port_listener(4317) as fallback:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"127.0.0.1:{rx.port}")
        env.setenv("OTEL_EXPORTER_OTLP_INSECURE", "false")
        env.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(tmp_path / "ca.pem"))
        env.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization={TOKEN}")
        env.setenv("RESETTRACE", "trace")
        env.setenv("RESETTRACE_EXPORTER", "otlp")
        env.setenv("RESETTRACE_SHUTDOWN_TIMEOUT", "60")  # a TLS start on a loaded machine
        session = Tracing(Config.from_env())
        record_traces(session, 50, count=2, plan=False)
        session.shutdown()
        assert len(rx.span_keys()) == 100
        assert rx.headers and all(h.get("authorization") == TOKEN for h in rx.headers)
        assert fallback.connections == 0
    assert session.export_report()["exporters"]["otlp"]["delivered"] == 100


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_tls_with_a_self_signed_certificate_and_headers_on_both_transports(
        tmp_path: Path, clean_otlp_env: pytest.MonkeyPatch, protocol: str) -> None:
    """The collector's CA is trusted through ``OTEL_EXPORTER_OTLP_CERTIFICATE``, also where
    a system-wide ``REQUESTS_CA_BUNDLE`` is set (which ``requests`` lets win otherwise)."""
    cert, key = self_signed_certificate(str(tmp_path))
    clean_otlp_env.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "server.pem"))
    receiver = GrpcReceiver if protocol == "grpc" else HttpReceiver
    with receiver(tls=(cert, key)) as rx:
        assert rx.endpoint.startswith("https://")
        clean_otlp_env.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(tmp_path / "ca.pem"))
        clean_otlp_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization={TOKEN}")
        session = Tracing(Config(mode="trace", exporters=("otlp",), otlp_protocol=protocol,
                                 otlp_endpoint=rx.endpoint, otlp_compression="gzip",
                                 shutdown_timeout_s=60))  # a TLS start on a loaded machine
        record_traces(session, 20, count=2, plan=False)
        session.shutdown()
        assert len(rx.span_keys()) == 40
        assert all(h.get("authorization") == TOKEN for h in rx.headers)
        if protocol == "http/protobuf":
            assert all(h.get("content-encoding") == "gzip" for h in rx.headers)


@pytest.mark.parametrize("protocol,raw,default_port", [
    ("http/protobuf", "127.0.0.1:{port}", 4318),  # HTTP needs a scheme
    ("grpc", "http://:{port}", 4317),  # no host
    ("grpc", "http://127.0.0.1:port", 4317),
    ("grpc", "ftp://127.0.0.1:{port}", 4317),
])
def test_an_unusable_endpoint_sends_nothing_anywhere_and_says_why(
        clean_otlp_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, protocol: str,
        raw: str, default_port: int) -> None:
    """It used to be replaced by plaintext localhost, which then got the spans and the
    credentials. Now the ``otlp`` exporter sends nothing; its spans are failed, and the
    report and the log name the variable."""
    with GrpcReceiver() as rx, _default_port_listener(default_port) as fallback:
        env = clean_otlp_env
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", raw.format(port=rx.port))
        env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        env.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization={TOKEN}")
        env.setenv("RESETTRACE", "trace")
        env.setenv("RESETTRACE_EXPORTER", "otlp")
        with caplog.at_level(logging.ERROR, logger="resettrace"):
            session = Tracing(Config.from_env())
        record_traces(session, 10, count=2, plan=False)
        session.shutdown()
        assert fallback.connections == 0 and rx.requests == 0 and not rx.headers
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in caplog.text
    otlp = session.export_report()["exporters"]["otlp"]
    assert otlp["delivered"] == 0 and otlp["failed"] == otlp["undelivered"] == 20
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in otlp["error"]


def test_an_unusable_endpoint_stops_the_command_line_with_one_line(
        clean_otlp_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, RESETTRACE="trace", RESETTRACE_EXPORTER="otlp",
               OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
               OTEL_EXPORTER_OTLP_ENDPOINT="collector:4318")
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "bench", "collector",
                        "--num-envs", "4", "--steps", "1", "--out", str(tmp_path / "run")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in r.stderr and "collector:4318" in r.stderr


def test_metrics_never_fall_back_to_another_endpoint(clean_otlp_env: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    with _default_port_listener(4317) as fallback:
        clean_otlp_env.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://:4317")
        with caplog.at_level(logging.WARNING, logger="resettrace"):
            session = Tracing(Config(mode="timing", metrics=("otlp",)))
            session.shutdown()
        assert fallback.connections == 0
    assert "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT" in caplog.text


# -- the Prometheus listener ----------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bound(session: Tracing) -> tuple[str, int]:
    assert session.metrics is not None and session.metrics._server is not None
    server, _thread = session.metrics._server
    host, port = server.server_address[:2]
    return str(host), int(port)


def test_prometheus_binds_loopback_by_default(clean_otlp_env: pytest.MonkeyPatch) -> None:
    port = _free_port()
    clean_otlp_env.setenv("RESETTRACE_METRICS", f"prometheus:{port}")
    session = Tracing(Config.from_env(mode="timing"))
    try:
        assert _bound(session) == ("127.0.0.1", port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert b"resettrace_env_steps_total" in r.read()
    finally:
        session.shutdown()


@pytest.mark.parametrize("host,shown", [("0.0.0.0", "0.0.0.0"), ("[::1]", "::1")])
def test_prometheus_binds_the_address_it_is_given(clean_otlp_env: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture,
                                                   host: str, shown: str) -> None:
    port = _free_port()
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        session = Tracing(Config(mode="timing", metrics=(f"prometheus:{host}:{port}",)))
    try:
        assert _bound(session) == (shown, port)
        assert ("reachable from other machines" in caplog.text) == (shown == "0.0.0.0")
        assert session.export_report()["metrics"]["prometheus_host"] == shown
    finally:
        session.shutdown()


@pytest.mark.parametrize("spec", ["prometheus:::1:9464", "prometheus:host:65536",
                                  "prometheus:127.0.0.1:", "prometheus:70000"])
def test_a_bad_prometheus_address_is_an_error_naming_it(spec: str) -> None:
    with pytest.raises(ValueError, match="prometheus"):
        Config(mode="timing", metrics=(spec,))
