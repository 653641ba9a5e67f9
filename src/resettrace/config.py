"""Configuration: explicit arguments > ``RESETTRACE_*`` / ``OTEL_*`` variables > defaults.

The variables, what each takes, its default and (a number) its valid range are listed
once, in :data:`resettrace.settings.SETTINGS`, from which docs/configuration.md's table and
``resettrace --help``'s list are generated; the ranges are :data:`NUMBERS`' and
:data:`NUMBERS_OF_RUNS`'.

A malformed value (not a number, not finite, out of range, or not one of the choices) is
logged as a warning naming the variable and the value used instead, once per process
however many readers the setting has; the same values given as arguments raise
``ValueError``, and so do contradictory settings. A number is bounded before it is
computed with: one of any length is a warning, never an ``OverflowError``.

The OpenTelemetry SDK reads some ``OTEL_*`` variables itself when resettrace makes an OTLP
exporter (headers, timeouts, compression, TLS files, the gRPC retry codes, credential
providers, span limits: :func:`sdk_environment_problems`). Each is checked first; a
malformed one is said in one line and left out of what the SDK sees, so the SDK uses its
default and the exporter is still made. ``OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)HEADERS``
hold credentials: the line names the variable, never its value (the SDK's own warning
would print it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from resettrace.catalog import span_attributes
from resettrace.envvars import (
    INT_MAX,
    MAX_NUMBER_TEXT,
    Number,
    first_set,
    fmt_number,
    say_once,  # noqa: F401  (its name here too, as before)
    shown,
    warn_env,
)
from resettrace.launcher import (  # noqa: F401  (the rank's names here too, as before)
    ENV_PARENT_RANK,
    ENV_RANK,
    ENV_WORKER_RANK,
    WORKER_RANK,
    env_worker_rank,
    process_rank,
)

log = logging.getLogger(__name__)

MODES = ("off", "timing", "trace")
ENV_MODE = "RESETTRACE"
ENV_EXPORTER = "RESETTRACE_EXPORTER"
ENV_SAMPLE_EVERY = "RESETTRACE_SAMPLE_EVERY"
ENV_SAMPLE = "RESETTRACE_SAMPLE"
ENV_MAX_SAMPLES = "RESETTRACE_MAX_SAMPLES"
ENV_QUEUE_SIZE = "RESETTRACE_QUEUE_SIZE"
ENV_AGGREGATE_QUEUE = "RESETTRACE_AGGREGATE_QUEUE"
ENV_SHUTDOWN_TIMEOUT = "RESETTRACE_SHUTDOWN_TIMEOUT"
ENV_HANDLE_SIGTERM = "RESETTRACE_HANDLE_SIGTERM"
ENV_METRICS = "RESETTRACE_METRICS"
#: the folder of the Prometheus ``file_sd`` files of the processes that serve metrics
ENV_PROMETHEUS_SD = "RESETTRACE_PROMETHEUS_SD"
ENV_METRIC_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
ENV_METRICS_TIMEOUT = "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"
ENV_BATCH_SIZE = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
ENV_BATCH_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
#: the Prometheus scrape port when ``prometheus`` names none (OpenTelemetry's)
DEFAULT_PROMETHEUS_PORT = 9464
#: the address the Prometheus endpoint binds when ``prometheus`` names none: loopback only
DEFAULT_PROMETHEUS_HOST = "127.0.0.1"
ENV_SDK_DISABLED = "OTEL_SDK_DISABLED"
ENV_SERVICE_NAME = "OTEL_SERVICE_NAME"
ENV_OTLP_ENDPOINT = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
ENV_OTLP_PROTOCOL = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
ENV_OTLP_TIMEOUT = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
ENV_OTLP_INSECURE = ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE")
ENV_OTLP_COMPRESSION = ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
                        "OTEL_EXPORTER_OTLP_COMPRESSION")
#: a run record path for every process (``{pid}``, ``{rank}``), written at exit
ENV_RUN_JSON = "RESETTRACE_RUN_JSON"
#: seconds between the snapshots of a process's run record (0: only at exit)
ENV_RECORD_PERIOD = "RESETTRACE_RECORD_PERIOD"
#: seconds ``resettrace run`` waits for a member still running (or late) after its command
ENV_JOB_WAIT = "RESETTRACE_JOB_WAIT"
#: the id of one ``resettrace run``: its processes' records carry it
ENV_RUN_ID = "RESETTRACE_RUN_ID"
#: ``resettrace run``'s summary: ``1`` print it, ``0`` not
ENV_RUN_SUMMARY = "RESETTRACE_RUN_SUMMARY"
#: pid of the command's main process of a ``resettrace run`` (set by the first process)
ENV_RUN_OWNER = "RESETTRACE_RUN_OWNER"
#: a TOML spec of functions to record, installed by ``import resettrace``
ENV_INSTRUMENT = "RESETTRACE_INSTRUMENT"
#: the prefix of ``resettrace run``'s own variables (above)
ENV_RUN_PREFIX = "RESETTRACE_RUN_"
#: how the export process encodes spans: ``records`` (every format written from the
#: records, the default) or ``sdk`` (SDK spans built first: the reference the record
#: encoders are checked against)
ENV_SPAN_ENCODER = "RESETTRACE_SPAN_ENCODER"
#: a CA certificate for OTLP over TLS (``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_CERTIFICATE``
#: first): the signal-specific name is ``ENV_OTLP_CERTIFICATE.format(signal="TRACES_")``
ENV_OTLP_CERTIFICATE = "OTEL_EXPORTER_OTLP_{signal}CERTIFICATE"
#: the OTLP/HTTP exporter's own credential provider (``signal``: ``TRACES`` or
#: ``METRICS``): when set, it builds the HTTP session, not the certificate above
ENV_OTLP_HTTP_CREDENTIAL_PROVIDER = "OTEL_PYTHON_EXPORTER_OTLP_HTTP_{signal}_CREDENTIAL_PROVIDER"

#: exporter kinds; those in PATH_KINDS take ``kind:PATH``
EXPORTER_KINDS = ("otlp", "file", "perfetto", "otlp-json", "jaeger-json", "memory")
PATH_KINDS = ("file", "perfetto", "otlp-json", "jaeger-json")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
OTLP_COMPRESSIONS = ("none", "gzip", "deflate")
SPAN_ENCODERS = ("records", "sdk")
DEFAULT_EXPORTERS = ("file:resettrace-spans.jsonl",)
DEFAULT_OTLP_ENDPOINT = {"grpc": "http://localhost:4317",
                         "http/protobuf": "http://localhost:4318/v1/traces"}

#: every numeric field of :class:`Config`, with its variables and valid range
NUMBERS: dict[str, Number] = {
    "sample_every": Number((ENV_SAMPLE_EVERY,), int, 1, INT_MAX),
    "sample_slowest_window": Number((), int, 1, INT_MAX),
    "max_samples": Number((ENV_MAX_SAMPLES,), int, 1, 10**8),
    "queue_size": Number((ENV_QUEUE_SIZE,), int, 1, 10**7),
    "aggregate_queue": Number((ENV_AGGREGATE_QUEUE,), int, 1, 10**8),
    "shutdown_timeout_s": Number((ENV_SHUTDOWN_TIMEOUT,), float, 1e-3, 3600.0),
    "worker_rank": WORKER_RANK,
    "otlp_timeout_s": Number(ENV_OTLP_TIMEOUT, float, 1e-3, 3600.0),
    "metrics_timeout_s": Number((ENV_METRICS_TIMEOUT,), float, 1e-3, 3600.0),
    "metrics_interval_s": Number((ENV_METRIC_INTERVAL,), float, 1.0, 86_400_000.0, 1e-3),
    "export_batch_size": Number((ENV_BATCH_SIZE,), int, 1, 65536),
    "export_delay_s": Number((ENV_BATCH_DELAY,), float, 0.0, 3_600_000.0, 1e-3),
}


#: the numeric settings of run records and jobs (not :class:`Config` fields), and their
#: defaults (:func:`run_number`)
NUMBERS_OF_RUNS: dict[str, Number] = {
    "record_period_s": Number((ENV_RECORD_PERIOD,), float, 0.0, 86_400.0),
    "job_wait_s": Number((ENV_JOB_WAIT,), float, 0.0, 86_400.0),
}
RUN_DEFAULTS: dict[str, float] = {"record_period_s": 5.0, "job_wait_s": 10.0}


def run_number(name: str, environ: Mapping[str, str] | None = None) -> float:
    """The setting ``name`` of :data:`NUMBERS_OF_RUNS` from the environment: its default
    when unset; a bad value is said once (naming the variable and the default used) and
    the default used."""
    env = os.environ if environ is None else environ
    number, default = NUMBERS_OF_RUNS[name], RUN_DEFAULTS[name]
    var = number.env[0]
    raw = env.get(var, "").strip()
    if not raw:
        return default
    value, problem = number.parse(raw)
    if problem is not None:
        warn_env(env, "%s=%s %s; using the default %g", var, shown(raw), problem, default)
        return default
    return float(value)


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
    #: Finished traces queued for the aggregation thread before dropping (each counted:
    #: ``Tracing.dropped_traces``); under 1 KB each (a 592,747-trace backlog held 526 MiB).
    aggregate_queue: int = 100_000
    #: Seconds allowed for the final flush.
    shutdown_timeout_s: float = 2.0
    #: ``resettrace.worker.rank`` of this process.
    worker_rank: int = 0
    #: Flush spans on SIGTERM (trace mode, when no other handler is installed).
    handle_sigterm: bool = True
    #: OTLP collector endpoint (``None``: the protocol's localhost default).
    otlp_endpoint: str | None = None
    #: gRPC without TLS (``None``: from the endpoint's scheme; a ``HOST:PORT`` endpoint
    #: without one means TLS)
    otlp_insecure: bool | None = None
    #: ``grpc`` or ``http/protobuf``.
    otlp_protocol: str = "grpc"
    #: Seconds one OTLP export may take.
    otlp_timeout_s: float = 2.0
    #: ``none``, ``gzip`` or ``deflate``.
    otlp_compression: str = "none"
    #: Why the ``otlp`` exporter and OTLP metrics cannot send (an unusable endpoint in the
    #: environment): they then send nothing, and count what they did not send.
    otlp_refused: str | None = None
    #: Extra resource attributes for exported spans, as OpenTelemetry carries them (a
    #: numpy scalar becomes its Python value; a value it cannot carry raises here, naming
    #: its key: :func:`resettrace.catalog.span_attributes`)
    resource_attributes: Mapping[str, Any] = field(default_factory=dict)
    #: metrics of the aggregated statistics: ``otlp``, ``prometheus[:[HOST:]PORT]``
    #: (``RESETTRACE_METRICS``; PORT 0: a port the OS chooses)
    metrics: tuple[str, ...] = ()
    #: a folder where each process serving Prometheus metrics writes a ``file_sd`` file
    #: naming its endpoint (``RESETTRACE_PROMETHEUS_SD``; ``None``: none is written)
    prometheus_sd: str | None = None
    #: seconds between OTLP metric exports (``OTEL_METRIC_EXPORT_INTERVAL``, ms)
    metrics_interval_s: float = 60.0
    #: seconds one OTLP metrics push may take (``None``: ``otlp_timeout_s``)
    metrics_timeout_s: float | None = None
    #: spans per export call (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``)
    export_batch_size: int = 512
    #: seconds a span waits at most for its export call (``OTEL_BSP_SCHEDULE_DELAY``, ms)
    export_delay_s: float = 1.0
    #: how the export process encodes spans: ``records`` or ``sdk``
    #: (``RESETTRACE_SPAN_ENCODER``)
    span_encoder: str = "records"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if isinstance(self.exporters, str):
            object.__setattr__(self, "exporters", _split_exporters(self.exporters))
        for spec in self.exporters:
            problem = exporter_problem(spec)
            if problem:
                raise ValueError(problem)
        exporters, problems = unique_exporters(self.exporters)
        for problem in problems:
            if "one path" in problem:
                raise ValueError(problem)
            log.warning("resettrace: %s", problem)
        object.__setattr__(self, "exporters", exporters)
        for name, number in NUMBERS.items():
            value = getattr(self, name)
            if value is None and name in ("sample_slowest_window", "metrics_timeout_s"):
                continue
            problem = number.problem(value)
            if problem:
                raise ValueError(f"{name} {problem}, got {value!r}")
        if self.sample_slowest_window is not None and self.sample_every > 1:
            raise ValueError("contradictory sampling: choose either 1 in K "
                             f"({ENV_SAMPLE_EVERY}) or slowest:W ({ENV_SAMPLE})")
        if self.otlp_protocol not in OTLP_PROTOCOLS:
            raise ValueError(f"otlp_protocol must be one of {', '.join(OTLP_PROTOCOLS)}, "
                             f"got {self.otlp_protocol!r}")
        if self.span_encoder not in SPAN_ENCODERS:
            raise ValueError(f"span_encoder must be one of {', '.join(SPAN_ENCODERS)}, got "
                             f"{self.span_encoder!r}")
        if self.otlp_compression not in OTLP_COMPRESSIONS:
            raise ValueError("otlp_compression must be one of "
                             f"{', '.join(OTLP_COMPRESSIONS)}, got {self.otlp_compression!r}")
        if self.otlp_endpoint is not None:
            problem = endpoint_problem(self.otlp_endpoint, self.otlp_protocol)
            if problem:
                raise ValueError(f"otlp_endpoint {self.otlp_endpoint!r}: {problem}")
        object.__setattr__(self, "resource_attributes",
                           span_attributes(self.resource_attributes))
        if isinstance(self.metrics, str):
            object.__setattr__(self, "metrics", tuple(
                x.strip() for x in self.metrics.split(",") if x.strip()))
        for spec in self.metrics:
            problem = metrics_problem(spec)
            if problem:
                raise ValueError(problem)
        if self.prometheus_sd is not None:
            sd = os.fspath(self.prometheus_sd)
            if not isinstance(sd, str) or not sd.strip():
                raise ValueError(f"prometheus_sd must name a folder, got {sd!r}")
            object.__setattr__(self, "prometheus_sd", sd)

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

    @property
    def insecure(self) -> bool:
        """gRPC without TLS: ``http://`` endpoints; ``HOST:PORT`` only when told so."""
        scheme = urlsplit(self.endpoint).scheme if "://" in self.endpoint else ""
        if scheme == "https":
            return False
        if scheme == "http":
            return True
        return bool(self.otlp_insecure)

    @property
    def metrics_push_timeout_s(self) -> float:
        """Seconds one OTLP metrics push may take."""
        return self.otlp_timeout_s if self.metrics_timeout_s is None else self.metrics_timeout_s

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Read the environment; keyword ``overrides`` (not ``None``) win over it."""
        env = os.environ if environ is None else environ
        d = cls()
        values: dict[str, Any] = {
            "mode": _choice(env, ENV_MODE, MODES, d.mode),
            "exporters": _exporters(env, d.exporters),
            "service_name": env.get(ENV_SERVICE_NAME, "").strip() or d.service_name,
            "sample_slowest_window": _slowest(env),
            "worker_rank": process_rank(environ),
            "handle_sigterm": _flag(env, (ENV_HANDLE_SIGTERM,), d.handle_sigterm),
            "otlp_protocol": _choice(env, ENV_OTLP_PROTOCOL, OTLP_PROTOCOLS, d.otlp_protocol,
                                     lower=False),
            "otlp_insecure": _flag(env, ENV_OTLP_INSECURE, None),
            "otlp_compression": _choice(env, ENV_OTLP_COMPRESSION, OTLP_COMPRESSIONS,
                                        d.otlp_compression),
            "span_encoder": _choice(env, (ENV_SPAN_ENCODER,), SPAN_ENCODERS, d.span_encoder),
            "metrics": _metrics(env),
            "prometheus_sd": env.get(ENV_PROMETHEUS_SD, "").strip() or None,
        }
        for name in NUMBERS:
            if name not in values and NUMBERS[name].env:
                values[name] = env_number(env, name, getattr(d, name))
        values["otlp_endpoint"], values["otlp_refused"] = _otlp_endpoint(
            env, values["otlp_protocol"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "otlp_endpoint" in overrides and overrides["otlp_endpoint"] is not None:
            values["otlp_refused"] = None  # an endpoint given in code replaces the variable's
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown config option(s): {', '.join(sorted(unknown))}")
        if values["mode"] == "trace" and env.get(ENV_SDK_DISABLED, "").strip().lower() == "true":
            warn_env(env, "%s=true: tracing mode 'trace' runs as 'timing' (no spans built)",
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


def unique_exporters(specs: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """``specs`` with each exporter once (an item named twice would deliver every span
    twice), and what was wrong: an item named again, or two file kinds given one path
    (the only problem that mentions "one path")."""
    out: list[str] = []
    seen: dict[str, str] = {}  # normalised exporter -> the item that named it
    paths: dict[str, str] = {}  # normalised path -> the item that writes it
    problems = []
    for spec in specs:
        kind, _, arg = spec.partition(":")
        path = os.path.normpath(arg) if kind in PATH_KINDS else ""
        key = f"{kind}:{path}"
        if key in seen:
            problems.append(f"exporter {spec!r} is named twice (as {seen[key]!r}): used once")
            continue
        if path and path in paths:
            problems.append(f"exporters {paths[path]!r} and {spec!r} would write one path")
            continue
        seen[key] = spec
        if path:
            paths[path] = spec
        out.append(spec)
    return tuple(out), problems


def prometheus_address(spec: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``prometheus[:[HOST:]PORT]`` item, or ``None`` if it is not
    one. The host defaults to loopback; an IPv6 host is written in brackets; port 0: one
    the OS chooses."""
    kind, sep, arg = spec.partition(":")
    if kind != "prometheus":
        return None
    if not sep:
        return DEFAULT_PROMETHEUS_HOST, DEFAULT_PROMETHEUS_PORT
    host, _, port = arg.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None  # an IPv6 host needs brackets
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) < 65536):
        return None
    return (host or DEFAULT_PROMETHEUS_HOST), int(port)


