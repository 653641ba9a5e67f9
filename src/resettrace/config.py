"""Configuration: explicit arguments > ``RESETTRACE_*`` / ``OTEL_*`` variables > defaults.

Variables read (all optional):

``RESETTRACE``
    ``off`` (default): no recording, ``set_state`` returns ``None``.
    ``timing``: aggregate phase timings (set_state returns its timing dict).
    ``trace``: aggregate and export every phase as an OpenTelemetry span.
``RESETTRACE_EXPORTER``
    Comma-separated span sinks for ``trace`` mode: ``otlp`` (OTLP to a collector),
    ``file:PATH`` (JSON lines, one span per line), ``perfetto:PATH`` (Chrome trace
    JSON for Perfetto / chrome://tracing), ``otlp-json:PATH`` (OTLP-JSON, which
    Jaeger's UI sends to a running Jaeger to convert), ``jaeger-json:PATH`` (Jaeger UI
    JSON: opens in Jaeger's UI with no server) or ``memory`` (tests). Paths may hold
    ``{pid}`` and ``{rank}``. Default ``file:resettrace-spans.jsonl``
    (none when spans go to a tracer provider passed in code).
``RESETTRACE_SAMPLE_EVERY``
    Export 1 trace in K (default 1: every trace).
``RESETTRACE_SAMPLE``
    ``all`` (default) or ``slowest:W``: export only the trace with the slowest
    ``reset_done`` of each window of W traces. Cannot be combined with
    ``RESETTRACE_SAMPLE_EVERY`` > 1. Timing statistics always see every trace.
``RESETTRACE_MAX_SAMPLES``
    Samples kept per timing key for percentiles (reservoir beyond it); count, mean,
    max and total stay exact. Default 100000.
``RESETTRACE_QUEUE_SIZE``
    Finished traces waiting for span export; beyond it traces are dropped and
    counted, never blocking the training thread. Default 4096.
``RESETTRACE_SHUTDOWN_TIMEOUT``
    Seconds the exporters may take to flush at shutdown. Default 2.
``RESETTRACE_WORKER_RANK``
    Rank of this worker process (resource attribute ``resettrace.worker.rank``);
    falls back to ``RANK``, then 0.
``RESETTRACE_HANDLE_SIGTERM``
    ``1`` (default): in ``trace`` mode, flush spans on SIGTERM before the process
    ends (only when no other SIGTERM handler is installed).
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    Collector endpoint for ``otlp``. Default ``http://localhost:4317`` (gRPC) or
    ``http://localhost:4318/v1/traces`` (HTTP; the generic variable is a base URL to
    which ``/v1/traces`` is appended, the ``TRACES`` one is used as it is).
``OTEL_EXPORTER_OTLP_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``
    ``grpc`` (default) or ``http/protobuf``.
``OTEL_EXPORTER_OTLP_TIMEOUT``
    Seconds one OTLP export may take. Default 2.
``OTEL_SDK_DISABLED``
    ``true`` turns ``trace`` into ``timing`` (no span is built).
``OTEL_SERVICE_NAME``
    ``service.name`` of exported spans. Default ``resettrace``.

A malformed value (non-finite and negative numbers included) is logged as a warning naming
the variable and the default used;
contradictory settings raise ``ValueError``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

MODES = ("off", "timing", "trace")
ENV_MODE = "RESETTRACE"
ENV_EXPORTER = "RESETTRACE_EXPORTER"
ENV_SAMPLE_EVERY = "RESETTRACE_SAMPLE_EVERY"
ENV_SAMPLE = "RESETTRACE_SAMPLE"
ENV_MAX_SAMPLES = "RESETTRACE_MAX_SAMPLES"
ENV_QUEUE_SIZE = "RESETTRACE_QUEUE_SIZE"
ENV_SHUTDOWN_TIMEOUT = "RESETTRACE_SHUTDOWN_TIMEOUT"
ENV_WORKER_RANK = "RESETTRACE_WORKER_RANK"
ENV_HANDLE_SIGTERM = "RESETTRACE_HANDLE_SIGTERM"
ENV_METRICS = "RESETTRACE_METRICS"
ENV_METRIC_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
#: the Prometheus scrape port when ``prometheus`` names none (OpenTelemetry's)
DEFAULT_PROMETHEUS_PORT = 9464
ENV_SDK_DISABLED = "OTEL_SDK_DISABLED"
ENV_SERVICE_NAME = "OTEL_SERVICE_NAME"
ENV_OTLP_ENDPOINT = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
ENV_OTLP_PROTOCOL = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
ENV_OTLP_TIMEOUT = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")

#: exporter kinds; those in PATH_KINDS take ``kind:PATH``
EXPORTER_KINDS = ("otlp", "file", "perfetto", "otlp-json", "jaeger-json", "memory")
PATH_KINDS = ("file", "perfetto", "otlp-json", "jaeger-json")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_EXPORTERS = ("file:resettrace-spans.jsonl",)
DEFAULT_OTLP_ENDPOINT = {"grpc": "http://localhost:4317",
                         "http/protobuf": "http://localhost:4318/v1/traces"}


@dataclass(frozen=True, kw_only=True)
class Config:
    """Resolved tracing settings. Build with :meth:`from_env` or directly."""

    #: ``off``, ``timing`` or ``trace``.
    mode: str = "off"
    #: Span sinks for ``trace`` mode, e.g. ``("otlp", "file:spans.jsonl")``; empty:
    #: :data:`DEFAULT_EXPORTERS`, unless a tracer provider is passed to the session.
    exporters: tuple[str, ...] = ()
    #: Export 1 trace in ``sample_every``.
    sample_every: int = 1
    #: Export only the slowest reset_done trace of each window of this many traces.
    sample_slowest_window: int | None = None
    #: ``service.name`` resource attribute of exported spans.
    service_name: str = "resettrace"
    #: Samples kept per key for percentiles.
    max_samples: int = 100_000
    #: Finished traces queued for export before dropping.
    queue_size: int = 4096
    #: Seconds allowed for the final flush.
    shutdown_timeout_s: float = 2.0
    #: ``resettrace.worker.rank`` of this process.
    worker_rank: int = 0
    #: Flush spans on SIGTERM (trace mode, when no other handler is installed).
    handle_sigterm: bool = True
    #: OTLP collector endpoint (``None``: the protocol's localhost default).
    otlp_endpoint: str | None = None
    #: ``grpc`` or ``http/protobuf``.
    otlp_protocol: str = "grpc"
    #: Seconds one OTLP export may take.
    otlp_timeout_s: float = 2.0
    #: Extra resource attributes for exported spans.
    resource_attributes: Mapping[str, Any] = field(default_factory=dict)
    #: metrics of the aggregated statistics: ``otlp``, ``prometheus[:PORT]``
    #: (``RESETTRACE_METRICS``)
    metrics: tuple[str, ...] = ()
    #: seconds between OTLP metric exports (``OTEL_METRIC_EXPORT_INTERVAL``, ms)
    metrics_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if isinstance(self.exporters, str):
            object.__setattr__(self, "exporters", _split_exporters(self.exporters))
        for spec in self.exporters:
            problem = exporter_problem(spec)
            if problem:
                raise ValueError(problem)
        if self.sample_every < 1:
            raise ValueError(f"sample_every must be >= 1, got {self.sample_every}")
        if self.sample_slowest_window is not None:
            if self.sample_slowest_window < 1:
                raise ValueError("sample_slowest_window must be >= 1, got "
                                 f"{self.sample_slowest_window}")
            if self.sample_every > 1:
                raise ValueError("contradictory sampling: choose either 1 in K "
                                 f"({ENV_SAMPLE_EVERY}) or slowest:W ({ENV_SAMPLE})")
        if self.max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {self.max_samples}")
        if self.queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {self.queue_size}")
        if not 0 < self.shutdown_timeout_s < math.inf:
            raise ValueError("shutdown_timeout_s must be a finite number > 0, got "
                             f"{self.shutdown_timeout_s}")
        if self.otlp_protocol not in OTLP_PROTOCOLS:
            raise ValueError(f"otlp_protocol must be one of {', '.join(OTLP_PROTOCOLS)}, "
                             f"got {self.otlp_protocol!r}")
        if self.otlp_endpoint is not None and endpoint_problem(self.otlp_endpoint):
            raise ValueError(f"otlp_endpoint {self.otlp_endpoint!r}: "
                             f"{endpoint_problem(self.otlp_endpoint)}")
        if not 0 < self.otlp_timeout_s < math.inf:
            raise ValueError("otlp_timeout_s must be a finite number > 0, got "
                             f"{self.otlp_timeout_s}")
        if isinstance(self.metrics, str):
            object.__setattr__(self, "metrics", tuple(
                x.strip() for x in self.metrics.split(",") if x.strip()))
        for spec in self.metrics:
            problem = metrics_problem(spec)
            if problem:
                raise ValueError(problem)
        if not 0 < self.metrics_interval_s < math.inf:
            raise ValueError("metrics_interval_s must be a finite number > 0, got "
                             f"{self.metrics_interval_s}")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def exports_spans(self) -> bool:
        return self.mode == "trace"

    @property
    def endpoint(self) -> str:
        """The OTLP endpoint in use (the protocol's default when none is set)."""
        return self.otlp_endpoint or DEFAULT_OTLP_ENDPOINT[self.otlp_protocol]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Read the environment; keyword ``overrides`` (not ``None``) win over it."""
        env = os.environ if environ is None else environ
        d = cls()
        values: dict[str, Any] = {
            "mode": _choice(env, ENV_MODE, MODES, d.mode),
            "exporters": _exporters(env, d.exporters),
            "service_name": env.get(ENV_SERVICE_NAME, "").strip() or d.service_name,
            "max_samples": _number(env, ENV_MAX_SAMPLES, int, d.max_samples, minimum=1),
            "queue_size": _number(env, ENV_QUEUE_SIZE, int, d.queue_size, minimum=1),
            "shutdown_timeout_s": _number(env, ENV_SHUTDOWN_TIMEOUT, float,
                                          d.shutdown_timeout_s, minimum=1e-3),
            "sample_every": _number(env, ENV_SAMPLE_EVERY, int, d.sample_every, minimum=1),
            "sample_slowest_window": _slowest(env),
            "worker_rank": _rank(env),
            "handle_sigterm": _flag(env, ENV_HANDLE_SIGTERM, d.handle_sigterm),
            "otlp_protocol": _otlp_protocol(env),
            "otlp_timeout_s": _first_number(env, ENV_OTLP_TIMEOUT, d.otlp_timeout_s),
            "metrics": _metrics(env),
            "metrics_interval_s": _number(env, ENV_METRIC_INTERVAL, float,
                                          1e3 * d.metrics_interval_s, minimum=1.0) / 1e3,
        }
        values["otlp_endpoint"] = _otlp_endpoint(env, values["otlp_protocol"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown config option(s): {', '.join(sorted(unknown))}")
        if values["mode"] == "trace" and env.get(ENV_SDK_DISABLED, "").strip().lower() == "true":
            log.warning("%s=true: tracing mode 'trace' runs as 'timing' (no spans built)",
                        ENV_SDK_DISABLED)
            values["mode"] = "timing"
        return cls(**values)


def exporter_problem(spec: str) -> str | None:
    """Why ``spec`` is not a valid exporter item, or ``None``."""
    kind, sep, arg = spec.partition(":")
    if kind not in EXPORTER_KINDS:
        return f"unknown exporter {spec!r}; known: otlp, file:PATH, perfetto:PATH, " \
               "otlp-json:PATH, jaeger-json:PATH, memory"
    if kind in PATH_KINDS and not arg:
        return f"exporter {spec!r} needs a path: {kind}:PATH"
    if kind not in PATH_KINDS and sep:
        return f"exporter {kind!r} takes no argument, got {spec!r}"
    return None


def metrics_problem(spec: str) -> str | None:
    """Why ``spec`` is not a valid ``RESETTRACE_METRICS`` item, or ``None``."""
    kind, sep, arg = spec.partition(":")
    if kind == "otlp" and not sep:
        return None
    if kind == "prometheus":
        if not sep:
            return None
        if arg.isdigit() and 0 < int(arg) < 65536:
            return None
        return f"metrics {spec!r}: the port must be a number in 1-65535"
    return f"unknown metrics {spec!r}; known: otlp, prometheus, prometheus:PORT"


def _metrics(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get(ENV_METRICS, "").strip()
    if not raw or raw.lower() in ("off", "0", "false", "no"):
        return ()
    good = []
    for spec in (x.strip() for x in raw.split(",") if x.strip()):
        problem = metrics_problem(spec)
        if problem:
            log.warning("%s: ignoring %r: %s", ENV_METRICS, spec, problem)
            continue
        good.append(spec)
    return tuple(good)


def endpoint_problem(url: str) -> str | None:
    """Why ``url`` is not a usable OTLP endpoint, or ``None``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return str(e)
    if parts.scheme not in ("http", "https"):
        return "needs an http:// or https:// scheme (without one gRPC means TLS)"
    if not parts.hostname:
        return "has no host"
    del port
    return None


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in ("0", "false", "no"):
        value = "off"
    if value not in choices:
        log.warning("%s=%r is not one of %s; using the default %r", name, raw,
                    ", ".join(choices), default)
        return default
    return value


def _number(env: Mapping[str, str], name: str, kind: type, default: Any, *,
            minimum: float) -> Any:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        log.warning("%s=%r is not a valid %s; using the default %r", name, raw, kind.__name__,
                    default)
        return default
    if kind is float and not math.isfinite(value):
        log.warning("%s=%r is not a finite number; using the default %r", name, raw, default)
        return default
    if value < minimum:
        log.warning("%s=%r is below %s; using the default %r", name, raw, minimum, default)
        return default
    return value


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str | None]:
    for name in names:
        raw = env.get(name)
        if raw is not None and raw.strip():
            return name, raw.strip()
    return names[-1], None


