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
    with pytest.raises(ValueError, match="otlp_timeout_s must be"):
        Config(otlp_timeout_s=float(raw) if raw != "Infinity" else math.inf)


# -- numeric settings: one table of valid ranges ----------------------------------------------
def test_every_numeric_setting_has_a_range_enforced_from_the_environment_and_in_code(
        caplog: pytest.LogCaptureFixture) -> None:
    """Each variable of the table: a value beyond its range (1e300, 1e10, 2**63) warns,
    naming the variable and the value used, and the default is used; the same value given
    in code raises. (1e10 s of shutdown timeout crashed the CLI; 1e300 ms of metric
    interval killed the metrics thread; 1e300 ms of batch delay, the export process.)"""
    from resettrace.config import NUMBERS

    defaults = Config()
    for name, number in NUMBERS.items():
        for var in number.env:
            for raw in ("1e300", str(2**63), "-5", "1e10" if number.high < 1e10 else "1e12"):
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="resettrace.config"):
                    c = Config.from_env({var: raw})
                assert getattr(c, name) == getattr(defaults, name), (var, raw)
                if var not in ("RANK", "SLURM_PROCID"):  # a launcher's: used when valid,
                    # else quiet
                    assert var in caplog.text and "default" in caplog.text, (var, raw)
        if name in ("sample_slowest_window", "metrics_timeout_s"):
            continue
        too_big = number.high * number.scale * 10
        with pytest.raises(ValueError, match=name):
            Config(**{name: number.kind(too_big)})


@pytest.mark.parametrize("var,raw,field,value", [
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "3600", "otlp_timeout_s", 3600.0),
    ("OTEL_METRIC_EXPORT_INTERVAL", "250", "metrics_interval_s", 0.25),
    ("OTEL_BSP_SCHEDULE_DELAY", "0", "export_delay_s", 0.0),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "65536", "export_batch_size", 65536),
    ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "0.5", "metrics_timeout_s", 0.5),
    ("RESETTRACE_WORKER_RANK", str(2**31 - 1), "worker_rank", 2**31 - 1),
])
def test_values_at_the_edge_of_a_range_are_used(var, raw, field, value) -> None:
    assert getattr(Config.from_env({var: raw}), field) == value


