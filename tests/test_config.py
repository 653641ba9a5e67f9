"""Configuration precedence and the handling of bad environment values."""

from __future__ import annotations

import logging

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