def _first_number(env: Mapping[str, str], names: tuple[str, ...], default: float) -> float:
    name, raw = _first(env, names)
    if raw is None:
        return default
    return float(_number({name: raw}, name, float, default, minimum=1e-3))


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    log.warning("%s=%r is not a boolean; using the default %r", name, raw, default)
    return default


def _slowest(env: Mapping[str, str]) -> int | None:
    raw = env.get(ENV_SAMPLE)
    if raw is None or not raw.strip() or raw.strip().lower() == "all":
        return None
    kind, _, arg = raw.strip().partition(":")
    try:
        window = int(arg)
    except ValueError:
        window = 0
    if kind != "slowest" or window < 1:
        log.warning("%s=%r is not 'all' or 'slowest:W' (W >= 1); using the default 'all'",
                    ENV_SAMPLE, raw)
        return None
    return window


def _rank(env: Mapping[str, str]) -> int:
    rank = env_worker_rank(env)
    return 0 if rank is None else rank


def env_worker_rank(env: Mapping[str, str] | None = None) -> int | None:
    """``RESETTRACE_WORKER_RANK``, else ``RANK``, when one holds a valid rank; else None."""
    env = os.environ if env is None else env
    for name in (ENV_WORKER_RANK, "RANK"):
        raw = env.get(name)
        if raw is not None and raw.strip():
            value = _number({name: raw}, name, int, -1, minimum=0)
            if value >= 0:
                return int(value)
    return None