def test_cli_with_huge_timeouts_and_intervals_warns_and_finishes(tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    env.update(RESETTRACE="trace", RESETTRACE_SHUTDOWN_TIMEOUT="1e10",
               OTEL_METRIC_EXPORT_INTERVAL="1e300", OTEL_BSP_SCHEDULE_DELAY="1e300",
               RESETTRACE_METRICS="otlp", OTEL_EXPORTER_OTLP_TIMEOUT="1e10")
    from resettrace.testing.receivers import GrpcMetricsReceiver, GrpcReceiver

    with GrpcReceiver() as rx, GrpcMetricsReceiver() as mrx:
        env.update(RESETTRACE_EXPORTER="otlp", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=rx.endpoint,
                   OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=mrx.endpoint)
        r = subprocess.run([sys.executable, "-m", "resettrace.cli", "bench", "collector",
                            "--num-envs", "4", "--warmup", "0", "--steps", "3", "--nthread",
                            "1", "--out", str(tmp_path / "run")], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        held = len(rx.span_keys())
        assert mrx.last() is not None  # the last push at shutdown arrived
    assert "Traceback" not in r.stderr
    for var in ("RESETTRACE_SHUTDOWN_TIMEOUT", "OTEL_METRIC_EXPORT_INTERVAL",
                "OTEL_BSP_SCHEDULE_DELAY", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        assert r.stderr.count(var) == 1, r.stderr  # said once
    export = json.loads((tmp_path / "run" / "timing.json").read_text())["export"]
    assert export["exporters"]["otlp"]["delivered"] == held == export["spans_sent"] > 0
    assert export["metrics"]["otlp_failed"] == 0


# -- exporters named twice ----------------------------------------------------------------
def test_an_exporter_named_twice_is_used_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        c = Config.from_env({"RESETTRACE_EXPORTER": "otlp,file:a.jsonl,otlp,file:./a.jsonl"})
    assert c.exporters == ("otlp", "file:a.jsonl")
    assert caplog.text.count("named twice") == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        assert Config(exporters=("memory", "memory")).exporters == ("memory",)
    assert "named twice" in caplog.text


def test_two_file_kinds_on_one_path_are_an_error() -> None:
    with pytest.raises(ValueError, match="one path"):
        Config(exporters=("file:x.json", "jaeger-json:./x.json"))


def test_otlp_named_twice_delivers_each_span_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """"delivered 240 of 120 sent", a negative loss warning and 120 duplicates before."""
    from helpers import record_traces
    from resettrace.testing.receivers import GrpcReceiver
    from resettrace.tracing.session import Tracing

    with GrpcReceiver() as rx:
        session = Tracing(Config.from_env(
            {"RESETTRACE": "trace", "RESETTRACE_EXPORTER": "otlp,otlp",
             "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint}))
        record_traces(session, 60, count=1, plan=False)
        session.shutdown()
        assert len(rx.spans()) == len(rx.span_keys()) == 120
    report = session.export_report()
    assert list(report["exporters"]) == ["otlp"]
    assert report["exporters"]["otlp"]["delivered"] == 120 == report["spans_sent"]
    assert report["spans_not_delivered"] == 0


# -- ranks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("raw", [str(2**63), str(2**63 - 1), "-1", "seven"])
def test_a_bad_rank_warns_with_the_rank_actually_used(raw: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="resettrace.config"):
        assert Config.from_env({"RESETTRACE_WORKER_RANK": raw}).worker_rank == 0
    assert "RESETTRACE_WORKER_RANK" in caplog.text and "the default 0" in caplog.text
    assert "-1" not in caplog.text.replace(repr(raw), "")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="resettrace.config"):
        assert Config.from_env({"RESETTRACE_WORKER_RANK": raw, "RANK": "5"}).worker_rank == 5
    assert "using RANK=5" in caplog.text


def test_a_huge_rank_never_reaches_the_exporters(tmp_path, monkeypatch) -> None:
    """2**63 reached OTLP as -2**63 and broke otlp-json with a traceback."""
    import json

    from resettrace import catalog as C
    from resettrace.tracing.session import Tracing

    path = tmp_path / "spans.otlp.json"
    session = Tracing(Config.from_env({"RESETTRACE": "trace",
                                       "RESETTRACE_EXPORTER": f"otlp-json:{path}",
                                       "RESETTRACE_WORKER_RANK": str(2**63)}))
    with session.recorder().scope(C.DR_RESET, 1):
        pass
    session.shutdown()
    assert session.export_report()["exporters"][f"otlp-json:{path}"]["delivered"] == 1
    doc = json.loads(path.read_text().splitlines()[0])
    attrs = {a["key"]: a["value"] for a in doc["resourceSpans"][0]["resource"]["attributes"]}
    assert attrs["resettrace.worker.rank"] == {"intValue": "0"}


# -- compression ------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,used", [("brotli", "none"), ("GZIP", "gzip"), ("deflate",
                                                                                "deflate")])
def test_compression_is_checked_and_an_unknown_one_falls_back(raw, used, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="resettrace.config"):
        c = Config.from_env({"OTEL_EXPORTER_OTLP_COMPRESSION": raw})
    assert c.otlp_compression == used
    assert ("OTEL_EXPORTER_OTLP_COMPRESSION" in caplog.text) == (used == "none")


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_unknown_compression_still_delivers_every_span(protocol: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """"brotli" dropped every span (the export process could not build its exporter)."""
    from resettrace import catalog as C
    from resettrace.testing.receivers import GrpcReceiver, HttpReceiver
    from resettrace.tracing.session import Tracing

    # the export process's SDK exporter reads the variable too: it must not see it raw
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli")
    with (GrpcReceiver() if protocol == "grpc" else HttpReceiver()) as rx:
        session = Tracing(Config.from_env(
            {"RESETTRACE": "trace", "RESETTRACE_EXPORTER": "otlp",
             "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.endpoint,
             "OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}))
        for _ in range(64):
            with session.recorder().scope(C.DR_RESET, 1):
                pass
        session.shutdown()
        assert len(rx.span_keys()) == 64
    assert session.export_report()["exporters"]["otlp"]["delivered"] == 64


#: a traced step in a process of its own: what it printed is all it said
_TRACED_STEP = """
import resettrace
from resettrace import catalog as C

rec = resettrace.recorder(backend="b", task="t")
for _ in range(3):
    with rec.scope(C.RESET_DONE, 2):
        pass
print("steps done")
"""


def _traced_step(tmp_path, **env: str):
    import subprocess
    import sys

    from helpers import clean_env

    return subprocess.run([sys.executable, "-c", _TRACED_STEP], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=clean_env(**env))


_HUGE = "9" * 400
_NUMERIC = ("RESETTRACE_SAMPLE_EVERY", "RESETTRACE_MAX_SAMPLES", "RESETTRACE_QUEUE_SIZE",
            "RESETTRACE_SHUTDOWN_TIMEOUT", "RESETTRACE_WORKER_RANK",
            "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
            "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            "OTEL_BSP_SCHEDULE_DELAY")


def test_a_number_of_any_length_is_one_warning_not_a_traceback(tmp_path) -> None:
    """Every numeric setting 400 digits long (past a float's range): the process runs
    and exports, each variable said once; RANK (the launcher's) is not used."""
    env = {name: _HUGE for name in _NUMERIC}
    r = _traced_step(tmp_path, RESETTRACE="trace", RESETTRACE_EXPORTER="file:spans.jsonl",
                     RANK=_HUGE, RESETTRACE_SAMPLE=f"slowest:{_HUGE}", **env)
    assert r.returncode == 0 and "steps done" in r.stdout, r.stderr
    assert "Traceback" not in r.stderr and "OverflowError" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    for name in (*_NUMERIC, "RESETTRACE_SAMPLE"):
        said = [line for line in lines if line.startswith(f"{name}=")]
        assert len(said) == 1 and "default" in said[0], (name, r.stderr)
    assert len((tmp_path / "spans.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("name", ["RANK", "RESETTRACE_SAMPLE_EVERY", "RESETTRACE_QUEUE_SIZE",
                                  "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"])
def test_one_huge_number_alone(tmp_path, name) -> None:
    r = _traced_step(tmp_path, RESETTRACE="timing", **{name: _HUGE})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize(("env", "name"), [
    ({"RESETTRACE_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://collector x"},
     "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"RESETTRACE_EXPORTER": "otlp", "RESETTRACE_METRICS": "otlp",
      "OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://collector x"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"RESETTRACE_EXPORTER": "abc"}, "RESETTRACE_EXPORTER"),
], ids=["endpoint", "endpoint-and-metrics", "exporter"])
def test_each_bad_setting_is_said_once(tmp_path, env, name) -> None:
    """However many readers a setting has (the session, the export process, the summary,
    OTLP metrics), one bad value is one line."""
    r = _traced_step(tmp_path, RESETTRACE="trace", **env)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if name in line]
    assert len(said) == 1, r.stderr
