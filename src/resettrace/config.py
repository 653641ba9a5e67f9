"""Configuration: explicit arguments > ``RESETTRACE_*`` / ``OTEL_*`` variables > defaults.

Variables read (all optional):

``RESETTRACE``
    ``off`` (default): no recording, ``set_state`` returns ``None``.
    ``timing``: aggregate phase timings (set_state returns its timing dict).
    ``trace``: aggregate and export every phase as an OpenTelemetry span.
``RESETTRACE_EXPORTER``
    Comma-separated span sinks for ``trace`` mode: ``file:PATH`` (JSON lines, one
    span per line) or ``memory``. Default ``file:resettrace-spans.jsonl``.
``RESETTRACE_MAX_SAMPLES``
    Samples kept per timing key for percentiles (reservoir beyond it); count, mean,
    max and total stay exact. Default 100000.
``RESETTRACE_QUEUE_SIZE``
    Finished traces waiting for span export; beyond it traces are dropped and
    counted, never blocking the training thread. Default 4096.
``RESETTRACE_SHUTDOWN_TIMEOUT``
    Seconds the exporter may take to flush at shutdown. Default 3.
``OTEL_SDK_DISABLED``
    ``true`` turns ``trace`` into ``timing`` (no span is built).
``OTEL_SERVICE_NAME``
    ``service.name`` of exported spans. Default ``resettrace``.

A malformed value is logged as a warning naming the variable and the default used.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

log = logging.getLogger(__name__)

MODES = ("off", "timing", "trace")
ENV_MODE = "RESETTRACE"
ENV_EXPORTER = "RESETTRACE_EXPORTER"
ENV_MAX_SAMPLES = "RESETTRACE_MAX_SAMPLES"
ENV_QUEUE_SIZE = "RESETTRACE_QUEUE_SIZE"
ENV_SHUTDOWN_TIMEOUT = "RESETTRACE_SHUTDOWN_TIMEOUT"
ENV_SDK_DISABLED = "OTEL_SDK_DISABLED"
ENV_SERVICE_NAME = "OTEL_SERVICE_NAME"
EXPORTER_KINDS = ("file", "memory")


@dataclass(frozen=True, kw_only=True)
class Config:
    """Resolved tracing settings. Build with :meth:`from_env` or directly."""

    #: ``off``, ``timing`` or ``trace``.
    mode: str = "off"
    #: Span sinks for ``trace`` mode, e.g. ``("file:spans.jsonl",)``.
    exporters: tuple[str, ...] = ("file:resettrace-spans.jsonl",)
    #: ``service.name`` resource attribute of exported spans.
    service_name: str = "resettrace"
    #: Samples kept per key for percentiles.
    max_samples: int = 100_000
    #: Finished traces queued for export before dropping.
    queue_size: int = 4096
    #: Seconds allowed for the final flush.
    shutdown_timeout_s: float = 3.0
    #: Extra resource attributes for exported spans.
    resource_attributes: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if isinstance(self.exporters, str):
            object.__setattr__(self, "exporters", _split_exporters(self.exporters))
        for spec in self.exporters:
            kind = spec.split(":", 1)[0]
            if kind not in EXPORTER_KINDS:
                raise ValueError(f"unknown exporter {spec!r}; known: {', '.join(EXPORTER_KINDS)}")
            if kind == "file" and not spec.partition(":")[2]:
                raise ValueError(f"exporter {spec!r} needs a path: file:PATH")
        if self.max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {self.max_samples}")
        if self.queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {self.queue_size}")
        if not self.shutdown_timeout_s > 0:
            raise ValueError(f"shutdown_timeout_s must be > 0, got {self.shutdown_timeout_s}")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def exports_spans(self) -> bool:
        return self.mode == "trace"

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
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown config option(s): {', '.join(sorted(unknown))}")
        if values["mode"] == "trace" and env.get(ENV_SDK_DISABLED, "").strip().lower() == "true":
            log.warning("%s=true: tracing mode 'trace' runs as 'timing' (no spans built)",
                        ENV_SDK_DISABLED)
            values["mode"] = "timing"
        return cls(**values)

    def with_(self, **changes: Any) -> Config:
        return replace(self, **changes)


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
    if value < minimum:
        log.warning("%s=%r is below %s; using the default %r", name, raw, minimum, default)
        return default
    return value


def _split_exporters(raw: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in raw.split(",") if s.strip())


def _exporters(env: Mapping[str, str], default: tuple[str, ...]) -> tuple[str, ...]:
    raw = env.get(ENV_EXPORTER)
    if raw is None or not raw.strip():
        return default
    specs = _split_exporters(raw)
    good = []
    for spec in specs:
        kind, _, arg = spec.partition(":")
        if kind not in EXPORTER_KINDS or (kind == "file" and not arg):
            log.warning("%s: ignoring %r (known: file:PATH, memory)", ENV_EXPORTER, spec)
            continue
        good.append(spec)
    if not good:
        log.warning("%s=%r names no usable exporter; using the default %r", ENV_EXPORTER, raw,
                    ",".join(default))
        return default
    return tuple(good)
