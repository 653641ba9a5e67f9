"""One tracing session: config, the timing processor, and span export when asked.

``Tracing(config)`` with mode ``off`` imports nothing from OpenTelemetry and hands
out :data:`~resettrace.tracing.recorder.NOOP_RECORDER`. ``timing`` adds a
:class:`~resettrace.tracing.processor.TimingSpanProcessor` fed by the recorders.
``trace`` also builds OpenTelemetry spans off the training thread and exports them:
through the caller's ``tracer_provider`` when one is given (resettrace then never
shuts it down), else through a private provider that this session owns, whose
exporters come from ``config.exporters``. No process-global provider is installed.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from resettrace.catalog import ATTR_BACKEND, ATTR_ENV_COUNT, ATTR_TASK
from resettrace.config import Config
from resettrace.tracing.recorder import NOOP_RECORDER, NoopRecorder, Recorder

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from resettrace.tracing.materialise import SpanMaterializer
    from resettrace.tracing.processor import KeyStats, TimingSpanProcessor

log = logging.getLogger(__name__)

__all__ = ["Tracing"]


class Tracing:
    """Owns the sinks that recorders feed. Thread-safe to read stats from."""

    def __init__(self, config: Config | None = None, *, tracer_provider: Any = None) -> None:
        self.config = config if config is not None else Config.from_env()
        self.processor: TimingSpanProcessor | None = None
        self.materializer: SpanMaterializer | None = None
        self.exporters: list[SpanExporter] = []
        self._provider: Any = None
        self._owns_provider = False
        self._closed = False
        if not self.config.enabled:
            return
        from resettrace.tracing.processor import TimingSpanProcessor

        self.processor = TimingSpanProcessor(max_samples=self.config.max_samples)
        if self.config.exports_spans:
            from resettrace.tracing.materialise import SpanMaterializer

            if tracer_provider is None:
                tracer_provider = self._make_provider()
                self._owns_provider = True
            self._provider = tracer_provider
            self.materializer = SpanMaterializer(tracer_provider,
                                                 queue_size=self.config.queue_size)

    def _make_provider(self) -> Any:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        from resettrace.tracing.exporters import make_exporter

        attrs: dict[str, Any] = {"service.name": self.config.service_name,
                                 "host.name": socket.gethostname(), "process.pid": os.getpid()}
        attrs.update(self.config.resource_attributes)
        provider = TracerProvider(resource=Resource.create(attrs))
        for spec in self.config.exporters:
            exporter = make_exporter(spec)
            self.exporters.append(exporter)
            # spans are already built on the materialiser thread: export them there too
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        return provider

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def tracer_provider(self) -> Any:
        return self._provider

    def recorder(self, *, backend: str | None = None, task: str | None = None,
                 env_count: int | None = None) -> Recorder | NoopRecorder:
        """A recorder for one env/backend pair, or the shared no-op one when off."""
        if self.processor is None or self._closed:
            return NOOP_RECORDER
        attrs: dict[str, Any] = {}
        if backend is not None:
            attrs[ATTR_BACKEND] = backend
        if task is not None:
            attrs[ATTR_TASK] = task
        if env_count is not None:
            attrs[ATTR_ENV_COUNT] = int(env_count)
        sinks: list[Any] = [self.processor]
        if self.materializer is not None:
            sinks.append(self.materializer)
        return Recorder(sinks, attributes=attrs)

    # -- results ------------------------------------------------------------------------------
    def stats(self) -> dict[str, KeyStats]:
        return {} if self.processor is None else self.processor.stats()

    def samples(self) -> dict[str, list[float]]:
        return {} if self.processor is None else self.processor.samples()

    @property
    def dropped_spans(self) -> int:
        return 0 if self.materializer is None else self.materializer.dropped_spans

    @property
    def exported_spans(self) -> int:
        return 0 if self.materializer is None else self.materializer.materialised_spans

    def export_report(self) -> dict[str, Any]:
        """What happened to the spans: built, dropped, still queued."""
        m = self.materializer
        return {"mode": self.mode, "spans_built": 0 if m is None else m.materialised_spans,
                "spans_dropped": 0 if m is None else m.dropped_spans,
                "spans_pending": 0 if m is None else m.pending_spans}

    # -- lifecycle ------------------------------------------------------------------------------
    def force_flush(self, timeout_s: float | None = None) -> bool:
        """Build every queued span and flush the exporters, within ``timeout_s``."""
        timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        ok = True
        if self.materializer is not None:
            ok = self.materializer.flush(timeout)
        if self._provider is not None and hasattr(self._provider, "force_flush"):
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            ok = bool(self._provider.force_flush(left_ms)) and ok
        return ok

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Flush within the timeout, then stop; a provider passed in is left running."""
        if self._closed:
            return
        timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        self._closed = True
        if self.materializer is not None:
            self.materializer.close(timeout)
            if self.materializer.dropped_spans:
                log.warning("resettrace: %d spans were not exported",
                            self.materializer.dropped_spans)
        if self._owns_provider and self._provider is not None:
            self._provider.shutdown()
