"""Metrics of the aggregated statistics: OTLP push and a Prometheus scrape endpoint.

``RESETTRACE_METRICS=otlp`` and/or ``prometheus[:PORT]`` (``timing`` and ``trace`` modes).
The metrics are read from the timing processor's exact statistics when they are exported
or scraped, so they see every call whatever the trace sampling, and nothing is added to the
hot path or to the aggregation: no per-call instrument call is made anywhere.

* ``resettrace.phase.duration`` (unit ``ms``): per phase, its calls in the processor's
  base-2 exponential buckets (:mod:`resettrace.distribution`, scale 5), with the exact
  count, sum, min and max. OTLP gets it as an exponential histogram; Prometheus as a classic
  histogram ``resettrace_phase_duration_milliseconds`` whose ``le`` bounds are the same
  buckets merged four to one (``2 ** (1/8)`` apart: ``histogram_quantile`` is then within
  about 9% of the exact percentile).
* ``resettrace.resets`` (envs reset) and ``resettrace.env_steps`` (env step calls): counters.

A forked process drops its copies (no push thread, not serving the parent's port): give a
worker its own session.

Attributes: ``resettrace.phase`` (the span name), ``resettrace.backend.name``,
``resettrace.task.name`` (the names the spans carry: :meth:`Tracing.label`) and
``resettrace.worker.rank``. OTLP pushes use the SDK's OTLP metric exporter (its endpoint,
headers and timeout variables: ``OTEL_EXPORTER_OTLP_METRICS_*``, else the generic ones) every
``OTEL_METRIC_EXPORT_INTERVAL`` ms (default 60,000) on a daemon thread, and once more at
shutdown; failed or timed-out exports are counted (:meth:`MetricsExport.report`), never
raised. The scrape endpoint is ``prometheus_client``'s HTTP server on ``HOST:PORT``
(default ``127.0.0.1:9464``: loopback only, unless a host is given), serving a collector
that reads the statistics at each scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from resettrace import catalog as C
from resettrace.config import prometheus_address
from resettrace.distribution import SCALE, Distribution
from resettrace.tracing import lifecycle

if TYPE_CHECKING:
    from resettrace.config import Config
    from resettrace.tracing.aggregate import Aggregator

__all__ = ["MetricsExport", "PROMETHEUS_SCALE"]

log = logging.getLogger("resettrace")

#: the scale of the Prometheus buckets (the processor's buckets merged 2**(SCALE-this) to one)
PROMETHEUS_SCALE = 3
_PROM_SHIFT = SCALE - PROMETHEUS_SCALE
_SCOPE = "resettrace"


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _label(name: str) -> str:
    return name.replace(".", "_")


class MetricsExport:
    """The metrics of one tracing session (see the module docstring), from its inputs: the
    processor whose statistics it reads, the config (what to export, where, how often),
    the resource attributes (rank and the OTLP resource) and ``label(key)``, the backend
    and task names the spans carry (:meth:`resettrace.tracing.session.Tracing.label`)."""

    def __init__(self, processor: Aggregator | None, config: Config,
                 resource: Mapping[str, Any],
                 label: Callable[[str], str] | None = None) -> None:
        self.processor = processor
        self.config = config
        self.resource = dict(resource)
        self._label = label if label is not None else (
            lambda key: str(self.resource.get(key, "") or ""))
        self.specs = config.metrics
        self.exports = self.failed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._exporter: Any = None
        self._server: Any = None
        self._start_ns = time.time_ns()
        self.prometheus_port: int | None = None
        self.prometheus_host: str | None = None
        lifecycle.track(self)
        for spec in self.specs:
            kind, _, arg = spec.partition(":")
            if kind == "otlp":
                self._start_otlp()
            elif kind == "prometheus":
                address = prometheus_address(spec)
                assert address is not None  # validated by the config
                self._start_prometheus(*address)

    # -- what is exported -------------------------------------------------------------------
    def attributes(self) -> dict[str, Any]:
        res = self.resource
        return {C.ATTR_BACKEND: self._label(C.ATTR_BACKEND),
                C.ATTR_TASK: self._label(C.ATTR_TASK),
                C.ATTR_WORKER_RANK: int(res.get(C.ATTR_WORKER_RANK, 0) or 0)}

    def _phases(self) -> Iterator[tuple[str, Distribution, tuple[int, float, float]]]:
        """(span name, buckets, exact (count, total, max)) of every timed phase with calls."""
        proc = self.processor
        if proc is None:
            return
        dists = proc.distributions()
        totals = proc.totals()
        for key, dist in dists.items():
            if not key.endswith("_ms") or key not in totals or not dist.count:
                continue
            yield proc.catalog.label(key), dist, totals[key]

    def _counters(self) -> tuple[int, int]:
        proc = self.processor
        if proc is None:
            return 0, 0
        totals = proc.totals()
        resets = totals.get(C.RESET_DONE_COUNT)
        steps = totals.get(C.ENV_STEP.key)
        return (int(round(resets[1])) if resets else 0), (steps[0] if steps else 0)

    def metrics_data(self) -> Any:
        """The current statistics as the SDK's ``MetricsData`` (cumulative)."""
        from opentelemetry.sdk.metrics._internal.point import Buckets
        from opentelemetry.sdk.metrics.export import (
            AggregationTemporality,
            ExponentialHistogram,
            ExponentialHistogramDataPoint,
            Metric,
            MetricsData,
            NumberDataPoint,
            ResourceMetrics,
            ScopeMetrics,
            Sum,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        now = time.time_ns()
        base = self.attributes()
        points = []
        for name, dist, (_count, total, mx) in self._phases():
            lo = min(dist.counts) if dist.counts else 0
            hi = max(dist.counts) if dist.counts else -1
            counts = [dist.counts.get(i, 0) for i in range(lo, hi + 1)]
            points.append(ExponentialHistogramDataPoint(
                attributes={**base, C.ATTR_PHASE: name}, start_time_unix_nano=self._start_ns,
                time_unix_nano=now, count=dist.count, sum=float(total), scale=SCALE,
                zero_count=dist.zero, positive=Buckets(offset=lo, bucket_counts=counts),
                negative=Buckets(offset=0, bucket_counts=[]), flags=0,
                min=0.0 if dist.zero else dist.min, max=float(mx)))
        resets, steps = self._counters()
        cumulative = AggregationTemporality.CUMULATIVE

        def counter(name: str, value: int, unit: str) -> Metric:
            return Metric(name=name, description=None, unit=unit, data=Sum(
                data_points=[NumberDataPoint(attributes=base, start_time_unix_nano=self._start_ns,
                                             time_unix_nano=now, value=value)],
                aggregation_temporality=cumulative, is_monotonic=True))

        metrics = [Metric(name=C.METRIC_PHASE_DURATION, description="resettrace phase durations",
                          unit="ms", data=ExponentialHistogram(
                              data_points=points, aggregation_temporality=cumulative)),
                   counter(C.METRIC_RESETS, resets, "{env}"),
                   counter(C.METRIC_ENV_STEPS, steps, "{step}")]
        resource = Resource.create(self.resource)
        return MetricsData(resource_metrics=[ResourceMetrics(
            resource=resource, scope_metrics=[ScopeMetrics(
                scope=InstrumentationScope(_SCOPE), metrics=metrics, schema_url="")],
            schema_url="")])

    # -- OTLP -------------------------------------------------------------------------------
    def _start_otlp(self) -> None:
        cfg = self.config
        try:
            if cfg.otlp_protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                    OTLPMetricExporter,
                )
            else:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
                    OTLPMetricExporter,
                )
            # the endpoint, TLS, compression and timeout as resettrace resolved them (a
            # refused endpoint is never replaced); headers and certificates as the SDK
            # reads them (OTEL_EXPORTER_OTLP_METRICS_*, else the generic variables)
            from resettrace.config import metrics_endpoint, sdk_environ
            from resettrace.tracing.export.exporters import otlp_arguments

            args = otlp_arguments(cfg, timeout_s=cfg.metrics_push_timeout_s, metrics=True)
            args["endpoint"], insecure = metrics_endpoint(cfg)
            if "insecure" in args:
                args["insecure"] = insecure
            with sdk_environ():  # no OTEL_* variable it would fail on or print
                self._exporter = OTLPMetricExporter(**args)
        except Exception as e:  # a bad setting: said once, training goes on
            from resettrace.config import EndpointRefused, say_once

            if isinstance(e, EndpointRefused):  # the line the span export says too
                say_once("resettrace: %s", e, level=logging.ERROR)
            else:
                log.warning("resettrace: OTLP metrics are off: %s", e)
            return
        self._thread = threading.Thread(target=self._push_loop, daemon=True,
                                        name="resettrace-metrics")
        self._thread.start()

    def _push_loop(self) -> None:
        interval = self.config.metrics_interval_s
        while not self._stop.wait(interval):
            self.push()

    def push(self, timeout_s: float = 10.0, *, _count: bool = True) -> bool:
        """Export the statistics now (OTLP); False (and counted) when it failed."""
        exporter = self._exporter
        if exporter is None:
            return False
        from opentelemetry.sdk.metrics.export import MetricExportResult

        try:
            ok = exporter.export(self.metrics_data(),
                                 timeout_millis=1e3 * timeout_s) is MetricExportResult.SUCCESS
        except Exception:  # exporting must never break training
            log.debug("resettrace: metrics export raised", exc_info=True)
            ok = False
        if _count:
            self.exports += 1
            if not ok:
                self.failed += 1
        return ok

    # -- Prometheus ------------------------------------------------------------------------
    def _start_prometheus(self, host: str, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            log.warning("resettrace: RESETTRACE_METRICS=prometheus needs prometheus_client "
                        "(pip install prometheus-client)")
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_PromCollector(self))
        try:
            self._server = start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            log.warning("resettrace: the Prometheus endpoint on %s port %d is off: %s", host,
                        port, e.strerror or e)
            return
        if not _is_loopback(host):
            log.warning("resettrace: serving metrics on %s:%d, reachable from other machines "
                        "(no authentication; each scrape costs this process CPU time)",
                        host, port)
        self.prometheus_port = port
        self.prometheus_host = host

    def _after_fork_in_child(self) -> None:
        """A forked process has no push thread and does not serve the parent's port: its
        copies are dropped (closing only its inherited socket), so closing never waits on
        a server loop that does not run here."""
        if self._server is not None:
            server, _thread = self._server
            try:
                server.socket.close()
            except OSError:
                pass
        self._server = None
        self._thread = None
        self._exporter = None  # gRPC channels do not survive a fork
        self.prometheus_port = self.prometheus_host = None
        self.specs = ()

    def report(self) -> dict[str, Any]:
        return {"metrics": list(self.specs), "otlp_exports": self.exports,
                "otlp_failed": self.failed, "prometheus_port": self.prometheus_port,
                "prometheus_host": self.prometheus_host}

    def close(self, timeout_s: float) -> None:
        """Stop the push thread after one last export (bounded), and the scrape server."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(timeout=min(timeout_s, 1.0))
            # the last push, on a thread of its own: a collector that is down or slow costs
            # this shutdown no more than its timeout (a push still running then is counted
            # as failed)
            result: list[bool] = []
            last = threading.Thread(target=lambda: result.append(self.push(
                max(0.1, deadline - time.monotonic()), _count=False)), daemon=True,
                name="resettrace-metrics-last")
            last.start()
            last.join(timeout=max(0.05, deadline - time.monotonic()))
            self.exports += 1
            if not (result and result[0]):
                self.failed += 1
        if self._exporter is not None:
            try:
                self._exporter.shutdown(timeout_millis=1e3 * min(timeout_s, 1.0))
            except Exception:
                pass
        if self._server is not None:
            server, _thread = self._server
            server.shutdown()
            server.server_close()
            self._server = None





class _PromCollector:
    """A ``prometheus_client`` collector reading the statistics at each scrape."""

    def __init__(self, owner: MetricsExport) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        base = {_label(k): str(v) for k, v in self.owner.attributes().items()}
        names = [*base, _label(C.ATTR_PHASE)]
        hist = HistogramMetricFamily(_label(C.METRIC_PHASE_DURATION) + "_milliseconds",
                                     "resettrace phase durations (ms)", labels=names)
        for name, dist, (_count, total, _mx) in self.owner._phases():
            merged: dict[int, int] = {}
            for i, c in dist.counts.items():  # bucket i of scale 5 lies in bucket i >> 2 of 3
                j = i >> _PROM_SHIFT
                merged[j] = merged.get(j, 0) + c
            buckets = []
            seen = dist.zero
            for j in sorted(merged):
                seen += merged[j]
                upper = 2.0 ** ((j + 1) / 2 ** PROMETHEUS_SCALE)
                buckets.append((repr(upper), seen))
            buckets.append(("+Inf", dist.count))
            hist.add_metric([*base.values(), name], buckets, sum_value=float(total))
        yield hist
        resets, steps = self.owner._counters()
        for metric, value in ((C.METRIC_RESETS, resets), (C.METRIC_ENV_STEPS, steps)):
            family = CounterMetricFamily(_label(metric), f"resettrace {metric}",
                                         labels=list(base))
            family.add_metric(list(base.values()), value)
            yield family