def metrics_problem(spec: str) -> str | None:
    """Why ``spec`` is not a valid ``RESETTRACE_METRICS`` item, or ``None``."""
    kind, sep, _ = spec.partition(":")
    if kind == "otlp" and not sep:
        return None
    if kind == "prometheus":
        if prometheus_address(spec) is not None:
            return None
        return f"metrics {spec!r}: expected prometheus, prometheus:PORT or " \
               "prometheus:HOST:PORT (port 0-65535, 0: one the OS chooses; an IPv6 host in " \
               "brackets)"
    return f"unknown metrics {spec!r}; known: otlp, prometheus, prometheus:PORT, " \
           "prometheus:HOST:PORT"


def _metrics(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get(ENV_METRICS, "").strip()
    if not raw or raw.lower() in ("off", "0", "false", "no"):
        return ()
    good = []
    for spec in (x.strip() for x in raw.split(",") if x.strip()):
        problem = metrics_problem(spec)
        if problem:
            warn_env(env, "%s: ignoring %s: %s", ENV_METRICS, shown(spec), problem)
            continue
        good.append(spec)
    return tuple(good)


def endpoint_problem(url: str, protocol: str = "grpc") -> str | None:
    """Why ``url`` is not a usable OTLP endpoint for ``protocol``, or ``None``.

    ``http://`` and ``https://`` URLs with a host; for gRPC also ``HOST:PORT`` (TLS
    unless insecure is set, as the OpenTelemetry specification has it)."""
    if not url.isprintable() or any(c.isspace() for c in url):
        return "has spaces or control characters"
    if "://" not in url and protocol == "grpc":
        host, sep, number = url.rpartition(":")
        if not sep or not host or "/" in host or "@" in host or not (
                number.isascii() and number.isdigit() and 0 < int(number) < 65536):
            return "is neither an http(s):// URL nor HOST:PORT"
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return str(e)
    if parts.scheme not in ("http", "https"):
        return "needs an http:// or https:// scheme" + (
            " (or HOST:PORT for gRPC)" if protocol == "grpc" else "")
    if not parts.hostname:
        return "has no host"
    del port
    return None


# -- what the OpenTelemetry SDK reads itself ------------------------------------------------------
#: the OTLP exporter variables of every signal (generic, traces, metrics) by what they hold
def _otlp_vars(what: str) -> tuple[str, ...]:
    return tuple(f"OTEL_EXPORTER_OTLP_{signal}{what}" for signal in ("", "TRACES_", "METRICS_"))


#: a ``name=value`` item of ``OTEL_EXPORTER_OTLP_*HEADERS``, as the SDK's liberal parser
#: takes it (a token name; a value of printable ASCII without ``"``, ``,``, ``;``, ``\``)
_HEADER_ITEM = re.compile(r"[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+"
                          r"[ \t]*=[ \t]*[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*")
_HEADER_SPLIT = re.compile(r"[ \t]*,[ \t]*")
#: gRPC status code names (``OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES``)
_GRPC_CODES = frozenset((
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"))
ENV_GRPC_RETRYABLE = "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES"
#: the SDK's span limits (a non-negative integer or ``unset``)
ENV_SPAN_LIMITS = tuple(f"OTEL_{x}_LIMIT" for x in (
    "ATTRIBUTE_COUNT", "ATTRIBUTE_VALUE_LENGTH", "SPAN_ATTRIBUTE_COUNT",
    "SPAN_ATTRIBUTE_VALUE_LENGTH", "SPAN_EVENT_COUNT", "SPAN_LINK_COUNT",
    "EVENT_ATTRIBUTE_COUNT", "LINK_ATTRIBUTE_COUNT"))
_CREDENTIAL_PROVIDERS = tuple(
    f"OTEL_PYTHON_EXPORTER_OTLP_{transport}_{signal}CREDENTIAL_PROVIDER"
    for transport in ("GRPC", "HTTP") for signal in ("", "TRACES_", "METRICS_"))


def headers_problem(raw: str) -> str | None:
    """Why ``raw`` is not a list of OTLP headers (``name=value,...``), or ``None``; the
    answer never holds the value (it is a credential)."""
    if not raw.isascii():
        return "has a character that is not ASCII (URL-encode it)"
    items = _HEADER_SPLIT.split(raw.strip(" \t"))
    for i, item in enumerate(items, 1):
        if item and not _HEADER_ITEM.fullmatch(item):
            return (f"item {i} of {len(items)} is not name=value (a value may hold printable "
                    "ASCII but not '\"', ',', ';' or '\\': URL-encode them)")
    return None


def _file_problem(raw: str) -> str | None:
    if not os.path.isfile(raw):
        return "names no file"
    if not os.access(raw, os.R_OK):
        return "names a file this process cannot read"
    return None


def _credential_provider_problem(raw: str) -> str | None:
    from importlib.metadata import entry_points

    if not list(entry_points(group="opentelemetry_otlp_credential_provider", name=raw)):
        return "names no installed credential provider"
    return None


def sdk_environment_problems(env: Mapping[str, str] | None = None
                             ) -> list[tuple[str, str | None]]:
    """The ``OTEL_*`` variables of ``env`` (default: this process's) that the
    OpenTelemetry SDK reads itself when resettrace makes an exporter, and would fail on
    (no exporter made) or print (a header's credential): ``(name, what to say)``, said as
    ``=VALUE ...`` or `` is ...`` (never a header's value), ``None`` for an empty variable
    (resettrace reads it as unset; the SDK may not). The endpoint, protocol, TLS and
    compression are given to the SDK explicitly; their variables are checked all the
    same, so the SDK never reads a value resettrace refused."""
    env = os.environ if env is None else env
    d = Config()
    out: list[tuple[str, str | None]] = []

    def check(name: str, problem: Callable[[str], str | None]) -> None:
        raw = env.get(name)
        if raw is None:
            return
        if not raw.strip():
            out.append((name, None))
            return
        said = problem(raw)
        if said is not None:
            out.append((name, said))

    def number(field: str, default: Any) -> Callable[[str], str | None]:
        def problem(raw: str) -> str | None:
            bad = NUMBERS[field].parse(raw)[1]
            return None if bad is None else (f"={shown(raw)} {bad}; using the default "
                                             f"{_default_text(default, NUMBERS[field])}")
        return problem

    def choice(choices: tuple[str, ...], default: Any) -> Callable[[str], str | None]:
        def problem(raw: str) -> str | None:
            if raw.strip().lower() in choices:
                return None
            return f"={shown(raw)} is not one of {', '.join(choices)}; using the default " \
                   f"{default!r}"
        return problem

    for name in _otlp_vars("HEADERS"):
        raw = env.get(name)
        if raw is not None and raw.strip():
            bad = headers_problem(raw)
            if bad is not None:  # the value is never shown: it holds credentials
                out.append((name, f" is malformed ({bad}): no header of it is sent"))
    for name in _otlp_vars("TIMEOUT"):
        metrics = "METRICS" in name
        check(name, number("metrics_timeout_s" if metrics else "otlp_timeout_s",
                           d.metrics_timeout_s if metrics else d.otlp_timeout_s))
    for name in _otlp_vars("COMPRESSION"):
        check(name, choice(OTLP_COMPRESSIONS, d.otlp_compression))
    for name in _otlp_vars("INSECURE"):
        check(name, lambda raw: None if raw.strip().lower() in _FLAG_WORDS else
              f"={shown(raw)} is not a boolean; using the default None")
    for what in ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE"):
        for name in _otlp_vars(what):
            check(name, lambda raw: None if (bad := _file_problem(raw)) is None else
                  f"={shown(raw)} {bad}; it is not used")
    check(ENV_GRPC_RETRYABLE, lambda raw: None if all(
        c.strip().upper() in _GRPC_CODES for c in raw.split(",") if c.strip()) else
        f"={shown(raw)} is not a list of gRPC status codes; using the default")
    for name in ENV_SPAN_LIMITS:
        check(name, lambda raw: None if raw.strip().lower() == "unset" or (
            raw.strip().isascii() and raw.strip().isdigit()
            and len(raw.strip()) <= MAX_NUMBER_TEXT) else
            f"={shown(raw)} is not a non-negative integer or 'unset'; using the default")
    for name in _CREDENTIAL_PROVIDERS:
        check(name, lambda raw: None if (bad := _credential_provider_problem(raw)) is None
              else f"={shown(raw)} {bad}; it is not used")
    return out


def sdk_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) for the OpenTelemetry SDK: without
    the variables :func:`sdk_environment_problems` finds in this process's environment,
    each said once per process (one line naming it; never a header's value), so that the
    SDK uses its default instead and still makes the exporter."""
    out = dict(os.environ if base is None else base)
    for name, said in sdk_environment_problems():
        out.pop(name, None)
        if said is not None:
            warn_env(os.environ, "%s%s", name, said)
    return out


_SDK_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def sdk_environ() -> Iterator[None]:
    """While the OpenTelemetry SDK makes an exporter in this process: the variables of
    :func:`sdk_environment_problems` out of ``os.environ`` (said once), put back after.
    Nothing is touched when every variable is well formed (the usual case)."""
    problems = sdk_environment_problems()
    if not problems:
        yield
        return
    with _SDK_ENV_LOCK:
        sdk_environment()  # says what is wrong, once
        saved = {name: os.environ[name] for name, _ in problems if name in os.environ}
        for name in saved:
            del os.environ[name]
        try:
            yield
        finally:
            for name, raw in saved.items():
                os.environ.setdefault(name, raw)


def _choice(env: Mapping[str, str], names: str | tuple[str, ...], choices: tuple[str, ...],
            default: str, *, lower: bool = True) -> str:
    name, raw = first_set(env, (names,) if isinstance(names, str) else names)
    if raw is None:
        return default
    value = raw.lower() if lower else raw
    if names == ENV_MODE and value in ("0", "false", "no"):
        value = "off"
    if value not in choices:
        warn_env(env, "%s=%s is not one of %s; using the default %r", name, shown(raw),
              ", ".join(choices), default)
        return default
    return value


def env_number(env: Mapping[str, str], name: str, default: Any) -> Any:
    """The numeric setting ``name`` of :data:`NUMBERS` from the first of its variables
    that is set, in the field's unit; ``default`` (with a warning naming the variable,
    the range and the value used) when it is malformed or out of range."""
    number = NUMBERS[name]
    var, raw = first_set(env, number.env)
    if raw is None:
        return default
    value, problem = number.parse(raw)
    if problem is not None:
        warn_env(env, "%s=%s %s; using the default %s", var, shown(raw), problem,
              _default_text(default, number))
        return default
    return value


class EndpointRefused(ValueError):
    """The environment named an OTLP endpoint that cannot be used: nothing is sent (said
    once per process, by :func:`resettrace.envvars.say_once`)."""


def _default_text(default: Any, number: Number) -> str:
    return "(unset)" if default is None else fmt_number(default / number.scale)


_FLAG_WORDS = ("1", "true", "yes", "on", "0", "false", "no", "off")


def _flag(env: Mapping[str, str], names: tuple[str, ...], default: Any) -> Any:
    name, raw = first_set(env, names)
    if raw is None:
        return default
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    warn_env(env, "%s=%s is not a boolean; using the default %r", name, shown(raw), default)
    return default


def _slowest(env: Mapping[str, str]) -> int | None:
    raw = env.get(ENV_SAMPLE)
    if raw is None or not raw.strip() or raw.strip().lower() == "all":
        return None
    kind, _, arg = raw.strip().partition(":")
    window, problem = NUMBERS["sample_slowest_window"].parse(arg)
    if kind != "slowest" or problem is not None:
        warn_env(env, "%s=%s is not 'all' or 'slowest:W' (W in 1 - %d); using the default "
              "'all'", ENV_SAMPLE, shown(raw), INT_MAX)
        return None
    return int(window)


def _otlp_endpoint(env: Mapping[str, str], protocol: str, signal: str = "traces"
                   ) -> tuple[str | None, str | None]:
    """The ``signal``'s endpoint from the environment (``OTEL_EXPORTER_OTLP_<SIGNAL>_
    ENDPOINT``, else the generic variable, a base URL for HTTP), and why it cannot be
    used: then no other endpoint is put in its place (data and credentials go only where
    they were sent)."""
    names = (f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    name, raw = first_set(env, names)
    if raw is None:
        return None, None
    problem = endpoint_problem(raw, protocol)
    if problem:
        # said by the sink that would have used it (the CLI stops before with this line)
        return None, f"{name}={raw!r} {problem} ({protocol}): nothing is sent to any endpoint"
    if protocol == "http/protobuf" and name == "OTEL_EXPORTER_OTLP_ENDPOINT":
        # the generic variable is a base URL: the signal's path is appended
        return raw.rstrip("/") + f"/v1/{signal}", None
    return raw, None


def metrics_endpoint(config: Config, env: Mapping[str, str] | None = None
                     ) -> tuple[str, bool]:
    """The OTLP metrics endpoint and whether it is plain gRPC (no TLS), read as the trace
    endpoint is; ``ValueError`` when the environment names one that cannot be used."""
    env = os.environ if env is None else env
    endpoint, refused = _otlp_endpoint(env, config.otlp_protocol, "metrics")
    if refused:
        raise EndpointRefused(refused)
    if endpoint is None:
        endpoint = "http://localhost:4317" if config.otlp_protocol == "grpc" else \
            "http://localhost:4318/v1/metrics"
    probe = Config(otlp_endpoint=endpoint, otlp_protocol=config.otlp_protocol,
                   otlp_insecure=config.otlp_insecure)
    return endpoint, probe.insecure


def _split_exporters(raw: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in raw.split(",") if s.strip())


def _exporters(env: Mapping[str, str], default: tuple[str, ...]) -> tuple[str, ...]:
    raw = env.get(ENV_EXPORTER)
    if raw is None or not raw.strip():
        return default
    good = []
    bad = []
    for spec in _split_exporters(raw):
        problem = exporter_problem(spec)
        if problem:
            bad.append(problem)
            continue
        good.append(spec)
    unique, problems = unique_exporters(tuple(good))
    if not unique:  # one line: what was wrong, and what is used instead
        warn_env(env, "%s=%s names no usable exporter (%s); using the default %r", ENV_EXPORTER,
              shown(raw), "; ".join(bad) or "none named",
              ",".join(default or DEFAULT_EXPORTERS))
        return default
    for problem in bad:
        warn_env(env, "%s: ignoring %s", ENV_EXPORTER, problem)
    for problem in problems:  # the first of two items is kept
        warn_env(env, "%s: %s", ENV_EXPORTER,
              problem if "twice" in problem else f"{problem}: ignoring the second")
    return unique