def _otlp_protocol(env: Mapping[str, str]) -> str:
    name, raw = _first(env, ENV_OTLP_PROTOCOL)
    if raw is None:
        return "grpc"
    if raw not in OTLP_PROTOCOLS:
        log.warning("%s=%r is not one of %s; using the default 'grpc'", name, raw,
                    ", ".join(OTLP_PROTOCOLS))
        return "grpc"
    return raw


def _otlp_endpoint(env: Mapping[str, str], protocol: str) -> str | None:
    name, raw = _first(env, ENV_OTLP_ENDPOINT)
    if raw is None:
        return None
    problem = endpoint_problem(raw)
    if problem:
        log.warning("%s=%r %s; using the default %r", name, raw, problem,
                    DEFAULT_OTLP_ENDPOINT[protocol])
        return None
    if protocol == "http/protobuf" and name == "OTEL_EXPORTER_OTLP_ENDPOINT":
        # the generic variable is a base URL: the traces path is appended
        return raw.rstrip("/") + "/v1/traces"
    return raw


def _split_exporters(raw: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in raw.split(",") if s.strip())


def _exporters(env: Mapping[str, str], default: tuple[str, ...]) -> tuple[str, ...]:
    raw = env.get(ENV_EXPORTER)
    if raw is None or not raw.strip():
        return default
    good = []
    for spec in _split_exporters(raw):
        problem = exporter_problem(spec)
        if problem:
            log.warning("%s: ignoring %r: %s", ENV_EXPORTER, spec, problem)
            continue
        good.append(spec)
    if not good:
        log.warning("%s=%r names no usable exporter; using the default %r", ENV_EXPORTER, raw,
                    ",".join(default or DEFAULT_EXPORTERS))
        return default
    return tuple(good)
