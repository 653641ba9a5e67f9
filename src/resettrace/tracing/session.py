"""One tracing session: config, the aggregator of its timings, and span export when asked.

``Tracing(config)`` with mode ``off`` imports nothing from OpenTelemetry and hands
out :data:`~resettrace.tracing.recorder.NOOP_RECORDER`. ``timing`` adds a
:class:`~resettrace.tracing.aggregate.Aggregator` fed by the recorders.
``trace`` also exports spans, behind a :class:`~resettrace.tracing.sampling.TraceSampler`:

- file and OTLP exporters (``otlp``, ``file:``, ``perfetto:``, ``otlp-json:``) run in
  a child process (:mod:`resettrace.tracing.export`): the training process
  only packs each trace into a pipe;
- ``memory`` and a caller's ``tracer_provider`` get SDK spans built on a background
  thread of this process (:mod:`resettrace.tracing.materializer`). resettrace never
  shuts a provider down that it did not create, and installs no global provider.

Sessions that export spans are flushed (within ``shutdown_timeout_s``) at normal
interpreter exit, when a ``multiprocessing`` worker leaves, and on SIGTERM when no
other handler is installed (``handle_sigterm``): SIGTERM then ends the process with
``SystemExit(143)``, so ``finally`` blocks and exit hooks run; a second SIGTERM kills.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from resettrace.catalog import (
    ATTR_BACKEND,
    ATTR_ENV_COUNT,
    ATTR_PARENT_PID,
    ATTR_TASK,
    ATTR_WORKER_RANK,
    CATALOG,
    Catalog,
    span_attributes,
)
from resettrace.config import DEFAULT_EXPORTERS, Config
from resettrace.launcher import parent_pid
from resettrace.tracing import devicecounts, lifecycle
from resettrace.tracing.exits import register_exit_hooks
from resettrace.tracing.recorder import NOOP_RECORDER, NoopRecorder, Recorder, default_changed

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from resettrace.tracing.aggregate import Aggregator, KeyStats
    from resettrace.tracing.export.parent import ProcessExporter
    from resettrace.tracing.materializer import SpanMaterializer
    from resettrace.tracing.sampling import TraceSampler

log = logging.getLogger(__name__)

__all__ = ["Tracing", "ATTR_WORKER_RANK", "default_attributes", "attribute_problem"]

IN_PROCESS_EXPORTERS = ("memory",)

#: span attributes every recorder of every session starts with (``instrument()``'s
#: ``[attributes]`` table); the arguments of :meth:`Tracing.recorder` win over them
_DEFAULT_ATTRIBUTES: dict[str, Any] = {}
_DEFAULT_LOCK = threading.Lock()


#: called with every enabled session made in this process, once it is set up (the run
#: record's exit arrangement: :func:`resettrace.exit_record.arrange_exit_record`)
ON_SESSION: list[Callable[[Tracing], None]] = []


def default_attributes() -> dict[str, Any]:
    """A copy of the attributes that every new recorder starts with."""
    return dict(_DEFAULT_ATTRIBUTES)


def add_default_attributes(values: Mapping[str, Any]) -> Callable[[], None]:
    """Give every recorder made from now on ``values`` (an instrument spec's
    ``[attributes]``); return the undo, which puts back what each key held before, unless
    the key was set again since."""
    missing = object()
    values = span_attributes(values)
    with _DEFAULT_LOCK:
        previous = {k: _DEFAULT_ATTRIBUTES.get(k, missing) for k in values}
        _DEFAULT_ATTRIBUTES.update(values)

    def undo() -> None:
        with _DEFAULT_LOCK:
            for key, value in values.items():
                if key in _DEFAULT_ATTRIBUTES and _DEFAULT_ATTRIBUTES[key] == value:
                    before = previous[key]
                    if before is missing:
                        del _DEFAULT_ATTRIBUTES[key]
                    else:
                        _DEFAULT_ATTRIBUTES[key] = before

    return undo


def attribute_problem(attributes: Mapping[Any, Any]) -> str | None:
    """What is wrong with the first span attribute of ``attributes`` that OpenTelemetry
    cannot carry (:func:`~resettrace.catalog.span_attributes`: a key or string value no
    exporter can write, a value of another type), naming its key; None when all are good.
    Checked where attributes are given, never at export."""
    try:
        span_attributes(attributes)
    except (TypeError, ValueError) as e:
        return str(e)
    return None


class Tracing:
    """Owns the sinks that recorders feed. Thread-safe to read stats from.

    ``catalog``: the phases its recorders, aggregator and exporters know (default: the
    process's :data:`~resettrace.catalog.CATALOG`, which phases registered later join).
    """

    def __init__(self, config: Config | None = None, *, tracer_provider: Any = None,
                 catalog: Catalog | None = None) -> None:
        self.config = config if config is not None else Config.from_env()
        self.catalog = CATALOG if catalog is None else catalog
        self._local = threading.local()
        #: the statistics of its recorders' traces (None when off)
        self.aggregator: Aggregator | None = None
        self.materializer: SpanMaterializer | None = None
        self.process: ProcessExporter | None = None
        self.sampler: TraceSampler | None = None
        self.exporters: list[SpanExporter] = []
        self._provider: Any = None
        self._owns_provider = False
        self._closed = False
        self.metrics: Any = None
        #: the process the session was made in (a forked worker resolves its own rank)
        self._pid = os.getpid()
        self._rank = self.config.worker_rank
        #: when it started (Unix s, and monotonic s)
        self.started_at = time.time()
        self.started_monotonic = time.monotonic()
        #: env counts given to its recorders, and the recorders (whose attributes may get
        #: one later: ``traced(env_count=...)`` sets it on its first call)
        self._env_counts: set[int] = set()
        self._recorders: weakref.WeakSet[Recorder] = weakref.WeakSet()
        self._recorders_lock = threading.RLock()  # a signal handler may record meanwhile
        #: the backend and task names its recorders were given (what their spans carry)
        self._labels: dict[str, set[str]] = {ATTR_BACKEND: set(), ATTR_TASK: set()}
        if not self.config.enabled:
            return
        from resettrace.tracing.aggregate import Aggregator
        from resettrace.tracing.recorder import say_if_not_built

        say_if_not_built()
        devicecounts.exit_wait(self.config.shutdown_timeout_s)  # (counts on a device)

        # the aggregation engine alone: a session aggregates records, no SDK span
        self.aggregator = Aggregator(max_samples=self.config.max_samples, catalog=self.catalog,
                                    max_pending=self.config.aggregate_queue)
        for hook in ON_SESSION:
            hook(self)
        if self.config.exports_spans:
            self._start_export(tracer_provider)
        if self.config.metrics:
            from resettrace.tracing.metrics import MetricsExport

            # the resource as a callable: a forked worker asks it again for its own rank
            self.metrics = MetricsExport(self.aggregator, self.config,
                                         self.resource_attributes, self.label)
            if not self.config.exports_spans:
                register_exit_hooks(self)  # the last push at exit

    def _start_export(self, tracer_provider: Any) -> None:
        from resettrace.tracing.sampling import TraceSampler

        cfg = self.config
        sinks: list[Any] = []
        specs = cfg.exporters or (() if tracer_provider is not None else DEFAULT_EXPORTERS)
        local = [s for s in specs if s in IN_PROCESS_EXPORTERS]
        remote = [s for s in specs if s not in IN_PROCESS_EXPORTERS]
        if cfg.otlp_refused and "otlp" in remote:  # OTLP metrics say the same line: once
            from resettrace.envvars import say_once

            say_once("resettrace: %s", cfg.otlp_refused, level=logging.ERROR)
        if tracer_provider is None and local:
            tracer_provider = self._make_provider(local)
            self._owns_provider = True
        if tracer_provider is not None:
            from resettrace.tracing.materializer import SpanMaterializer

            self._provider = tracer_provider
            self.materializer = SpanMaterializer(tracer_provider, queue_size=cfg.queue_size,
                                                 catalog=self.catalog)
            sinks.append(self.materializer)
        if remote:
            from resettrace.tracing.export.parent import ProcessExporter

            settings = {"config": _jsonable(cfg), "exporters": remote,
                        "resource": self.resource_attributes()}
            self.process = ProcessExporter(settings, max_traces=cfg.queue_size,
                                           catalog=self.catalog)
            sinks.append(self.process)
        self.sampler = TraceSampler(sinks, every=cfg.sample_every,
                                    slowest_window=cfg.sample_slowest_window)
        register_exit_hooks(self)

    @property
    def worker_rank(self) -> int:
        """This process's rank: the config's, or in a worker that inherited the session
        over a fork, the worker's own (:func:`resettrace.launcher.process_rank`)."""
        if self._pid != os.getpid():
            from resettrace.launcher import process_rank

            self._pid, self._rank = os.getpid(), process_rank()
            self.started_at, self.started_monotonic = time.time(), time.monotonic()
        return self._rank

    def resource_attributes(self) -> dict[str, Any]:
        """``service.name``, host, process id, parent process id, worker rank and the
        config's extras."""
        attrs: dict[str, Any] = {"service.name": self.config.service_name,
                                 "host.name": socket.gethostname(), "process.pid": os.getpid(),
                                 ATTR_PARENT_PID: parent_pid(),
                                 ATTR_WORKER_RANK: self.worker_rank}
        attrs.update(self.config.resource_attributes)
        return attrs

    def _make_provider(self, specs: list[str]) -> Any:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        from resettrace.config import sdk_environ
        from resettrace.tracing.export.exporters import make_exporter

        # shut down by this session's own exit flush, after the spans still queued are
        # built (the SDK's exit hook would run first, and refuse them)
        with sdk_environ():  # its span limits: no OTEL_* variable it would fail on
            provider = TracerProvider(resource=Resource.create(self.resource_attributes()),
                                      shutdown_on_exit=False)
        for spec in specs:
            exporter = make_exporter(spec, self.config)
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

    @property
    def processor(self) -> Aggregator | None:
        """The former name of :attr:`aggregator` (it is no span processor)."""
        return self.aggregator

    def recorder(self, *, backend: str | None = None, task: str | None = None,
                 env_count: int | None = None, attributes: Mapping[str, Any] | None = None
                 ) -> Recorder | NoopRecorder:
        """A recorder for one env/backend pair, or the shared no-op one when off.

        Its span attributes: :func:`default_attributes`, then ``attributes``, then
        backend, task and env count when given. Values are taken as OpenTelemetry carries
        them (a numpy scalar becomes its Python value:
        :func:`~resettrace.catalog.span_attributes`); a key or value it cannot carry (text
        no exporter could write, bytes, a set, None, any other object, a sequence mixing
        types) raises ``TypeError`` or ``ValueError`` naming its key, here, whatever the
        mode.
        """
        given = span_attributes({**(attributes or {}), **{
            k: v for k, v in ((ATTR_BACKEND, backend), (ATTR_TASK, task)) if v is not None}})
        if self.aggregator is None or self._closed:
            return NOOP_RECORDER
        attrs: dict[str, Any] = dict(_DEFAULT_ATTRIBUTES)
        attrs.update(given)
        if env_count is not None:
            attrs[ATTR_ENV_COUNT] = int(env_count)
        sinks: list[Any] = [self.aggregator]
        if self.sampler is not None:
            # a sampler that keeps every trace is left out: its sinks get them directly
            # (the export's compiled queue, no call per trace)
            sinks.extend(self.sampler.sinks if self.sampler.keeps_all else [self.sampler])
        rec = Recorder(sinks, attributes=attrs, catalog=self.catalog)
        with self._recorders_lock:
            n = _env_count(attrs.get(ATTR_ENV_COUNT))
            if n is not None:
                self._env_counts.add(n)
            for key, seen in self._labels.items():
                if attrs.get(key) not in (None, ""):
                    seen.add(str(attrs[key]))
            self._recorders.add(rec)
        # a count set later on a recorder collected before the record is written
        weakref.finalize(rec, _keep_env_count, self._env_counts, rec.attributes)
        return rec

    def label(self, key: str) -> str:
        """The value of a span attribute naming what ran (``resettrace.backend.name``,
        ``resettrace.task.name``) for metrics: the resource attribute when one is set (the
        CLI's), else the values its recorders were given (``recorder(backend=...)``, a
        spec's ``[attributes]``), comma-separated when several; ``""`` when none."""
        given = self.config.resource_attributes.get(key)
        if given not in (None, ""):
            return str(given)
        with self._recorders_lock:
            return ",".join(sorted(self._labels.get(key, ())))

    @property
    def env_counts(self) -> set[int]:
        """The env counts (envs in a batch) its recorders were told: ``recorder(env_count=)``,
        a spec's ``[attributes] env_count`` (every recorder starts with it) and
        ``traced(env_count=...)`` (read on the decorated function's first call)."""
        with self._recorders_lock:
            out = set(self._env_counts)
            for rec in list(self._recorders):
                n = _env_count(rec.attributes.get(ATTR_ENV_COUNT))
                if n is not None:
                    out.add(n)
        return out

    def thread_recorder(self) -> Recorder | NoopRecorder:
        """This thread's default recorder (``current_recorder()`` when none is bound)."""
        if self._closed:
            return NOOP_RECORDER
        rec = getattr(self._local, "recorder", None)
        if rec is None:
            rec = self._local.recorder = self.recorder()
        return rec

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` ran (it records nothing more)."""
        return self._closed

    # -- results ------------------------------------------------------------------------------
    def stats(self) -> dict[str, KeyStats]:
        return {} if self.aggregator is None else self.aggregator.stats()

    def samples(self) -> dict[str, list[float]]:
        return {} if self.aggregator is None else self.aggregator.samples()

    def distributions(self) -> dict[str, Any]:
        """Per key, every call's value in mergeable exponential buckets (as in
        ``timing.json``'s ``dist``; :mod:`resettrace.distribution`)."""
        return {} if self.aggregator is None else self.aggregator.distributions()

    def cost_model(self, *, fit: bool = True) -> dict[str, Any]:
        """Per key, the fit ``ms = a + b * k`` over its calls (:mod:`resettrace.costmodel`):
        the ``model`` section of ``timing.json`` (``fit`` false: its sums only)."""
        from resettrace.costmodel import model_section

        return model_section({} if self.aggregator is None else self.aggregator.fit_sums(),
                             fit=fit)

    @property
    def dropped_traces(self) -> int:
        """Traces never aggregated: they came while ``aggregate_queue`` traces waited for
        the aggregation thread (``RESETTRACE_AGGREGATE_QUEUE``); the statistics miss them."""
        return 0 if self.aggregator is None else self.aggregator.dropped_traces

    @property
    def dropped_spans(self) -> int:
        dropped = 0 if self.materializer is None else self.materializer.dropped_spans
        return dropped + (0 if self.process is None else self.process.dropped_spans)

    def export_report(self) -> dict[str, Any]:
        """What happened to the spans: built here, sent to the export process, dropped,
        sampled out, and per exporter delivered / not delivered."""
        m, p = self.materializer, self.process
        report: dict[str, Any] = {
            "mode": self.mode,
            "spans_built": 0 if m is None else m.materialised_spans,
            "spans_dropped": self.dropped_spans,
            "spans_sampled_out": 0 if self.sampler is None else self.sampler.sampled_out_spans,
            "spans_pending": 0 if m is None else m.pending_spans,
        }
        if self.metrics is not None:
            report["metrics"] = self.metrics.report()
        if p is not None:
            proc = p.report()
            report["spans_sent"] = proc["spans_sent"]
            report["spans_pending"] += proc["spans_pending"]
            report["exporters"] = proc["exporters"]
            report["spans_not_delivered"] = max(
                [e["undelivered"] for e in proc["exporters"].values()], default=0)
            for key in ("export_cpu_s", "export_setup_cpu_s", "export_cpu_us_per_span"):
                if key in proc:
                    report[key] = proc[key]
        return report

    # -- lifecycle ------------------------------------------------------------------------------
    @lifecycle.uncut
    def force_flush(self, timeout_s: float | None = None) -> bool:
        """Build every queued span and flush the exporters, within ``timeout_s``."""
        timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        ok = True
        if self.aggregator is not None:
            ok = self.aggregator.force_flush(max(1, int(timeout * 1000)))
        if self.materializer is not None:
            ok = self.materializer.flush(max(0.01, deadline - time.monotonic())) and ok
        if self._provider is not None and hasattr(self._provider, "force_flush"):
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            ok = bool(self._provider.force_flush(left_ms)) and ok
        if self.process is not None:
            ok = self.process.flush(max(0.01, deadline - time.monotonic())) and ok
        return ok

    @lifecycle.uncut
    def shutdown(self, timeout_s: float | None = None) -> None:
        """Flush within the timeout, then stop; a provider passed in is left running."""
        if self._closed:
            return
        timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        self._closed = True
        # the traces waiting for counts on a device, the last ones without those missing
        if self.aggregator is not None:
            devicecounts.settle(max(0.0, min(timeout / 2, deadline - time.monotonic())),
                                final=True, sink=self.aggregator)
        default_changed()  # the compiled traced calls ask again (it records nothing more)
        if self.sampler is not None:
            self.sampler.close()
        if self.aggregator is not None:
            self.aggregator.shutdown()
        if self.materializer is not None:
            self.materializer.close(timeout)
        if self.process is not None:
            self.process.close(max(0.05, deadline - time.monotonic()))
        if self._owns_provider and self._provider is not None:
            self._provider.shutdown()
        if self.metrics is not None:
            self.metrics.close(max(0.1, deadline - time.monotonic()))
        if self.dropped_traces:
            log.warning("resettrace: %d traces were not aggregated (the aggregation queue of "
                        "%d traces was full; %s sets it): the statistics miss them",
                        self.dropped_traces, self.config.aggregate_queue,
                        "RESETTRACE_AGGREGATE_QUEUE")
        if self.config.exports_spans:
            report = self.export_report()
            lost = report.get("spans_not_delivered", 0) or report["spans_dropped"]
            if lost:
                from resettrace.tables import exporter_outcome

                said = "; ".join(
                    f"{name}: {exporter_outcome(e, report['spans_dropped'])}"
                    for name, e in report.get("exporters", {}).items()) \
                    or f"{report['spans_dropped']} dropped"
                if self.config.otlp_refused:  # said once already, at the start
                    said = said.replace(self.config.otlp_refused,
                                        "its endpoint was refused (said above)")
                log.warning("resettrace: %d spans were not delivered (%s)", lost, said)


def _keep_env_count(counts: set[int], attributes: Mapping[str, Any]) -> None:
    n = _env_count(attributes.get(ATTR_ENV_COUNT))
    if n is not None:
        counts.add(n)


def _env_count(value: Any) -> int | None:
    """An env count attribute as a count of envs (a positive int), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def _jsonable(config: Config) -> dict[str, Any]:
    d = dataclasses.asdict(config)
    d["exporters"] = list(config.exporters)
    d["resource_attributes"] = dict(config.resource_attributes)
    return d
