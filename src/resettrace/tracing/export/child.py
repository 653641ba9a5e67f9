"""The export process: ``python -m resettrace.tracing.export.child``, started by
:class:`~resettrace.tracing.export.parent.ProcessExporter`.

It reads frames (:mod:`resettrace.tracing.export.protocol`) from its stdin, turns the
records into spans with their exact timestamps and parent links, and hands them to the
configured exporters in batches, with no SDK span built: OTLP requests encoded straight
from the records (:mod:`resettrace.tracing.export.otlp_wire`), and the file formats
written from them (:mod:`resettrace.tracing.export.records`), every exporter the same
batches with the same ids. ``Config.span_encoder = "sdk"`` builds SDK spans instead (the
reference). Every setting comes with the SETTINGS frame: nothing is read from its own
environment. It reports on its stdout, one JSON status per line.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from resettrace.catalog import ATTR_EXPORT_DROPPED, ATTR_WORKER_RANK
from resettrace.tracing.export.protocol import FRAME, Kind, head_of
from resettrace.tracing.layout import RECORD_FIELDS
from resettrace.tracing.recorder import error_name

__all__ = ["main"]

#: spans per export call, and the longest a span waits for its batch (ms;
#: ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` and ``OTEL_BSP_SCHEDULE_DELAY`` set them)
_BATCH_SPANS = 512
_BATCH_DELAY_MS = 1000
#: how often the export process checks that the training process is alive (s)
_WATCH_S = 0.1
#: of the shutdown timeout after the training process died, what is left for this
#: process to end in (the exit itself) once its hard deadline comes
_EXIT_MARGIN_S = 0.05
#: exporters the export process writes from the records (no SDK span built)
_RECORD_KINDS = frozenset({"file", "perfetto", "otlp-json", "jaeger-json", "otlp"})


def _collector() -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class _Collect(SpanProcessor):
        """Keeps ended spans for the next export batch."""

        def __init__(self) -> None:
            self.spans: list[Any] = []

        def on_end(self, span: Any) -> None:
            self.spans.append(span)

    return _Collect()


def _batches(spans: list[Any], size: int) -> list[list[Any]]:
    """``spans`` in batches of at most ``size`` (a backlog is many calls), cut between
    traces where one fits (file formats then get whole traces; spans come trace by trace)."""
    out: list[list[Any]] = []
    start = 0
    n = len(spans)
    while start < n:
        end = min(start + size, n)
        if end < n:
            cut = end
            tid = spans[end].get_span_context().trace_id
            while cut > start and spans[cut - 1].get_span_context().trace_id == tid:
                cut -= 1
            if cut > start:
                end = cut
        out.append(spans[start:end])
        start = end
    return out


class _Child:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.recorders: dict[int, tuple[dict[str, Any], int]] = {}
        #: the training process's resource attributes: a recorder's attribute that holds
        #: the same value is the process's, carried once on the resource, not on each span
        self.resource: dict[str, Any] = {}
        self.errors: dict[int, str] = {}
        self.phases: dict[int, str] = {}
        self.exporters: list[tuple[str, Any]] = []
        self.exported: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        #: of ``failed``: sent and not acknowledged in time (the receiver may hold them)
        self.timed_out: dict[str, int] = {}
        self.received = 0
        self.flushed = 0
        #: per read whose spans still wait to be exported: (its time, ``received`` after it)
        self.arrivals: deque[tuple[float, int]] = deque()
        self.stop = False
        self.batch_size = _BATCH_SPANS
        self.batch_delay = _BATCH_DELAY_MS / 1000.0
        #: of ``failed``'s complement: spans never sent because the deadline came first
        self.cut_off: dict[str, int] = {}
        #: spans of the export call under way, per exporter (announced before the call:
        #: if this process is killed during it, they were sent and not acknowledged)
        self.in_flight: dict[str, int] = {}
        #: why an exporter cannot export (it could not be created): its spans are failed
        self.broken: dict[str, str] = {}
        #: the broken exporters the training process has said why of already
        self._said: set[str] = set()
        #: ``time.monotonic()`` by which everything must be done (set when told to leave)
        self.deadline: float | None = None
        self.shutdown_timeout = 2.0
        # the training process (its pid and the time it started this one come as
        # arguments: it may be gone before this process has imported anything)
        self.parent_pid = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()
        #: ``time.monotonic()`` when the training process was last known alive
        self.alive_at = float(sys.argv[2]) if len(sys.argv) > 2 else time.monotonic()
        #: written to by the parent watch: wakes the main loop
        self.wake_r, self.wake_w = os.pipe()
        #: CPU time spent before the first trace (start-up, imports, exporters)
        self.setup_cpu_s = 0.0
        #: status bytes not yet written to stdout; ``partial``: the first line is begun
        self.unsent = b""
        self.partial = False
        self.tracer: Any = None
        self.collect = _collector()
        #: OTLP encoded straight from the records (every exporter is ``otlp``); else None
        self.wire: Any = None
        #: every exporter a file format or ``otlp`` (not all ``otlp``): the traces as
        #: records with their ids, written by each format's record encoder; else None
        self.queue: Any = None
        #: per recorder id, its attributes as sent (a key that changes when they do)
        self.attr_keys: dict[int, str] = {}
        #: traces of one recorder with the same root attributes waiting to be encoded:
        #: (recorder id, dropped count, record bytes, record counts)
        self.run_of: tuple[int, int, list[bytes], list[int]] | None = None

    def setup(self, settings: dict[str, Any]) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        from resettrace.catalog import INSTRUMENTATION_SCOPE
        from resettrace.config import Config
        from resettrace.tracing.export.exporters import make_exporter

        config = Config(**dict(settings["config"], exporters=tuple(settings["exporters"])))
        self.batch_size = config.export_batch_size
        self.batch_delay = config.export_delay_s
        self.shutdown_timeout = config.shutdown_timeout_s
        self.parent_pid = int(settings["parent_pid"])
        # the resource describes the training process, not this one
        resource = Resource.create(dict(settings["resource"],
                                        **{"process.pid": settings["parent_pid"]}))
        provider = TracerProvider(resource=resource)
        self.resource = dict(resource.attributes)
        provider.add_span_processor(self.collect)
        self.tracer = provider.get_tracer(INSTRUMENTATION_SCOPE)
        for spec in settings["exporters"]:
            self.exported[spec] = self.failed[spec] = self.timed_out[spec] = 0
            self.cut_off[spec] = 0
        if config.span_encoder != "sdk" and \
                settings["exporters"] and all(x == "otlp" for x in settings["exporters"]):
            from resettrace.tracing.export.otlp_wire import WireEncoder, make_wire_exporter

            try:
                wire = make_wire_exporter(config)
            except Exception as e:  # a setting the exporter refuses: said, and counted
                wire = None
                for spec in settings["exporters"]:
                    self._broke(spec, e)
            if wire is not None:  # no SDK span is built: the records are encoded as they are
                phases = self.phases
                self.wire = WireEncoder(
                    dict(resource.attributes),
                    lambda i: phases.get(i) or f"resettrace.phase.{i}",
                    lambda code: self.errors.get(code, error_name(code)))
                for spec in settings["exporters"]:
                    self.exporters.append((spec, wire))
                return
        records = config.span_encoder != "sdk" and all(
            x.partition(":")[0] in _RECORD_KINDS for x in settings["exporters"])
        for spec in settings["exporters"]:
            if spec in self.broken:
                continue
            try:
                if records and spec == "otlp":
                    exporter = self._otlp_from_records(config, resource)
                    if exporter is None:  # the SDK lacks what that needs: SDK spans
                        records = False
                        exporter = make_exporter(spec, config)
                else:
                    exporter = make_exporter(
                        spec, config, pid=settings["parent_pid"],
                        rank=int(settings["resource"].get(ATTR_WORKER_RANK,
                                                          config.worker_rank)))
                given = settings.get("files", {}).get(spec)
                if given is not None:  # opened and locked by the training process
                    path, fd = given
                    exporter.adopt(path, open(fd, "r+b", buffering=0))  # noqa: SIM115
                self.exporters.append((spec, exporter))
            except Exception as e:  # a bad exporter must not stop the others
                self._broke(spec, e)
        if records:  # no SDK span is built: every format is written from the records
            from resettrace.tracing.export.records import SpanSource, TraceQueue

            self.queue = TraceQueue(SpanSource(dict(resource.attributes), self.span_name,
                                               self.error_name))
        for spec, reason in self.broken.items():
            if spec not in self._said:
                print(f"resettrace export process: {reason}", file=sys.stderr)

    def _broke(self, spec: str, e: Exception) -> None:
        """``spec`` cannot be made because of ``e``: counted, and said here unless the
        training process said it already (an endpoint it refused: named there, once)."""
        from resettrace.tracing.export.exporters import EndpointRefused

        self.broken[spec] = f"cannot create {spec!r}: {e}"
        if isinstance(e, EndpointRefused):
            self._said.add(spec)

    def span_name(self, index: int) -> str:
        return self.phases.get(index) or f"resettrace.phase.{index}"

    def error_name(self, code: int) -> str:
        return self.errors.get(code, error_name(code))

    def _otlp_from_records(self, config: Any, resource: Any) -> Any:
        """The OTLP exporter, sending batches of record traces encoded with their ids;
        None when the installed SDK lacks what that needs."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        from resettrace.tracing.export.otlp_wire import WireEncoder, make_wire_exporter

        wire = make_wire_exporter(config)
        if wire is None:
            return None
        encoder = WireEncoder(dict(resource.attributes), self.span_name, self.error_name)

        def export_traces(batch: Any) -> Any:
            for traces in batch:
                encoder.add_record_traces(traces)
            payload = encoder.take(1 << 62)
            return SpanExportResult.SUCCESS if payload is None else wire.export_payload(payload)

        wire.export_traces = export_traces
        return wire

    def handle(self, kind: int, payload: memoryview) -> None:
        head, rest = head_of(kind, payload)
        if kind == Kind.TRACE:
            rid, n, dropped = head
            attrs, offset = self.recorders[rid]
            self.received += n
            data = rest[:8 * RECORD_FIELDS * n]
            if self.wire is not None or self.queue is not None:
                # encoded with the traces that follow it in the pipe
                run = self.run_of
                if run is not None and (run[0] != rid or run[1] != dropped):
                    self.encode_run()
                    run = None
                if run is None:
                    self.run_of = run = (rid, dropped, [], [])
                run[2].append(bytes(data))  # a copy: the parse buffer is resized next
                run[3].append(n)
                return
            records = np.frombuffer(data, dtype="<i8").reshape(n, RECORD_FIELDS).tolist()
            from resettrace.tracing.spans import build_spans

            build_spans(self.tracer, records, attrs, offset, self.error_name,
                        self.span_name, {ATTR_EXPORT_DROPPED: dropped})
            return
        self.encode_run()  # a frame of another kind: the traces before it come first
        if kind == Kind.REGISTER:
            rid, offset = head
            text = bytes(rest).decode()
            resource = self.resource
            self.recorders[rid] = ({k: v for k, v in json.loads(text).items()
                                    if k not in resource or resource[k] != v}, offset)
            self.attr_keys[rid] = text
            if self.wire is not None:
                self.wire.set_attributes(rid, self.recorders[rid][0])
        elif kind == Kind.PHASE:
            self.phases[head[0]] = bytes(rest).decode()
        elif kind == Kind.ERROR:
            self.errors[head[0]] = bytes(rest).decode()
        elif kind == Kind.FLUSH:
            self.export()
            (self.flushed,) = head
            for _, exporter in self.exporters:
                with contextlib.suppress(Exception):
                    exporter.force_flush()
            self.status()
        elif kind == Kind.QUIT:
            self.leave(head[0])
        elif kind == Kind.SETTINGS:
            self.setup(json.loads(bytes(rest)))
            self.setup_cpu_s = time.process_time()

    def encode_run(self) -> None:
        run, self.run_of = self.run_of, None
        if run is not None:
            rid, dropped, data, sizes = run
            records = np.frombuffer(b"".join(data), dtype="<i8").reshape(-1, RECORD_FIELDS)
            attrs, offset = self.recorders[rid]
            if self.queue is not None:
                self.queue.add(attrs, self.attr_keys[rid], offset,
                               {ATTR_EXPORT_DROPPED: dropped}, records, sizes)
                return
            self.wire.add_traces(rid, offset, {ATTR_EXPORT_DROPPED: dropped}, records, sizes)

    @property
    def batch_since(self) -> float:
        """When the oldest span not yet exported arrived (0.0: none waits)."""
        return self.arrivals[0][0] if self.arrivals else 0.0

    @property
    def waiting(self) -> int:
        """Spans received and not yet handed to the exporters."""
        if self.queue is not None:
            return int(self.queue.pending)
        return self.wire.pending if self.wire is not None else len(self.collect.spans)

    def leave(self, within_s: float) -> None:
        """Stop reading, and export what is here within ``within_s`` seconds."""
        self.leave_by(time.monotonic() + max(0.0, within_s))

    def leave_by(self, deadline: float) -> None:
        """Stop reading, and export what is here by ``deadline`` (``time.monotonic()``)."""
        self.deadline = deadline if self.deadline is None else min(self.deadline, deadline)
        self.stop = True

    def export(self, full_only: bool = False) -> None:
        """Hand what waits to every exporter, in capped batches, and count the outcome;
        with ``full_only``, only full batches (the rest waits for more spans, or for its
        delay: each export call costs the sender and the receiver ~0.3 ms of CPU).

        Every batch's fate is reported as it is known: the status says which batch is
        under way before each call and what it came to after it. Past the deadline, a
        batch is not sent: its spans are counted as cut off."""
        batches: list[tuple[Any, int]] = []
        if self.wire is not None:  # encoded requests of whole traces
            while not (full_only and self.wire.pending < self.batch_size) and \
                    (payload := self.wire.take(self.batch_size)) is not None:
                batches.append((payload, payload.count))
            send = "export_payload"
        elif self.queue is not None:  # whole traces as records, written by every exporter
            while not (full_only and self.queue.pending < self.batch_size) and \
                    (traces := self.queue.take(self.batch_size)):
                batches.append((traces, sum(t.spans for t in traces)))
            send = "export_traces"
        else:  # SDK spans
            spans, self.collect.spans = self.collect.spans, []
            batches = [(b, len(b)) for b in _batches(spans, self.batch_size)]
            if full_only and batches and len(batches[-1][0]) < self.batch_size:
                self.collect.spans = batches.pop()[0]
            send = "export"
        # the reads whose spans all went: the oldest still waiting sets the next delay
        taken = self.received - self.waiting
        arrivals = self.arrivals
        while arrivals and arrivals[0][1] <= taken:
            arrivals.popleft()
        if not batches:
            return
        from opentelemetry.sdk.trace.export import SpanExportResult

        for batch, count in batches:
            for spec in self.broken:
                self.failed[spec] += count
            for spec, exporter in self.exporters:
                left = None if self.deadline is None else self.deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.cut_off[spec] += count
                    continue
                _limit_call(exporter, left)
                self.announce(spec, count)
                try:
                    ok = getattr(exporter, send)(batch) == SpanExportResult.SUCCESS
                except Exception as e:
                    print(f"resettrace export process: {spec!r} failed: {e}", file=sys.stderr)
                    ok = False
                del self.in_flight[spec]
                if ok:
                    self.exported[spec] += count
                else:
                    self.failed[spec] += count
                    if getattr(exporter, "timed_out", False):
                        self.timed_out[spec] += count
                self.status()

    def announce(self, spec: str, count: int) -> None:
        """Say that a call of ``count`` spans to ``spec`` is under way (a short line after
        the last status: if this process is killed during the call, its spans were sent
        and not acknowledged)."""
        self.in_flight[spec] = count
        self.unsent += json.dumps({"in_flight": self.in_flight}).encode() + b"\n"
        self.write_status()

    def status(self, final: bool = False) -> None:
        # the file each file exporter writes ({pid}/{rank} filled in, or the name beside
        # the path when another process holds it or it is not a span file of that format),
        # and why a file exporter could not open its file (resettrace.outputs' rules)
        files = [(spec, exporter) for spec, exporter in self.exporters
                 if isinstance(getattr(exporter, "path", None), os.PathLike)]
        paths = {spec: str(exporter.path) for spec, exporter in files
                 if getattr(exporter, "opened", True)}
        errors = {spec: exporter.error for spec, exporter in files
                  if getattr(exporter, "error", None)}
        line = json.dumps({"received": self.received, "exported": self.exported,
                           "failed": self.failed, "timed_out": self.timed_out,
                           "cut_off": self.cut_off, "in_flight": self.in_flight,
                           "broken": self.broken, "paths": paths, "errors": errors,
                           "cpu_s": time.process_time(),
                           "setup_cpu_s": self.setup_cpu_s,
                           "flush": self.flushed, "final": final})
        # Never block on stdout: a training process that reads it seldom must not stop the
        # export (a full status pipe used to stall this loop, and then the training
        # process dropped every trace). Each status holds every count, so an unsent one is
        # replaced by the newer; only a line already begun is finished first.
        rest = self.unsent[:self.unsent.index(b"\n") + 1] if self.partial else b""
        self.unsent = rest + line.encode() + b"\n"
        self.write_status(final)

    def write_status(self, final: bool = False) -> None:
        """Write what the status pipe takes of the unsent status now (all of it, waiting,
        when ``final``); the rest is written when the pipe has room again (:meth:`run`
        waits for that too: a flush acknowledged into a full pipe must still arrive)."""
        fd = sys.stdout.fileno()
        try:
            os.set_blocking(fd, final)  # the last status waits: the training process reads it
            while self.unsent:
                n = os.write(fd, self.unsent)
                if n:
                    self.partial = self.unsent[n - 1] != ord("\n")  # stopped inside a line
                    self.unsent = self.unsent[n:]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # the training process is gone
            self.unsent = b""
            self.partial = False

    def parse(self) -> None:
        buf = self.buf
        pos = 0
        view = memoryview(buf)
        while len(buf) - pos >= FRAME.size:
            size, kind = FRAME.unpack_from(buf, pos)
            end = pos + FRAME.size + size
            if end > len(buf):
                break
            try:
                self.handle(kind, view[pos + FRAME.size:end])
            except Exception as e:  # one bad frame must not end the export of the rest
                print(f"resettrace export process: bad frame {chr(kind)!r}: {e!r}",
                      file=sys.stderr)
            pos = end
        view.release()
        try:
            del buf[:pos]
        except BufferError:  # a slice outlived its frame (a traceback a library kept holds
            self.buf = buf[pos:]  # its frame): the rest goes on in a new buffer
        try:
            self.encode_run()
        except Exception as e:
            print(f"resettrace export process: cannot encode traces: {e!r}", file=sys.stderr)

    def run(self) -> None:
        fd = sys.stdin.fileno()
        eof = False
        while not (eof or self.stop):
            wait = None  # nothing waits to be exported: sleep until the pipe has data
            if self.batch_since:
                wait = max(0.0, self.batch_since + self.batch_delay - time.monotonic())
            out = [sys.stdout.fileno()] if self.unsent else []  # a status waits for room
            try:
                ready, room, _ = select.select([fd, self.wake_r], out, [], wait)
            except InterruptedError:
                ready, room = [], []
            if room:
                self.write_status()
            if fd in ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    eof = True
                self.buf += chunk
                before = self.received
                self.parse()
                if self.received > before and self.waiting:  # (a flush may have sent them)
                    self.arrivals.append((time.monotonic(), self.received))
            if self.stop:
                break
            if self.batch_since and time.monotonic() - self.batch_since >= self.batch_delay:
                self.export()  # the oldest waiting span's delay is up: everything goes
            elif self.waiting >= self.batch_size:
                self.export(full_only=True)
        if self.deadline is None:  # the pipe closed, or SIGTERM, with no word of a deadline
            self.leave(self.shutdown_timeout)
        self.export()
        for _, exporter in self.exporters:
            with contextlib.suppress(Exception):
                exporter.shutdown()
        self.status(final=True)

    def watch_parent(self) -> None:
        """Leave when the training process is gone (killed, say, with no word to this
        one): export what is here, then exit, finished or not, within the shutdown timeout
        of its death. The timeout counts from the last check that found it alive, not from
        the check that found it gone: this process may have been starting, or starved of
        the CPU on a busy machine (it runs at a lower priority), for a while in between.
        Runs on a daemon thread."""
        while True:
            seen = time.monotonic()
            if os.getppid() != self.parent_pid:
                break
            self.alive_at = seen
            time.sleep(_WATCH_S)
        end = self.alive_at + max(0.0, self.shutdown_timeout - _EXIT_MARGIN_S)
        self.leave_by(end - min(_EXIT_MARGIN_S, 0.25 * self.shutdown_timeout))
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"w")  # the main loop may be waiting on the pipe
        time.sleep(max(0.0, end - time.monotonic()))
        os._exit(0)  # an export call past its deadline: nobody is left to report to


