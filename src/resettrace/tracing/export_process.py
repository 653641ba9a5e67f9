"""Span export in a child process: the training process only packs ints into a pipe.

Building an SDK span costs tens of microseconds and OTLP encoding about as much,
all under the GIL. :class:`ProcessExporter` (the recorder sink, in the training
process) instead packs each finished trace into one ``struct`` of int64 and writes it
to a non-blocking pipe; a child process (``python -m
resettrace.tracing.export_process``) turns the records into spans with their exact
timestamps and parent links and hands them to the configured exporters in batches,
with no SDK span built: OTLP requests encoded straight from the records
(:mod:`resettrace.tracing.otlp_wire`), and the file formats written from them
(:mod:`resettrace.tracing.record_spans`), every exporter the same batches with the same
ids. ``Config.span_encoder = "sdk"`` builds SDK spans instead (the reference).

Nothing here blocks the training thread: bytes the pipe cannot take wait in a
bounded buffer, and a trace that does not fit is dropped and counted. When the
collector is slow or down the child stops reading, the pipe fills, and traces are
dropped and counted the same way. The child reports what each exporter delivered
on its stdout; :meth:`ProcessExporter.report` turns that into delivered /
undelivered counts. The child runs in its own session (Ctrl-C and SIGTERM to the
training job's process group do not reach it) and leaves when its stdin closes:
a training process that dies cannot leave it behind.

Wire format, child's stdin: frames of ``<I`` payload length, one type byte, payload.
``C`` JSON settings; ``R`` recorder registration (``<Iq`` id, epoch offset + JSON
attributes); ``E`` error name (``<I`` code + UTF-8); ``P`` phase (``<I`` catalog index +
UTF-8 span name: phases reach the child by name, so one registered after the session
started exports like a built-in one); ``T`` trace (``<IIq`` recorder
id, record count, spans dropped so far + ``6 * count`` int64); ``F`` flush
(``<I`` sequence number); ``Q`` quit. Child's stdout: one JSON status per line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from itertools import chain
from typing import Any

import numpy as np

from resettrace._run import helper_environment
from resettrace.catalog import (
    ATTR_EXPORT_DROPPED,
    ATTR_PARENT_PID,
    ATTR_WORKER_RANK,
    CATALOG,
    Catalog,
)
from resettrace.tracing.recorder import _ERROR_NAMES, RECORD_FIELDS, Record, Recorder, error_name

log = logging.getLogger(__name__)

__all__ = ["ProcessExporter", "main"]


_FRAME = struct.Struct("<IB")
_REGISTER = struct.Struct("<Iq")
_ERROR = struct.Struct("<I")
_TRACE = struct.Struct("<IIq")
_FLUSH = struct.Struct("<I")
_QUIT = struct.Struct("<d")  # seconds left to finish, from the moment the frame is read
_PIPE_BYTES = 1 << 20  # ask the kernel for a 1 MiB pipe
_F_SETPIPE_SZ = 1031
#: spans per export call in the child, and the longest a span waits for its batch (ms;
#: ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` and ``OTEL_BSP_SCHEDULE_DELAY`` set them)
_BATCH_SPANS = 512
_BATCH_DELAY_MS = 1000
#: the training process writes to the pipe once this much is queued, or this long after
#: its last write: few, large writes wake the child seldom (each wake-up costs it far more
#: than the spans it then encodes)
_WRITE_BYTES = 256 << 10
_WRITE_DELAY_S = 1.0
#: how often the export process checks that the training process is alive (s)
_WATCH_S = 0.1
#: of a close's time, what the export process leaves itself to report its last status
_REPORT_MARGIN_S = 0.2
#: traces held before they are packed into frames, in one go (see ``on_trace``)
_HOLD_TRACES = 32
_now = time.monotonic
#: struct per record count: frame header, trace header and every record field in one call
_PACKERS: dict[int, struct.Struct] = {}
_KIND_TRACE = ord("T")
#: exporters the export process writes from the records (no SDK span built)
_RECORD_KINDS = frozenset({"file", "perfetto", "otlp-json", "jaeger-json", "otlp"})

_LIVE: weakref.WeakSet[ProcessExporter] = weakref.WeakSet()


class ProcessExporter:
    """Recorder sink that streams traces to an exporter child process.

    ``settings`` is the JSON-able description the child builds its exporters from
    (``RESETTRACE_EXPORTER`` items other than ``memory``); at most ``max_traces``
    traces wait in this process for the pipe, beyond that they are dropped.
    """

    def __init__(self, settings: dict[str, Any], *, max_traces: int = 4096,
                 catalog: Catalog = CATALOG) -> None:
        self._settings = settings
        self._catalog = catalog
        self._max_traces = max_traces
        self._lock = threading.Lock()  # traces may end on several training threads
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._dead = False
        self._forked = False
        self._reset_counters()
        _LIVE.add(self)
        self._start()

    @property
    def pid(self) -> int | None:
        """The export child's process id (``None`` before it starts or after a fork)."""
        return None if self._proc is None or self._forked else self._proc.pid

    def _reset_counters(self) -> None:
        self._buf = bytearray()
        self._frames: deque[tuple[int, int]] = deque()  # (frame bytes, spans) not yet written
        self._head_written = 0  # bytes of the first frame already in the pipe
        # id(recorder) -> its id on the wire, while the recorder lives (a finalizer forgets
        # it, so a later recorder with the same id() gets a new one and nothing is kept)
        self._rids: dict[int, int] = {}
        self._next_rid = 0
        self._sent_attrs: dict[int, dict[str, Any]] = {}
        self._errors_sent = 1
        self._phases_sent = 0
        self._flush_seq = 0
        self._status: dict[str, Any] = {}
        self._out = b""
        self._last_write = 0.0
        #: traces not packed yet, all of one recorder (its id(), wire id, attributes)
        self._held: list[list[Record]] = []
        self._held_spans = 0
        self._held_key = 0
        self._held_rid = -1
        self._held_attrs: dict[str, Any] = {}
        self.sent_spans = 0
        self.dropped_spans = 0

    # -- child process ----------------------------------------------------------------------
    def _start(self) -> None:
        if self._forked:  # a forked worker: its rank is found now, when it first exports
            from resettrace.config import process_rank
            from resettrace.tracing.session import parent_pid

            self._settings["resource"] = dict(
                self._settings["resource"],
                **{ATTR_WORKER_RANK: process_rank(), ATTR_PARENT_PID: parent_pid()})
        env = helper_environment()
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("RUST_LOG", "error")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "resettrace.tracing.export_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
            start_new_session=True)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._in = self._proc.stdin.fileno()
        self._out_fd = self._proc.stdout.fileno()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._in, _F_SETPIPE_SZ, _PIPE_BYTES)
        os.set_blocking(self._in, False)
        os.set_blocking(self._out_fd, False)
        settings = dict(self._settings, parent_pid=os.getpid())
        self._frame(b"C", json.dumps(settings).encode(), 0)
        self._pump()

    def _after_fork_in_child(self) -> None:
        """A forked worker starts its own child process on its first trace."""
        proc = self._proc
        self._proc = None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        os.close(stream.fileno())
            proc.stdin = proc.stdout = None
            proc.returncode = 0  # not this process's child: never wait for it
        self._in = self._out_fd = -1  # the parent's fd numbers: never ours to write
        self._forked = True
        self._lock = threading.Lock()
        self._dead = False
        self._reset_counters()

    # -- hot path -----------------------------------------------------------------------------
    def on_trace(self, records: list[Record], recorder: Recorder) -> None:
        """Hold the trace; pack the held ones into frames every :data:`_HOLD_TRACES`.

        Packing one trace right after the engine step costs ~25 us (nothing it touches is in
        the cache any more); packing 32 in one go costs ~2 us each. Held traces are counted
        as pending, and packed before anything that must follow them (flush, close, another
        recorder or changed attributes).
        """
        with self._lock:
            if self._proc is None or self._dead or self._closed:
                if self._proc is None and not self._closed:
                    self._start()  # first trace after a fork: this process's own child
                else:
                    self.dropped_spans += len(records)
                    return
            if id(recorder) != self._held_key or recorder.attributes != self._held_attrs:
                self._pack_held()  # what is held goes out with the attributes it closed with
                rid = self._rids.get(id(recorder))
                if rid is None:
                    rid = self._register(recorder)
                elif recorder.attributes != self._sent_attrs.get(rid):
                    self._register(recorder, rid)  # attributes set after its first trace
                self._held_key, self._held_rid = id(recorder), rid
                self._held_attrs = self._sent_attrs[rid]
            self._held.append(records)
            self._held_spans += len(records)
            if len(self._held) >= _HOLD_TRACES or _now() - self._last_write >= _WRITE_DELAY_S:
                self._pack_held()
                if (len(self._buf) >= _WRITE_BYTES or len(self._frames) >= self._max_traces
                        or _now() - self._last_write >= _WRITE_DELAY_S):
                    self._pump()  # one write (a syscall and a wake-up of the child) per batch

    def _pack_held(self) -> None:
        """Turn the held traces into frames (caller holds the lock)."""
        held = self._held
        if not held:
            return
        self._held = []
        if self._errors_sent < len(_ERROR_NAMES):
            self._send_error_names()
        if self._phases_sent < len(self._catalog):
            self._send_phases()
        rid = self._held_rid
        frames = self._frames
        buf = self._buf
        packers = _PACKERS
        fields = RECORD_FIELDS
        for records in held:
            n = len(records)
            self._held_spans -= n
            if len(frames) >= self._max_traces:
                self._pump()  # full: make room if the pipe takes some
            if len(frames) >= self._max_traces or self._dead:
                self.dropped_spans += n
                continue
            packer = packers.get(n)
            if packer is None:
                packer = packers[n] = struct.Struct(f"<IBIIq{n * fields}q")
            buf += packer.pack(packer.size - _FRAME.size, _KIND_TRACE, rid, n,
                               self.dropped_spans, *chain.from_iterable(records))
            frames.append((packer.size, n))
            self.sent_spans += n

    def _register(self, recorder: Recorder, rid: int | None = None) -> int:
        """Send the recorder's attributes (again, under ``rid``, when they changed)."""
        if rid is None:
            rid = self._next_rid
            self._next_rid += 1
            self._rids[id(recorder)] = rid
            self._sent_attrs[rid] = dict(recorder.attributes)
            weakref.finalize(recorder, self._forget, id(recorder), rid)
        else:
            self._sent_attrs[rid] = dict(recorder.attributes)
        attrs = json.dumps(recorder.attributes).encode()
        self._frame(b"R", _REGISTER.pack(rid, recorder.epoch_offset_ns) + attrs, 0, force=True)
        return rid

    def _forget(self, key: int, rid: int) -> None:
        """A registered recorder was collected (runs wherever the GC does: no lock)."""
        if self._rids.get(key) == rid:
            del self._rids[key]
            self._sent_attrs.pop(rid, None)
            if self._held_key == key:
                self._held_key = 0  # a later recorder at this address is not this one

    def _send_error_names(self) -> None:
        while self._errors_sent < len(_ERROR_NAMES):
            code = self._errors_sent
            self._frame(b"E", _ERROR.pack(code) + _ERROR_NAMES[code].encode(), 0, force=True)
            self._errors_sent += 1

    def _send_phases(self) -> None:
        catalog = self._catalog
        while self._phases_sent < len(catalog):
            i = self._phases_sent
            self._frame(b"P", _ERROR.pack(i) + catalog[i].span.encode(), 0, force=True)
            self._phases_sent += 1

    def _frame(self, kind: bytes, payload: bytes, spans: int, *, force: bool = False) -> bool:
        """Queue one frame; False (nothing queued) when ``max_traces`` wait already."""
        size = _FRAME.size + len(payload)
        if not force and len(self._frames) >= self._max_traces:
            return False
        self._buf += _FRAME.pack(len(payload), kind[0])
        self._buf += payload
        self._frames.append((size, spans))
        return True

    def _pump(self) -> None:
        """Write what the pipe takes now, never waiting."""
        if not self._buf or self._dead or self._in < 0:
            return
        try:
            k = os.write(self._in, self._buf)
        except BlockingIOError:
            return
        except OSError:  # the child is gone: nothing queued can reach it any more
            self._dead = True
            self.dropped_spans += sum(s for _, s in self._frames)
            self.sent_spans -= sum(s for _, s in self._frames)
            self._buf.clear()
            self._frames.clear()
            log.error("resettrace: the span export process died; spans are dropped from now on")
            return
        self._last_write = _now()
        self._read_status()  # drain the child's status lines as they come (never blocks)
        del self._buf[:k]
        k += self._head_written
        frames = self._frames
        while frames and frames[0][0] <= k:
            k -= frames.popleft()[0]
        self._head_written = k

    # -- status ---------------------------------------------------------------------------------
    def _read_status(self) -> None:
        if self._proc is None or self._out_fd < 0:
            return
        try:
            while True:
                chunk = os.read(self._out_fd, 1 << 16)
                if not chunk:
                    break
                self._out += chunk
        except (BlockingIOError, OSError):
            pass
        *lines, self._out = self._out.split(b"\n")
        # each status holds every count: the last one says all; a call announced after it
        # (a line of its own, before the call) is under way
        in_flight = None
        for line in reversed(lines):
            try:
                status = json.loads(line)
            except ValueError:
                continue
            if "received" not in status:
                in_flight = status["in_flight"] if in_flight is None else in_flight
                continue
            self._status = status
            break
        if in_flight is not None:
            self._status = dict(self._status, in_flight=in_flight)

    @property
    def pending_spans(self) -> int:
        return sum(s for _, s in self._frames) + self._held_spans

    def report(self) -> dict[str, Any]:
        """Spans sent, dropped, and per exporter what became of them.

        Per exporter: ``delivered`` (acknowledged, or written whole), ``failed`` (sent and
        refused or lost, or an exporter that could not be created; ``timed_out`` of them
        were sent and never answered in time: the receiver may hold them), ``cut_off``
        (never sent: the shutdown deadline came first, or the export process died), and
        ``undelivered`` = spans recorded - delivered. Once the session is closed,
        ``delivered + failed + cut_off`` = ``spans_sent``, and ``undelivered`` =
        ``failed + cut_off + spans_dropped``."""
        with self._lock:
            self._pack_held()
            self._pump()
            self._read_status()
            status = self._status
            recorded = self.sent_spans + self.dropped_spans
            # a batch under way when the export process ended without its last word was
            # sent and not acknowledged: failed, and timed out (the receiver may hold it)
            over = self._closed or self._dead or (self._proc is not None
                                                 and self._proc.poll() is not None)
            lost = status.get("in_flight", {}) if over and not status.get("final") else {}
            per: dict[str, dict[str, Any]] = {}
            for name in self._settings.get("exporters", []):
                delivered = int(status.get("exported", {}).get(name, 0))
                failed = int(status.get("failed", {}).get(name, 0)) + int(lost.get(name, 0))
                timed_out = int(status.get("timed_out", {}).get(name, 0)) + int(
                    lost.get(name, 0))
                cut_off = int(status.get("cut_off", {}).get(name, 0))
                if over:  # what the export process never sent: received or not
                    cut_off = self.sent_spans - delivered - failed
                per[name] = {"delivered": delivered, "failed": failed,
                             "timed_out": timed_out, "cut_off": cut_off,
                             "undelivered": recorded - delivered}
                reason = status.get("broken", {}).get(name)
                if reason:
                    per[name]["error"] = reason
            for name, path in status.get("paths", {}).items():
                if name in per:
                    per[name]["path"] = path  # the file it wrote
            for name, error in status.get("errors", {}).items():
                if name in per:
                    per[name]["error"] = error  # why it wrote no file
            received = int(status.get("received", 0))
            out = {"spans_sent": self.sent_spans, "spans_dropped": self.dropped_spans,
                   "spans_pending": self.pending_spans, "spans_received": received,
                   "exporters": per}
            if "cpu_s" in status:  # the export process's CPU time, start-up apart
                cpu = float(status["cpu_s"])
                setup = float(status.get("setup_cpu_s", 0.0))
                out["export_cpu_s"] = cpu
                out["export_setup_cpu_s"] = setup
                out["export_cpu_us_per_span"] = (
                    1e6 * (cpu - setup) / received if received else None)
            return out

    # -- lifecycle ------------------------------------------------------------------------------
    def _wait_writable(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        with contextlib.suppress(OSError, ValueError):
            select.select([], [self._in], [], min(left, 0.05))
        return True

    def flush(self, timeout_s: float) -> bool:
        """Hand every queued trace to the child and wait until it exported them."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if self._proc is None or self._dead or self._closed:
                return not self._frames
            self._pack_held()
            self._flush_seq += 1
            seq = self._flush_seq
            self._frame(b"F", _FLUSH.pack(seq), 0, force=True)
            while self._buf and not self._dead and self._wait_writable(deadline):
                self._pump()
            while True:  # until the child acknowledges: no wait once its status says so
                self._read_status()
                if int(self._status.get("flush", 0)) >= seq:
                    return True
                if self._proc.poll() is not None or time.monotonic() >= deadline:
                    return False
                with contextlib.suppress(OSError, ValueError):
                    select.select([self._out_fd], [], [], min(0.05, max(
                        0.0, deadline - time.monotonic())))

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued within ``timeout_s``, then stop the child (killed if late)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if self._closed:
                return
            self._closed = True
            proc = self._proc
            if proc is None:
                return
            if not self._dead:
                self._pack_held()
                # the export process is told how long it has, less a margin to report its
                # last status in: what it cannot send by then it counts as cut off
                left = deadline - time.monotonic()
                margin = min(_REPORT_MARGIN_S, 0.25 * max(0.0, left))
                self._frame(b"Q", _QUIT.pack(max(0.0, left - margin)), 0, force=True)
                while self._buf and not self._dead and self._wait_writable(deadline):
                    self._pump()
                unsent = sum(s for _, s in self._frames)
                self.sent_spans -= unsent
                self.dropped_spans += unsent
            self._buf.clear()  # counted as dropped: nothing may write them later
            self._frames.clear()
            self.dropped_spans += self._held_spans  # held when the child had died
            self._held = []
            self._held_spans = 0
            with contextlib.suppress(OSError):
                os.close(self._in)  # EOF: the child exports what it has and leaves
            self._in = -1  # the fd number may be reused by anything: never write to it again
            while proc.poll() is None and time.monotonic() < deadline:
                self._read_status()
                with contextlib.suppress(OSError, ValueError):
                    select.select([self._out_fd], [], [], 0.05)
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.5)
            self._read_status()
            with contextlib.suppress(OSError):
                os.close(self._out_fd)
            self._out_fd = -1
            if proc.stdin is not None:
                proc.stdin = None
            if proc.stdout is not None:
                proc.stdout = None


def _after_fork_in_child() -> None:
    for sink in list(_LIVE):
        sink._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


# ------------------------------------------------------------------------------------------
# child side
# ------------------------------------------------------------------------------------------
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
        #: ``time.monotonic()`` by which everything must be done (set when told to leave)
        self.deadline: float | None = None
        self.shutdown_timeout = 2.0
        self.parent_pid = os.getppid()
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
        from resettrace.tracing.exporters import make_exporter

        config = Config(**dict(settings["config"], exporters=tuple(settings["exporters"])))
        self.batch_size = config.export_batch_size
        self.batch_delay = config.export_delay_s
        self.shutdown_timeout = config.shutdown_timeout_s
        self.parent_pid = int(settings["parent_pid"])
        # the resource describes the training process, not this one
        resource = Resource.create(dict(settings["resource"],
                                        **{"process.pid": settings["parent_pid"]}))
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(self.collect)
        self.tracer = provider.get_tracer(INSTRUMENTATION_SCOPE)
        for spec in settings["exporters"]:
            self.exported[spec] = self.failed[spec] = self.timed_out[spec] = 0
            self.cut_off[spec] = 0
        if config.span_encoder != "sdk" and \
                settings["exporters"] and all(x == "otlp" for x in settings["exporters"]):
            from resettrace.tracing.otlp_wire import WireEncoder, make_wire_exporter

            try:
                wire = make_wire_exporter(config)
            except Exception as e:  # a setting the exporter refuses: said, and counted
                wire = None
                for spec in settings["exporters"]:
                    self.broken[spec] = f"cannot create {spec!r}: {e}"
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
                self.exporters.append((spec, exporter))
            except Exception as e:  # a bad exporter must not stop the others
                self.broken[spec] = f"cannot create {spec!r}: {e}"
        if records:  # no SDK span is built: every format is written from the records
            from resettrace.tracing.record_spans import SpanSource, TraceQueue

            self.queue = TraceQueue(SpanSource(dict(resource.attributes), self.span_name,
                                               self.error_name))
        for reason in self.broken.values():
            print(f"resettrace export process: {reason}", file=sys.stderr)

    def span_name(self, index: int) -> str:
        return self.phases.get(index) or f"resettrace.phase.{index}"

    def error_name(self, code: int) -> str:
        return self.errors.get(code, error_name(code))

    def _otlp_from_records(self, config: Any, resource: Any) -> Any:
        """The OTLP exporter, sending batches of record traces encoded with their ids;
        None when the installed SDK lacks what that needs."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        from resettrace.tracing.otlp_wire import WireEncoder, make_wire_exporter

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
        if kind == ord("T"):
            rid, n, dropped = _TRACE.unpack_from(payload)
            attrs, offset = self.recorders[rid]
            self.received += n
            data = payload[_TRACE.size:_TRACE.size + 8 * RECORD_FIELDS * n]
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
            from resettrace.tracing.materialise import build_spans

            phases = self.phases
            build_spans(self.tracer, records, attrs, offset,
                        lambda code: self.errors.get(code, error_name(code)),
                        lambda i: phases.get(i) or f"resettrace.phase.{i}",
                        {ATTR_EXPORT_DROPPED: dropped})
            return
        self.encode_run()  # a frame of another kind: the traces before it come first
        if kind == ord("R"):
            rid, offset = _REGISTER.unpack_from(payload)
            text = bytes(payload[_REGISTER.size:]).decode()
            self.recorders[rid] = (json.loads(text), offset)
            self.attr_keys[rid] = text
            if self.wire is not None:
                self.wire.set_attributes(rid, self.recorders[rid][0])
        elif kind == ord("P"):
            (index,) = _ERROR.unpack_from(payload)
            self.phases[index] = bytes(payload[_ERROR.size:]).decode()
        elif kind == ord("E"):
            (code,) = _ERROR.unpack_from(payload)
            self.errors[code] = bytes(payload[_ERROR.size:]).decode()
        elif kind == ord("F"):
            self.export()
            (self.flushed,) = _FLUSH.unpack_from(payload)
            for _, exporter in self.exporters:
                with contextlib.suppress(Exception):
                    exporter.force_flush()
            self.status()
        elif kind == ord("Q"):
            (left,) = _QUIT.unpack_from(payload) if len(payload) >= _QUIT.size else (
                self.shutdown_timeout,)
            self.leave(left)
        elif kind == ord("C"):
            self.setup(json.loads(bytes(payload)))
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
        deadline = time.monotonic() + max(0.0, within_s)
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
        while len(buf) - pos >= _FRAME.size:
            size, kind = _FRAME.unpack_from(buf, pos)
            end = pos + _FRAME.size + size
            if end > len(buf):
                break
            try:
                self.handle(kind, view[pos + _FRAME.size:end])
            except Exception as e:  # one bad frame must not end the export of the rest
                print(f"resettrace export process: bad frame {chr(kind)!r}: {e!r}",
                      file=sys.stderr)
            pos = end
        view.release()
        del buf[:pos]
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
        one): export what is here within the shutdown timeout, then exit, finished or
        not. Runs on a daemon thread; the training process's pid comes with the settings."""
        while True:
            time.sleep(_WATCH_S)
            if os.getppid() != self.parent_pid:
                break
        self.leave(self.shutdown_timeout)
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"w")  # the main loop may be waiting on the pipe
        deadline = self.deadline if self.deadline is not None else time.monotonic()
        time.sleep(max(0.0, deadline - time.monotonic()) + _WATCH_S)
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
