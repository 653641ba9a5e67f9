"""The training process's end of span export: :class:`ProcessExporter`, a recorder sink
that packs each finished trace into int64 frames for the export process
(:mod:`resettrace.tracing.export.child`), over a non-blocking pipe
(:mod:`resettrace.tracing.export.protocol`).

Building an SDK span costs tens of microseconds and OTLP encoding about as much, all
under the GIL: here a trace costs a ``struct`` pack. Nothing blocks the training thread:
bytes the pipe cannot take wait in a bounded buffer, and a trace that does not fit is
dropped and counted. When the collector is slow or down the export process stops
reading, the pipe fills, and traces are dropped and counted the same way. The export
process reports what each exporter delivered on its stdout; :meth:`ProcessExporter.report`
turns that into delivered / undelivered counts. It runs in its own session (Ctrl-C and
SIGTERM to the training job's process group do not reach it) and leaves when its stdin
closes: a training process that dies cannot leave it behind.

Span files are opened and locked here, when the sink is set up, before any span is
written (:func:`resettrace.outputs.open_output`), held until :meth:`ProcessExporter.close`,
and handed to the export process, which only writes them: a second process given the same
path while this session lives writes ``NAME.pPID.SUFFIX`` beside it and says so at once, in
one line of its own log, never truncating or interleaving this session's spans.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from itertools import chain
from typing import Any

from resettrace._run import helper_environment
from resettrace.catalog import (
    ATTR_PARENT_PID,
    ATTR_WORKER_RANK,
    CATALOG,
    Catalog,
    attribute_value,
    text_problem,
)
from resettrace.tracing import lifecycle
from resettrace.tracing.export.protocol import (
    FRAME,
    TRACE_HEAD,
    Kind,
    frame,
    trace_packer,
)
from resettrace.tracing.layout import R_END, RECORD_FIELDS
from resettrace.tracing.recorder import (
    ERROR_NAMES,
    Record,
    Recorder,
    Trace,
    TraceQueue,
    note_once,
    watch_attributes,
)

log = logging.getLogger(__name__)

__all__ = ["ProcessExporter"]


_PIPE_BYTES = 1 << 20  # ask the kernel for a 1 MiB pipe
_F_SETPIPE_SZ = 1031
#: the training process writes to the pipe once this much is queued, or this long after
#: its last write: few, large writes wake the export process seldom (each wake-up costs
#: it far more than the spans it then encodes)
_WRITE_BYTES = 256 << 10
_WRITE_DELAY_S = 1.0
#: of a close's time, what the export process leaves itself to report its last status
_REPORT_MARGIN_S = 0.2
#: traces held before they are packed into frames, in one go (see ``on_trace``)
_HOLD_TRACES = 32
_now = time.monotonic
_get_ident = threading.get_ident
#: a recorder's trace goes on the wire as its own int64 block (the wire is little-endian)
_AS_IS = sys.byteorder == "little"
_MAX_NS = 1 << 62



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
        #: the thread inside a call that holds the lock (0: none), and the traces that a
        #: signal handler of that thread closed meanwhile (see :meth:`on_trace`)
        self._holder = 0
        self._reentered: deque[tuple[list[Record], Recorder]] = deque()
        self.reentered_traces = 0
        #: where the compiled recorder puts this sink's traces of one recorder, with no
        #: call, until it holds _HOLD_TRACES - 1 or _WRITE_DELAY_S passed since the last
        #: write (see on_trace); taken before the recorder's attributes change
        self.trace_queue = TraceQueue()
        self.trace_queue.keyed = True
        watch_attributes(self)
        self._proc: subprocess.Popen[bytes] | None = None
        #: per span file exporter: the file this session holds (opened and locked at set-up)
        self._files: dict[str, tuple[str, Any]] = {}
        self._closed = False
        self._dead = False
        self._forked = False
        self._reset_counters()
        lifecycle.track(self)
        self._start()

    def _release_files(self) -> None:
        """Close this process's span files (the lock goes with the last descriptor)."""
        files, self._files = self._files, {}
        for _, f in files.values():
            _close_stream(f)

    @property
    def pid(self) -> int | None:
        """The export child's process id (``None`` before it starts or after a fork)."""
        return None if self._proc is None or self._forked else self._proc.pid

    def _reset_counters(self) -> None:
        q = self.trace_queue
        q.clear()  # (in place: the recorders hold it)
        q.limit = _HOLD_TRACES - 1
        q.deadline = 0  # the first trace is handed over by a call (it starts the process)
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
            from resettrace.launcher import parent_pid, process_rank

            self._settings["resource"] = dict(
                self._settings["resource"],
                **{ATTR_WORKER_RANK: process_rank(), ATTR_PARENT_PID: parent_pid()})
        from resettrace.config import sdk_environment

        # the SDK in the child reads OTEL_* itself: a malformed one (said here, once) is left
        # out, so that it uses its default and still makes the exporter
        env = sdk_environment(helper_environment())
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("RUST_LOG", "error")
        self._files = _claim_files(self._settings)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "resettrace.tracing.export.child", str(os.getpid()),
                 repr(time.monotonic())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
                start_new_session=True, pass_fds=[f.fileno() for _, f in self._files.values()])
        except BaseException:
            self._release_files()
            raise
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._in = self._proc.stdin.fileno()
        self._out_fd = self._proc.stdout.fileno()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._in, _F_SETPIPE_SZ, _PIPE_BYTES)
        os.set_blocking(self._in, False)
        os.set_blocking(self._out_fd, False)
        settings = dict(self._settings, parent_pid=os.getpid(), files={
            spec: [path, f.fileno()] for spec, (path, f) in self._files.items()})
        self._frame(frame(Kind.SETTINGS, rest=json.dumps(settings).encode()), 0)
        self._pump()

    def _after_fork_in_child(self) -> None:
        """A forked worker starts its own child process on its first trace."""
        proc = self._proc
        self._proc = None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                _close_stream(stream)
            proc.stdin = proc.stdout = None
            proc.returncode = 0  # not this process's child: never wait for it
        self._in = self._out_fd = -1  # the parent's fd numbers: never ours to write
        # the parent's span files: closing this process's copies leaves the parent's lock
        # held (an flock lives while any descriptor of the open file does); this process
        # opens its own when it starts its export process
        self._release_files()
        self._forked = True
        self._lock = threading.Lock()
        self._holder = 0
        self._reentered = deque()
        self._dead = False
        self._reset_counters()

    # -- hot path -----------------------------------------------------------------------------
    @lifecycle.uncut
    def on_trace(self, records: list[Record], recorder: Recorder) -> None:
        """Hold the traces queued and this one; pack the held ones into frames every
        :data:`_HOLD_TRACES`, and write them out every :data:`_WRITE_DELAY_S`.

        A call right after the engine step costs ~20 us (nothing it touches is in the cache
        any more): the compiled recorder queues a trace in :attr:`trace_queue` instead
        while the queue holds fewer than ``_HOLD_TRACES - 1`` traces, all of one recorder,
        and ``_WRITE_DELAY_S`` has not passed since the last write; then it calls this,
        which takes them all in one go (~1 us each, a recorder's trace going on the wire
        as its own int64 block). Held and queued traces are counted as pending, and packed
        before anything that must follow them (flush, close, another recorder or changed
        attributes).

        A trace closed by a signal handler that interrupted this thread inside a call that
        holds the lock (this one, a flush, a report) would wait for that lock for ever: it
        is queued without it instead, and the interrupted call takes it on its way out
        (counted in :attr:`reentered_traces`).
        """
        me = _get_ident()
        if self._holder == me:
            self._reentered.append((records, recorder))
            self.reentered_traces += 1
            return
        with self._lock:
            # no call between taking the lock and saying who holds it, nor between saying
            # it no longer does and letting it go: no signal handler runs in between
            self._holder = me
            try:
                self._take_queue()
                self._hold(records, recorder)
                while self._reentered:
                    self._hold(*self._reentered.popleft())
                self._write_due(records)
            finally:
                self._holder = 0

    def _take_queue(self) -> None:
        """Hold the traces the compiled recorder queued (caller holds the lock)."""
        if len(self.trace_queue):
            recorder, traces = self.trace_queue.take()
            self._hold(traces, recorder, many=True)

    def attributes_changing(self, attributes: dict[str, Any]) -> None:
        """A recorder's attributes are about to change: the traces queued are held first,
        with the attributes they closed with (:func:`~resettrace.tracing.recorder.
        watch_attributes`)."""
        if not len(self.trace_queue):
            return
        if self._holder == _get_ident():  # a signal handler inside a call holding the lock
            recorder, traces = self.trace_queue.take()
            self._reentered.extend((t, recorder) for t in traces)
            return
        with self._locked():
            self._take_queue()

    def _hold(self, records: Any, recorder: Recorder, *, many: bool = False) -> None:
        """:meth:`on_trace`'s work: hold a trace (``many``: a list of traces) of
        ``recorder`` (caller holds the lock)."""
        traces = records if many else (records,)
        if self._proc is None or self._dead or self._closed:
            if self._proc is None and not self._closed:
                self._start()  # first trace after a fork: this process's own child
            else:
                self.dropped_spans += sum(map(len, traces))
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
        self._held.extend(traces)
        self._held_spans += sum(map(len, traces))

    def _write_due(self, records: Any) -> None:
        """Pack the held traces when :data:`_HOLD_TRACES` are, and write them when enough
        bytes or time have passed since the last write; then say by when the compiled
        recorder hands a trace over by a call again (``records``: the trace at hand, its
        end taken as now: no clock read)."""
        if len(self._held) >= _HOLD_TRACES or _now() - self._last_write >= _WRITE_DELAY_S:
            self._pack_held()
            if (len(self._buf) >= _WRITE_BYTES or len(self._frames) >= self._max_traces
                    or _now() - self._last_write >= _WRITE_DELAY_S):
                self._pump()  # one write (a syscall and a wake-up of the child) per batch
        q = self.trace_queue
        q.limit = 0 if self._dead or self._closed else _HOLD_TRACES - 1
        try:
            end = int(records[0][R_END])
        except (IndexError, TypeError, ValueError):
            q.deadline = 0
            return
        left = self._last_write + _WRITE_DELAY_S - _now()
        q.deadline = min(_MAX_NS, end + max(0, int(min(left, 1e9) * 1e9)))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The lock, with this thread noted as its holder (see :meth:`on_trace`), and the
        traces queued or closed by a signal handler meanwhile taken on the way in."""
        me = _get_ident()
        with self._lock:
            self._holder = me
            try:
                self._take_queue()
                self._take_reentered()
                yield
            finally:
                self._holder = 0

    def _take_reentered(self) -> None:
        while self._reentered:
            self._hold(*self._reentered.popleft())

    def _pack_held(self) -> None:
        """Turn the held traces into frames (caller holds the lock)."""
        held = self._held
        if not held:
            return
        self._held = []
        if self._errors_sent < len(ERROR_NAMES):
            self._send_error_names()
        if self._phases_sent < len(self._catalog):
            self._send_phases()
        rid = self._held_rid
        frames = self._frames
        buf = self._buf
        fields = RECORD_FIELDS
        head = TRACE_HEAD
        for records in held:
            n = len(records)
            self._held_spans -= n
            if len(frames) >= self._max_traces:
                self._pump()  # full: make room if the pipe takes some
            if len(frames) >= self._max_traces or self._dead:
                self.dropped_spans += n
                continue
            if type(records) is Trace and _AS_IS:  # a recorder's: its int64s as they are
                size = head.size + 8 * fields * n
                buf += head.pack(size - FRAME.size, Kind.TRACE, rid, n, self.dropped_spans)
                buf += records.data  # type: ignore[attr-defined]
                frames.append((size, n))
                self.sent_spans += n
                continue
            packer = trace_packer(n, fields)
            try:
                buf += packer.pack(packer.size - FRAME.size, Kind.TRACE, rid, n,
                                   self.dropped_spans, *chain.from_iterable(records))
            except (struct.error, TypeError, ValueError, OverflowError):
                # a field that is not an int64 (a record written by hand): this trace
                # alone is dropped, never the others packed with it
                note_once("unpackable", "a trace held a record field that is not an int64 "
                          "(%s); the trace was dropped", _bad_field(records))
                self.dropped_spans += n
                continue
            frames.append((packer.size, n))
            self.sent_spans += n

    def _register(self, recorder: Recorder, rid: int | None = None) -> int:
        """Send the recorder's attributes (again, under ``rid``, when they changed).

        They were checked where they were given; one set on ``recorder.attributes`` later
        that OpenTelemetry cannot carry is left out here (logged once), so the recorder is
        registered whatever its attributes hold and its spans are exported."""
        attrs = json.dumps(_carried(recorder.attributes)).encode()
        if rid is None:
            rid = self._next_rid
            self._next_rid += 1
            self._rids[id(recorder)] = rid
            self._sent_attrs[rid] = dict(recorder.attributes)
            weakref.finalize(recorder, self._forget, id(recorder), rid)
        else:
            self._sent_attrs[rid] = dict(recorder.attributes)
        self._frame(frame(Kind.REGISTER, rid, recorder.epoch_offset_ns, rest=attrs), 0,
                    force=True)
        return rid

    def _forget(self, key: int, rid: int) -> None:
        """A registered recorder was collected (runs wherever the GC does: no lock)."""
        if self._rids.get(key) == rid:
            del self._rids[key]
            self._sent_attrs.pop(rid, None)
            if self._held_key == key:
                self._held_key = 0  # a later recorder at this address is not this one

    def _send_error_names(self) -> None:
        while self._errors_sent < len(ERROR_NAMES):
            code = self._errors_sent
            self._frame(frame(Kind.ERROR, code, rest=ERROR_NAMES[code].encode()), 0,
                        force=True)
            self._errors_sent += 1

    def _send_phases(self) -> None:
        catalog = self._catalog
        while self._phases_sent < len(catalog):
            i = self._phases_sent
            self._frame(frame(Kind.PHASE, i, rest=catalog[i].span.encode()), 0, force=True)
            self._phases_sent += 1

    def _frame(self, data: bytes, spans: int, *, force: bool = False) -> bool:
        """Queue one frame (:func:`~resettrace.tracing.export.protocol.frame`); False
        (nothing queued) when ``max_traces`` wait already."""
        if not force and len(self._frames) >= self._max_traces:
            return False
        self._buf += data
        self._frames.append((len(data), spans))
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
            self.trace_queue.limit = 0
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
        """Spans recorded and not yet written to the export process, nor dropped."""
        with self._locked():
            return self._pending()

    def _pending(self) -> int:
        return (sum(s for _, s in self._frames) + self._held_spans
                + sum(len(records) for records, _ in list(self._reentered)))

    @lifecycle.uncut
    def report(self) -> dict[str, Any]:
        """Spans sent, dropped, and per exporter what became of them.

        Per exporter: ``delivered`` (acknowledged, or written whole), ``failed`` (sent and
        refused or lost, or an exporter that could not be created; ``timed_out`` of them
        were sent and never answered in time: the receiver may hold them), ``cut_off``
        (never sent: the shutdown deadline came first, or the export process died), and
        ``undelivered`` = spans recorded - delivered. Once the session is closed,
        ``delivered + failed + cut_off`` = ``spans_sent``, and ``undelivered`` =
        ``failed + cut_off + spans_dropped``."""
        with self._locked():
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
                   "spans_pending": self._pending(), "spans_received": received,
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

    @lifecycle.uncut
    def flush(self, timeout_s: float) -> bool:
        """Hand every queued trace to the child and wait until it exported them."""
        deadline = time.monotonic() + timeout_s
        with self._locked():
            if self._proc is None or self._dead or self._closed:
                return not self._frames
            self._pack_held()
            self._flush_seq += 1
            seq = self._flush_seq
            self._frame(frame(Kind.FLUSH, seq), 0, force=True)
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

    @lifecycle.uncut
    def close(self, timeout_s: float) -> None:
        """Deliver what is queued within ``timeout_s``, then stop the child (killed if late)."""
        deadline = time.monotonic() + timeout_s
        with self._locked():
            if self._closed:
                return
            self._closed = True
            self.trace_queue.limit = 0  # every later trace is counted by on_trace: dropped
            proc = self._proc
            if proc is None:
                return
            if not self._dead:
                self._pack_held()
                # the export process is told how long it has, less a margin to report its
                # last status in: what it cannot send by then it counts as cut off
                left = deadline - time.monotonic()
                margin = min(_REPORT_MARGIN_S, 0.25 * max(0.0, left))
                self._frame(frame(Kind.QUIT, max(0.0, left - margin)), 0, force=True)
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
            _close_stream(proc.stdin)  # EOF: the child exports what it has and leaves
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
            # what a signal handler closed meanwhile came too late to be sent
            while self._reentered:
                self.dropped_spans += len(self._reentered.popleft()[0])
            _close_stream(proc.stdout)
            self._out_fd = -1
            self._release_files()  # the export process is gone: the paths are free again
            if proc.stdin is not None:
                proc.stdin = None
            if proc.stdout is not None:
                proc.stdout = None


def _bad_field(records: list[Record]) -> str:
    """Where a trace holds its first field that is not an int64, in words."""
    for r in records:
        for i, v in enumerate(r):
            if type(v) is not int or not -(1 << 63) <= v < 1 << 63:
                return f"field {i} is a {type(v).__name__}"
    return "a record of another length"


def _carried(attributes: dict[str, Any]) -> dict[str, Any]:
    """The attributes OpenTelemetry can carry (:func:`attribute_value`), the rest left out."""
    out: dict[str, Any] = {}
    for key, value in list(attributes.items()):
        try:
            if text_problem(key) is None:
                out[key] = attribute_value(key, value)
                continue
            problem = f"span attribute key {key!r} {text_problem(key)}"
        except (TypeError, ValueError) as e:
            problem = str(e)
        note_once(f"attribute:{problem}", "%s; left out of the exported spans", problem)
    return out


def _claim_files(settings: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Open and lock every span file of ``settings``' exporters now, by the rules of
    :mod:`resettrace.outputs` (one line logged when another process holds a path: this
    session writes ``NAME.pPID.SUFFIX`` beside it): per spec, the path opened and its file.
    A path that cannot be opened is left to the export process, which reports why."""
    from resettrace import outputs

    rank = int(settings.get("resource", {}).get(ATTR_WORKER_RANK, 0))
    files: dict[str, tuple[str, Any]] = {}
    for spec in settings.get("exporters", []):
        kind, _, arg = spec.partition(":")
        if kind not in outputs.SPAN_KINDS or not arg:
            continue
        path = outputs.expand_path(arg, pid=os.getpid(), rank=rank)
        try:
            opened, f = outputs.open_output(path, outputs.SPAN_KINDS[kind], lock=True)
        except OSError as e:
            log.debug("resettrace: %s is left to the export process: %s", path, e)
            continue
        files[spec] = (str(opened), f)
    return files


def _close_stream(stream: Any) -> None:
    """Close a pipe through the file object that owns its fd, never with ``os.close`` on
    the number: the object would close the number again when it is collected (at any
    later allocation, on any thread), by then maybe someone else's fd (a new pipe of
    ``subprocess.Popen`` failed with EBADF that way)."""
    if stream is not None:
        with contextlib.suppress(OSError, ValueError):  # (its raw fd is closed even so)
            stream.close()