def _limit_call(exporter: Any, left: float | None) -> None:
    """Let the next export call of an OTLP exporter take at most ``left`` seconds (its
    retries included), and at most its own timeout."""
    if left is None:
        return
    own = getattr(exporter, "_resettrace_timeout", None)
    for holder in (exporter, getattr(exporter, "_client", None)):
        if holder is not None and isinstance(getattr(holder, "_timeout", None), (int, float)):
            if own is None:
                own = exporter._resettrace_timeout = float(holder._timeout)
            holder._timeout = max(1e-3, min(own, left))


#: the export process's nice value: below training, so it never takes a busy core's time
#: beyond about a tenth (CFS weight 110 against 1024), yet always gets the ~1% of a core it
#: needs (at idle priority it got nothing while training kept both cores busy, and the
#: pipe and queue overflowed)
EXPORT_NICE = 10


def _lower_priority() -> None:
    """Export runs below training, and keeps up with it on saturated cores."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0),
                                               EXPORT_NICE))


def main() -> None:
    """Entry point of the export child process."""
    _lower_priority()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = _Child()

    def _stop(*_: object) -> None:
        child.leave(child.shutdown_timeout)

    signal.signal(signal.SIGTERM, _stop)
    threading.Thread(target=child.watch_parent, daemon=True, name="watch-parent").start()
    child.run()


if __name__ == "__main__":
    main()
