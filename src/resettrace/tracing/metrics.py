"""Metrics of the aggregated statistics: OTLP push and a Prometheus scrape endpoint.

``RESETTRACE_METRICS=otlp`` and/or ``prometheus[:PORT]`` (``timing`` and ``trace`` modes).
The metrics are read from the timing processor's exact statistics when they are exported
or scraped, so they see every call whatever the trace sampling, and nothing is added to the
hot path or to the aggregation: no per-call instrument call is made anywhere.

* ``resettrace.phase.duration`` (unit ``ms``): per phase, its calls in the processor's
  base-2 exponential buckets (:mod:`resettrace.distribution`, scale 6), with the exact
  count, sum, min and max. OTLP gets it as an exponential histogram; Prometheus as a classic
  histogram ``resettrace_phase_duration_milliseconds`` whose ``le`` bounds are the same
  buckets merged eight to one (``2 ** (1/8)`` apart: ``histogram_quantile`` is then within
  about 9% of the exact percentile).
* ``resettrace.resets`` (envs reset) and ``resettrace.env_steps`` (env step calls): counters.

Attributes: ``resettrace.phase`` (the span name), ``resettrace.backend.name``,
``resettrace.task.name`` (the names the spans carry: :meth:`Tracing.label`),
``resettrace.worker.rank`` and ``process.pid`` (so that the series of two processes never
collide, and a sum over them counts each once). OTLP pushes use the SDK's OTLP metric
exporter (its endpoint, headers and timeout variables: ``OTEL_EXPORTER_OTLP_METRICS_*``,
else the generic ones) every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (default 60,000) on a
daemon thread, and once more at shutdown; failed or timed-out exports are counted
(:meth:`MetricsExport.report`), never raised. The scrape endpoint is
``prometheus_client``'s HTTP server on ``HOST:PORT`` (default ``127.0.0.1:9464``: loopback
only, unless a host is given), serving a collector that reads the statistics at each
scrape.

Every process serves its own endpoint (``prometheus_client`` serves one registry per
process; a job's processes cannot share one), by one rule: a process binds the configured
port if it is free, else (the port is taken: by the job's first process, or another
program) a port the OS chooses, and says so in one line naming where it serves; port 0:
every process on a port the OS chooses. A process forked from one that serves (a
``multiprocessing`` fork or forkserver worker, a plain ``os.fork``) does not serve its
parent's socket (its copy is closed): it starts its own endpoint, in a multiprocessing
worker once the worker knows its rank, else at the fork (never in a child that
``subprocess`` forks to run another program). With ``RESETTRACE_PROMETHEUS_SD=DIR`` each
serving process lists its endpoint in ``DIR/resettrace-HOST-PID.json``, a Prometheus
``file_sd`` file of its own (``[{"targets": ["127.0.0.1:PORT"], "labels": {"pid", "rank",
"host"}}]``, written by :func:`resettrace.outputs.write_output`'s rules), removes it when it
stops serving, and removes the files of this host's processes that died without removing
theirs. The OTLP push thread is not restarted in a forked process.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resettrace import catalog as C
from resettrace.config import ENV_PROMETHEUS_SD, prometheus_address
from resettrace.distribution import SCALE, Distribution
from resettrace.outputs import OutputKind
from resettrace.tracing import lifecycle

if TYPE_CHECKING:
    from resettrace.config import Config
    from resettrace.tracing.aggregate import Aggregator

__all__ = ["MetricsExport", "PROMETHEUS_SCALE", "PROMETHEUS_SD", "SD_PREFIX", "sd_file_name"]

log = logging.getLogger("resettrace")

#: the scale of the Prometheus buckets (the processor's buckets merged 2**(SCALE-this) to one)
PROMETHEUS_SCALE = 3
_PROM_SHIFT = SCALE - PROMETHEUS_SCALE
_SCOPE = "resettrace"
#: OpenTelemetry's resource attribute of the process id (a metric attribute here too)
_ATTR_PID = "process.pid"
#: the file_sd files resettrace writes: ``resettrace-HOST-PID.json``
SD_PREFIX = "resettrace-"
#: a target label that marks a file_sd file as resettrace's; Prometheus drops labels
#: starting with ``__`` after relabelling, so no series carries it
_SD_MARK = "__meta_resettrace_pid"


def _is_sd(head: bytes) -> bool:
    # the layout _write_sd writes: one target group whose labels hold the mark
    try:
        groups = json.loads(head)
    except ValueError:
        return False
    return (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict)
            and set(groups[0]) == {"targets", "labels"}
            and isinstance(groups[0]["labels"], dict) and _SD_MARK in groups[0]["labels"])


#: a Prometheus file_sd target file written by resettrace (one process's endpoint)
PROMETHEUS_SD = OutputKind("Prometheus file_sd target file", _is_sd)


def _safe_host(host: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c in "._") else "_" for c in host)


def sd_file_name(host: str, pid: int) -> str:
    """The file_sd file name of process ``pid`` on the machine named ``host``."""
    return f"{SD_PREFIX}{_safe_host(host)}-{pid}.json"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _forked_by() -> str:
    """Which code forked this process, called in the child at the fork: ``multiprocessing``
    (a fork or forkserver worker, whose rank is known only once it starts), ``subprocess``
    (a child that runs another program next), else ``""``."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name in ("multiprocessing.popen_fork", "multiprocessing.forkserver"):
            return "multiprocessing"
        if name == "subprocess":
            return "subprocess"
        frame = frame.f_back  # type: ignore[assignment]
    return ""


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
    the resource attributes (pid, rank and the OTLP resource; a callable is asked again in
    a forked process, for the child's own) and ``label(key)``, the backend and task names
    the spans carry (:meth:`resettrace.tracing.session.Tracing.label`)."""

    def __init__(self, processor: Aggregator | None, config: Config,
                 resource: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
                 label: Callable[[str], str] | None = None) -> None:
        self.aggregator = processor
        self.config = config
        self._resource = resource if callable(resource) else None
        self.resource = dict(resource() if callable(resource) else resource)
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
        #: the configured ``(host, port)`` of the scrape endpoint (``None``: no endpoint)
        self.prometheus_address: tuple[str, int] | None = None
        #: the file_sd file listing this process's endpoint (``None``: none written)
        self.prometheus_sd_file: str | None = None
        # the folder of the file_sd files, made absolute once (a forked child may chdir)
        self._sd_dir = None if config.prometheus_sd is None else \
            Path(os.path.abspath(os.path.expanduser(config.prometheus_sd)))
        self._sd_written: tuple[int, Path, int, int] | None = None  # pid, path, dev, inode
        self._serve_after_fork = False
        lifecycle.track(self)
        for spec in self.specs:
            kind, _, arg = spec.partition(":")
            if kind == "otlp":
                self._start_otlp()
            elif kind == "prometheus" and self.prometheus_address is None:
                address = prometheus_address(spec)
                assert address is not None  # validated by the config
                self.prometheus_address = address
                self._start_prometheus(*address)
        if self.prometheus_address is not None:
            from multiprocessing import util

            # a multiprocessing worker forked from this process serves once it has started
            # (and knows its rank): multiprocessing calls this in the worker
            util.register_after_fork(self, MetricsExport._after_multiprocessing_fork)

    # -- what is exported -------------------------------------------------------------------
    def attributes(self) -> dict[str, Any]:
        res = self.resource
        return {C.ATTR_BACKEND: self._label(C.ATTR_BACKEND),
                C.ATTR_TASK: self._label(C.ATTR_TASK),
                C.ATTR_WORKER_RANK: int(res.get(C.ATTR_WORKER_RANK, 0) or 0),
                _ATTR_PID: int(res.get(_ATTR_PID) or os.getpid())}

    def _phases(self) -> Iterator[tuple[str, Distribution, tuple[int, float, float]]]:
        """(span name, buckets, exact (count, total, max)) of every timed phase with calls."""
        proc = self.aggregator
        if proc is None:
            return
        dists = proc.distributions()
        totals = proc.totals()
        for key, dist in dists.items():
            if not key.endswith("_ms") or key not in totals or not dist.count:
                continue
            yield proc.catalog.label(key), dist, totals[key]

    def _counters(self) -> tuple[int, int]:
        proc = self.aggregator
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
            from resettrace.config import EndpointRefused
            from resettrace.envvars import say_once

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
        """Serve on ``host:port``, else (the port is taken, or not this process's to bind)
        on a port the OS chooses, saying so in one line; then list the endpoint in the
        file_sd folder, if one is set."""
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:  # (training goes on: the metrics are what is missing)
            from resettrace.extras import MissingExtra

            log.warning("resettrace: %s", MissingExtra("RESETTRACE_METRICS=prometheus",
                                                       "prometheus", "prometheus_client"))
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_PromCollector(self))
        wanted = _address(host, port)
        why = ""
        server = None
        if port:
            try:
                server = start_http_server(port, addr=host, registry=registry)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    why = f"{wanted} is taken (by the first process to bind it: of " \
                          "this job, or another program)"
                elif e.errno == errno.EACCES:
                    why = f"{wanted} cannot be bound by this process ({e.strerror})"
                else:  # the address itself: another port would fail alike
                    log.warning("resettrace: the Prometheus endpoint on %s is off: %s; this "
                                "process (pid %d) serves no metrics", wanted,
                                e.strerror or e, os.getpid())
                    return
        if server is None:
            try:
                server = start_http_server(0, addr=host, registry=registry)
            except OSError as e:
                log.warning("resettrace: the Prometheus endpoint on %s is off: %s; this "
                            "process (pid %d) serves no metrics", _address(host, 0),
                            e.strerror or e, os.getpid())
                return
        self._server = server
        bound = int(server[0].server_port)
        self.prometheus_port = bound
        self.prometheus_host = host
        if not _is_loopback(host):
            log.warning("resettrace: serving metrics on %s, reachable from other machines "
                        "(no authentication; each scrape costs this process CPU time)",
                        _address(host, bound))
        self._write_sd(host, bound)
        if not why and port:
            return  # the configured endpoint: nothing to say
        rank = int(self.resource.get(C.ATTR_WORKER_RANK, 0) or 0)
        where = f"this process (pid {os.getpid()}, rank {rank}) serves its metrics on " \
                f"{_address(host, bound)}"
        listed = f"listed for Prometheus in {self.prometheus_sd_file}" \
            if self.prometheus_sd_file else \
            f"set {ENV_PROMETHEUS_SD}=DIR to list every process for Prometheus"
        if why:  # a bind that failed: always said
            log.warning("resettrace: %s; %s instead, %s", why, where, listed)
        else:  # port 0, as asked: a warning only when nothing lists it
            log.log(logging.INFO if self.prometheus_sd_file else logging.WARNING,
                    "resettrace: %s (a port the OS chose), %s", where, listed)

    def _sd_target(self, host: str, port: int) -> str:
        if host in ("", "0.0.0.0", "::"):  # every interface: the machine's name
            return _address(socket.gethostname(), port)
        return _address(host, port)

    def _write_sd(self, host: str, port: int) -> None:
        """List this process's endpoint in the file_sd folder (if set): one file of its
        own, written atomically by the rules of :mod:`resettrace.outputs` (a link is never
        followed, a file that is not resettrace's never replaced); the files of this
        host's dead processes are removed first."""
        folder = self._sd_dir
        if folder is None:
            return
        from resettrace.outputs import write_output

        pid = os.getpid()
        machine = socket.gethostname()
        _remove_stale(folder, machine)
        labels = {"pid": str(pid),
                  "rank": str(int(self.resource.get(C.ATTR_WORKER_RANK, 0) or 0)),
                  "host": machine, _SD_MARK: str(pid)}
        data = json.dumps([{"targets": [self._sd_target(host, port)], "labels": labels}])
        try:
            path = write_output(folder / sd_file_name(machine, pid), PROMETHEUS_SD,
                                data.encode() + b"\n")
            st = os.lstat(path)
        except OSError as e:  # OutputRefused too: said, training goes on
            log.warning("resettrace: the Prometheus target file of this process (pid %d, "
                        "serving on %s) was not written in %s: %s", pid,
                        _address(host, port), folder, e)
            return
        self._sd_written = (pid, path, st.st_dev, st.st_ino)
        self.prometheus_sd_file = str(path)

    def _remove_sd(self) -> None:
        """Remove this process's file_sd file, if it is still the one it wrote."""
        written, self._sd_written = self._sd_written, None
        self.prometheus_sd_file = None
        if written is None or written[0] != os.getpid():
            return
        _pid, path, dev, ino = written
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == (dev, ino):
                os.unlink(path)
        except OSError:
            pass  # gone already, or not ours to remove

    def _after_fork_in_child(self) -> None:
        """A forked process has no push thread and does not serve the parent's socket: its
        copies are dropped (closing only its inherited socket), so closing never waits on
        a server loop that does not run here; the parent's file_sd file stays the
        parent's. It serves an endpoint of its own (module docstring)."""
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
        self._sd_written = None
        self.prometheus_sd_file = None
        self._serve_after_fork = False
        if self.prometheus_address is None or self._stop.is_set():
            self.specs = ()  # nothing served, or the parent's session was closed
            return
        self.specs = tuple(s for s in self.specs if s.startswith("prometheus"))
        self._stop = threading.Event()
        by = _forked_by()
        if by == "multiprocessing":
            self._serve_after_fork = True  # once the worker has started: its rank is known
        elif by != "subprocess":  # a subprocess child runs another program next
            self._serve_again()

    def _after_multiprocessing_fork(self) -> None:
        if self._serve_after_fork:
            self._serve_after_fork = False
            self._serve_again()

    def _serve_again(self) -> None:
        """Serve this (forked) process's own endpoint, with its own pid and rank."""
        try:
            if self._resource is not None:
                self.resource = dict(self._resource())
            else:
                self.resource[_ATTR_PID] = os.getpid()
            assert self.prometheus_address is not None
            self._start_prometheus(*self.prometheus_address)
        except Exception as e:  # at a fork: said, never raised into the child
            log.warning("resettrace: this forked process (pid %d) serves no Prometheus "
                        "metrics: %s", os.getpid(), e)

    def report(self) -> dict[str, Any]:
        return {"metrics": list(self.specs), "otlp_exports": self.exports,
                "otlp_failed": self.failed, "prometheus_port": self.prometheus_port,
                "prometheus_host": self.prometheus_host,
                "prometheus_sd_file": self.prometheus_sd_file}

    def close(self, timeout_s: float) -> None:
        """Stop the push thread after one last export (bounded), and the scrape server
        (its file_sd file removed first: Prometheus stops scraping it)."""
        self._stop.set()
        self._serve_after_fork = False
        self._remove_sd()
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


def _remove_stale(folder: Path, machine: str) -> None:
    """Remove the file_sd files of this machine's processes that are gone (killed before
    they removed theirs): only files resettrace wrote, never through a link."""
    prefix = SD_PREFIX + _safe_host(machine) + "-"
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        pid_text = name[len(prefix):-len(".json")].split(".", 1)[0]  # PID or PID.N
        if not (pid_text.isascii() and pid_text.isdigit() and len(pid_text) < 10):
            continue
        pid = int(pid_text)
        if pid == os.getpid() or _alive(pid):
            continue
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # a link, or gone
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not PROMETHEUS_SD.recognise(
                    os.pread(fd, 1 << 16, 0)):
                continue
            now = os.lstat(path)  # still that file, and its process still gone
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) and not _alive(pid):
                os.unlink(path)
                log.debug("resettrace: removed %s (process %d is gone)", path, pid)
        except OSError:
            pass
        finally:
            os.close(fd)


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
            for i, c in dist.counts.items():  # bucket i of scale 6 lies in bucket i >> 3 of 3
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

