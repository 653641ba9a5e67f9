"""Configuration precedence and the handling of bad environment values."""

from __future__ import annotations

import logging
import math

import pytest

import resettrace
from resettrace.config import Config


def test_defaults_are_off() -> None:
    c = Config.from_env({})
    assert c.mode == "off" and not c.enabled
    assert c.service_name == "resettrace"


def test_environment_is_read() -> None:
    c = Config.from_env({"RESETTRACE": "TRACE", "RESETTRACE_EXPORTER": "file:/x/s.jsonl,memory",
                         "OTEL_SERVICE_NAME": "g1-trainer", "RESETTRACE_MAX_SAMPLES": "50",
                         "RESETTRACE_QUEUE_SIZE": "8", "RESETTRACE_SHUTDOWN_TIMEOUT": "0.5"})
    assert c.mode == "trace" and c.exports_spans
    assert c.exporters == ("file:/x/s.jsonl", "memory")
    assert (c.service_name, c.max_samples, c.queue_size, c.shutdown_timeout_s) == (
        "g1-trainer", 50, 8, 0.5)


def test_arguments_win_over_environment() -> None:
    c = Config.from_env({"RESETTRACE": "trace"}, mode="timing", max_samples=None)
    assert c.mode == "timing" and c.max_samples == 100_000


@pytest.mark.parametrize("name,value", [
    ("RESETTRACE", "verbose"),
    ("RESETTRACE_SAMPLE", "fastest:3"),
    ("RESETTRACE_SAMPLE", "slowest:0"),
    ("RESETTRACE_SAMPLE_EVERY", "0"),
    ("RESETTRACE_WORKER_RANK", "-1"),
    ("RESETTRACE_HANDLE_SIGTERM", "maybe"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://:4317"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://host:port"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten"),
    ("RESETTRACE_MAX_SAMPLES", "many"),
    ("RESETTRACE_MAX_SAMPLES", "0"),
    ("RESETTRACE_QUEUE_SIZE", "-3"),
    ("RESETTRACE_SHUTDOWN_TIMEOUT", "soon"),
    ("RESETTRACE_EXPORTER", "kafka:topic"),
])
def test_bad_values_warn_and_fall_back(caplog, name, value) -> None:
    with caplog.at_level(logging.WARNING, logger="resettrace.config"):
        c = Config.from_env({name: value})
    assert c == Config()
    assert name in caplog.text and "default" in caplog.text


def test_sdk_disabled_turns_trace_into_timing(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="resettrace.config"):
        c = Config.from_env({"RESETTRACE": "trace", "OTEL_SDK_DISABLED": "true"})
    assert c.mode == "timing" and "OTEL_SDK_DISABLED" in caplog.text


@pytest.mark.parametrize("kwargs,match", [
    ({"mode": "loud"}, "mode must be one of"),
    ({"exporters": ("file:",)}, "needs a path"),
    ({"exporters": ("zipkin",)}, "unknown exporter"),
    ({"max_samples": 0}, "max_samples"),
    ({"shutdown_timeout_s": 0}, "shutdown_timeout_s"),
])
def test_explicit_bad_arguments_raise(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        Config(**kwargs)


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unknown config option"):
        Config.from_env({}, colour="red")


def test_configure_replaces_the_default_session() -> None:
    first = resettrace.configure(mode="timing")
    assert resettrace.get_tracing() is first and first.mode == "timing"
    second = resettrace.configure(mode="off")
    assert resettrace.get_tracing() is second and resettrace.stats() == {}
    assert first.recorder().enabled is False  # a shut-down session records nothing more


def test_otlp_settings_from_the_environment() -> None:
    c = Config.from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                         "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
                         "OTEL_EXPORTER_OTLP_TIMEOUT": "5", "RESETTRACE_WORKER_RANK": "7",
                         "RESETTRACE_SAMPLE": "slowest:50", "RESETTRACE_EXPORTER": "otlp"})
    # the generic endpoint variable is a base URL: the traces path is appended
    assert c.endpoint == "http://collector:4318/v1/traces"
    assert (c.otlp_timeout_s, c.worker_rank, c.sample_slowest_window) == (5.0, 7, 50)
    specific = Config.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://a:1/x",
                                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:2",
                                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert specific.endpoint == "http://a:1/x"
    assert Config.from_env({}).endpoint == "http://localhost:4317"
    assert Config.from_env({"RANK": "3"}).worker_rank == 3


def test_contradictory_sampling_is_an_error() -> None:
    with pytest.raises(ValueError, match="contradictory sampling"):
        Config.from_env({"RESETTRACE_SAMPLE_EVERY": "10", "RESETTRACE_SAMPLE": "slowest:5"})


def test_cli_reports_contradictory_settings_without_a_traceback() -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, RESETTRACE="trace", RESETTRACE_SAMPLE_EVERY="10",
               RESETTRACE_SAMPLE="slowest:5")
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "bench", "collector",
                        "--num-envs", "4", "--steps", "1"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert "contradictory sampling" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "-1", "0", "Infinity"])
def test_non_finite_or_negative_timeouts_warn_and_fall_back(raw: str,
                                                            caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    with caplog.at_level("WARNING"):
        c = Config.from_env({"OTEL_EXPORTER_OTLP_TIMEOUT": raw,
                             "RESETTRACE_SHUTDOWN_TIMEOUT": raw})
    assert c.otlp_timeout_s == 2.0 and c.shutdown_timeout_s == 2.0
    assert "OTEL_EXPORTER_OTLP_TIMEOUT" in caplog.text
    assert "RESETTRACE_SHUTDOWN_TIMEOUT" in caplog.text
    with pytest.raises(ValueError, match="finite"):
        Config(otlp_timeout_s=float(raw) if raw != "Infinity" else math.inf)
