"""Span exporters that write files for trace viewers: Chrome trace JSON, OTLP-JSON and
Jaeger UI JSON (JSON lines are in :mod:`resettrace.tracing.export.exporters`).

Every file exporter takes SDK spans (``export``) and whole traces given as records
(``export_traces``: the export process's path, see
:mod:`resettrace.tracing.export.records`), and writes the same bytes for both. Each format
has both encoders by design: SDK spans come from any tracer provider (a user's own spans
included), records from resettrace's export process, where a trace's shape is encoded once
and every trace of that shape fills it in: 4.9-5.7 us a span in the export process against
40-44 us from SDK spans (``bench export``, perfetto and jaeger-json, 64 envs). The
differential tests hold the two to the same bytes, the SDK's as the reference. They share
one contract (:class:`FileExporter`):

* The file (and its parent folders) is created, emptied, on the first ``export()``; that
  first call writes at once, so an unwritable path is reported by the first export. The
  path opens by the rules of :mod:`resettrace.outputs`: a symbolic link or anything but a
  regular file there is refused (the spans count as not delivered and ``error`` says why),
  a file that is not a span file of the exporter's format is left as it is and the spans go
  to ``NAME.1.SUFFIX`` beside it, and a file another process writes to ``NAME.pPID.SUFFIX``;
  ``path`` is then the file written. The export process is instead handed the file the
  training process opened and locked when its session was set up (:meth:`adopt`): the
  path is then held for the session's whole life, before any span is written.
* Every ``export()`` call is written at once: its spans count as delivered only when on
  disk (the export process hands them over in batches, and an SDK span processor in
  front of the exporter may batch them too).
* Every write rewrites the file's tail from the end of the last good write (seek, write,
  truncate, flush), so the file is complete and valid after every write, flush and
  shutdown, and a failed write (disk full) cannot leave garbage before the next good one.
  Only a process killed in the middle of a write can leave a torn tail.
* An ``OSError`` is logged (the first at ERROR, then DEBUG) and ``export()`` returns
  ``FAILURE``; the spans of that write are dropped and
  counted in ``dropped_spans``. ``exported_spans`` counts spans written to the file.
  Nothing here raises ``OSError`` to the caller.

:class:`ChromeTraceSpanExporter` (``perfetto:PATH``)
    The Chrome trace event JSON object format, which Perfetto (ui.perfetto.dev) and
    chrome://tracing load::

        {"displayTimeUnit":"ms","otherData":{...,"time_origin_unix_ns":"..."},"traceEvents":[
        {"ph":"M","name":"process_name","pid":P,"tid":0,"args":{"name":"resettrace SVC"}},
        {"ph":"M","name":"thread_name","pid":P,"tid":N,"args":{"name":"trace N TRACE_ID"}},
        {"ph":"X","name":...,"cat":...,"ts":...,"dur":...,"pid":P,"tid":N,"args":{...}}
        ]}

    One complete (``"X"``) event per span. ``ts`` and ``dur`` are microseconds (floats);
    ``ts`` counts from ``otherData.time_origin_unix_ns`` (Unix epoch ns, a string): the
    ``time_origin_ns`` argument, else the earlier of the exporter's creation and the earliest
    start in the first write. Relative, small numbers keep nanosecond precision in a double
    (absolute epoch microseconds would be rounded to 0.25 us, enough to break the nesting of
    a child that ends with its parent); a span that started before the origin gets a negative
    ``ts``. ``cat`` is the span name up to its first dot (the phase group). ``pid`` is the
    resource's ``process.pid`` (else this process). ``tid`` is a small counter given to each
    trace in arrival order, so the nested spans of a trace stack on one track named
    ``trace N TRACE_ID`` (the trace's id in hex, as Jaeger shows it); the map is bounded
    (``max_tracks``, oldest forgotten first). ``args`` holds the span attributes and
    ``status`` when set, and no span id: a viewer that names a frame by its name and args
    (speedscope) merges the calls of a phase (a step's physics substeps) into one frame,
    where unique ids made each call a frame of its own. The events are appended in place,
    between a fixed header
    and the closing ``]}``, so a run of a million spans (about 300 MB) is written in
    O(spans) time with bounded memory; loading that in the browser is Perfetto's limit, not
    this exporter's.

:class:`OtlpJsonSpanExporter` (``otlp-json:PATH``)
    OTLP-JSON as JSON Lines, the layout of the OpenTelemetry file exporter specification
    (``protocol/file-exporter``): each line is one ``ExportTraceServiceRequest``
    (``{"resourceSpans":[...]}``) holding the spans of one write, encoded by the SDK's own
    OTLP protobuf encoder and protobuf's JSON mapping, with the OTLP/JSON exceptions applied:
    ``traceId``, ``spanId`` and ``parentSpanId`` (and link ids) are lowercase hex, not
    base64; enums (``kind``, ``status.code``) are integers; 64-bit integers
    (``startTimeUnixNano``, ``intValue``) are strings. Jaeger's UI "Upload JSON" reads
    this file only with a Jaeger server behind the UI: jaeger-ui's ``readJsonFile`` parses
    the whole file as one JSON value or, failing that, line by line, merging the
    ``resourceSpans`` of every line into one request (jaeger-ui PR #2380, fixing issue
    #2225, 2024), then posts it to the server's ``/api/transform`` to convert it; with no
    server the upload fails (``jaeger-json:PATH`` is the file the UI opens on its own).
    Older Jaeger UIs (1.5x) accept a single document only; for them, merge the lines with
    ``jq -cs '{resourceSpans: map(.resourceSpans[])}' FILE``. The collector's
    ``otlpjsonfile`` receiver reads the file as is. A single document rewritten at every
    flush was not chosen: it costs O(all spans) per write.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.resources import PROCESS_PID, SERVICE_NAME
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

from resettrace import outputs
from resettrace.catalog import ATTR_RESET_COUNT
from resettrace.tracing.export.records import Slot, TextTemplates, Traces
from resettrace.tracing.layout import R_END, R_ERROR, R_PARENT, R_PHASE, R_START

log = logging.getLogger(__name__)

__all__ = [
    "ChromeTraceSpanExporter",
    "JaegerJsonSpanExporter",
    "OtlpJsonSpanExporter",
    "otlp_json_ids_to_hex",
]

#: Traces whose Chrome track number is remembered (oldest forgotten first).
DEFAULT_MAX_TRACKS = 65536

_PRODUCER = "resettrace"
_UNKNOWN_SERVICE = "unknown_service"


def write_all(f: IO[bytes], data: bytes) -> None:
    """Write every byte (an unbuffered file may take fewer per call), or raise."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:
            raise OSError(f"no byte written to {getattr(f, 'name', f)}")
        view = view[n:]


class FileExporter(SpanExporter):
    """Appends spans to one file in robust, complete writes.

    Subclasses set ``kind`` (their format, :mod:`resettrace.outputs`), implement
    :meth:`_encode` (the bytes appended for some spans, and the state to commit once they
    are on disk) and may implement :meth:`_header` and :meth:`_suffix`. All methods are
    thread-safe; ``export`` blocks only for the writes it triggers.
    """

    #: the output kind: which existing file at the path is this format's, to replace
    kind: outputs.OutputKind

    def __init__(self, path: str | os.PathLike[str], *, pid: int | None = None) -> None:
        self.path = Path(path)
        self._pid = pid
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._end = 0  # bytes of complete content; the suffix starts here
        self._closed = False
        self._failures = 0
        self.exported_spans = 0
        self.dropped_spans = 0
        #: True once the file is open: ``path`` is then the file written
        self.opened = False
        #: why the file could not be opened (the last attempt), else None
        self.error: str | None = None
        #: a file opened (and locked) for this exporter elsewhere, written from the first
        #: export on (:meth:`adopt`)
        self._adopted: IO[bytes] | None = None

    def adopt(self, path: str | os.PathLike[str], f: IO[bytes]) -> None:
        """Write ``f``, already opened empty (and locked) for ``path`` by the rules of
        :mod:`resettrace.outputs`: the training process opens its span files when its
        session is set up, so that the lock is held from before the first span to the
        session's end; the export process only writes them."""
        with self._lock:
            self.path = Path(path)
            self._adopted = f
            self.opened, self.error = True, None

    # -- format hooks ---------------------------------------------------------------------------
    def _header(self, first_start: int | None) -> bytes:
        """Bytes at the start of the file; ``first_start``: the earliest span start of the
        first write (Unix ns; None: no span)."""
        return b""

    def _suffix(self) -> bytes:
        """Bytes that close the file after the last complete write."""
        return b""

    def _encode(self, spans: Sequence[ReadableSpan]) -> tuple[bytes, Callable[[], None]]:
        """The bytes to append for ``spans`` and a commit callback run once they are written."""
        raise NotImplementedError

    def _encode_traces(self, batch: Sequence[Traces]) -> tuple[bytes, Callable[[], None]]:
        """As :meth:`_encode`, for whole traces given as records (the export process)."""
        raise NotImplementedError

    def _first_start(self, batch: Sequence[Traces]) -> int | None:
        starts = [int(t.records[:, R_START].min()) for t in batch if len(t.records)]
        return min(starts) if starts else None

    # -- SpanExporter ---------------------------------------------------------------------------
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        with self._lock:
            ok = self._write(
                len(spans),
                lambda: min((s.start_time for s in spans if s.start_time is not None),
                            default=None),
                (lambda: self._encode(spans)) if spans else None)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def export_traces(self, batch: Sequence[Traces]) -> SpanExportResult:
        """Write whole traces given as records (:mod:`~resettrace.tracing.export.records`):
        the export process's path, with no SDK span."""
        if self._closed:
            return SpanExportResult.FAILURE
        with self._lock:
            ok = self._write(sum(t.spans for t in batch), lambda: self._first_start(batch),
                             lambda: self._encode_traces(batch))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every export is written at once

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._file is None and self._adopted is not None:
                self._write(0, lambda: None, None)  # nothing exported: the header alone
            if self._file is None:
                self._file, self._adopted = self._adopted, None
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as e:
                    log.error("resettrace: cannot close %s: %s", self.path, e)
                self._file = None
        if self.dropped_spans:
            log.warning("resettrace: %d spans could not be written to %s", self.dropped_spans,
                        self.path)

    # -- writing (lock held) --------------------------------------------------------------------
    def _write(self, n: int, first_start: Callable[[], int | None],
               encode: Callable[[], tuple[bytes, Callable[[], None]]] | None) -> bool:
        """Open the file if it is not (its header: ``first_start`` is the earliest start
        of this first write), then append what ``encode`` gives for ``n`` spans."""
        try:
            if self._file is None and self._adopted is not None:
                self._end = 0  # (a failed header is tried again, on the same file)
                self._append(self._adopted, self._header(first_start()))
                self._file, self._adopted = self._adopted, None
            if self._file is None:
                try:
                    self.path, f = outputs.open_output(self.path, self.kind, lock=True,
                                                       pid=self._pid)
                except OSError as e:
                    self.error = str(e)
                    raise
                self.opened, self.error = True, None
                try:
                    self._end = 0
                    self._append(f, self._header(first_start()))
                except OSError:
                    f.close()
                    raise
                self._file = f
            if encode is not None:
                data, commit = encode()
                self._append(self._file, data)
                commit()
        except OSError as e:
            self.dropped_spans += n
            self._failures += 1
            level = logging.ERROR if self._failures == 1 else logging.DEBUG
            if isinstance(e, outputs.OutputRefused):  # its message names the path and why
                log.log(level, "resettrace: %s (%d spans not written)", e, n)
            else:
                log.log(level, "resettrace: cannot write %d spans to %s: %s", n,
                        self.path, e)
            return False
        self.exported_spans += n
        return True

    def _append(self, f: IO[bytes], data: bytes) -> None:
        # Rewrite from the end of the last good write: the file is complete after each call,
        # and the bytes of a failed write (a full disk) are truncated away at once.
        f.seek(self._end)
        try:
            write_all(f, data + self._suffix())
        except OSError:
            with contextlib.suppress(OSError):
                f.truncate(self._end)
                f.seek(self._end)
                write_all(f, self._suffix())
            raise
        f.truncate()
        self._end += len(data)


# --- Chrome trace JSON ---------------------------------------------------------------------------

def _hex_trace(trace_id: int) -> str:
    return format(trace_id, "032x")


def _hex_span(span_id: int) -> str:
    return format(span_id, "016x")


def _json_value(value: Any) -> Any:
    """An attribute value JSON can hold: non-finite floats become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    return value


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str).encode()


class ChromeTraceSpanExporter(FileExporter):
    """Writes spans as Chrome trace events, loadable in Perfetto (see the module docstring)."""

    kind = outputs.PERFETTO
    _SUFFIX = b"\n]}\n"

    def __init__(self, path: str | os.PathLike[str], *, time_origin_ns: int | None = None,
                 max_tracks: int = DEFAULT_MAX_TRACKS, pid: int | None = None) -> None:
        super().__init__(path, pid=pid)
        if max_tracks < 1:
            raise ValueError(f"max_tracks must be >= 1, got {max_tracks}")
        self.max_tracks = max_tracks
        self._created_ns = time.time_ns()
        self._fixed_origin = time_origin_ns
        self.time_origin_ns: int | None = None  # set by the first write
        self._events = 0  # events in the file
        self._tids: dict[tuple[int, int], int] = {}  # (pid, trace_id) -> tid, insertion order
        self._next_tid = 1
        self._named_pids: set[int] = set()
        self._templates = TextTemplates(_perfetto_trace)

    def _header(self, first_start: int | None) -> bytes:
        if self._fixed_origin is not None:
            origin = self._fixed_origin
        else:
            origin = self._created_ns if first_start is None else min(self._created_ns,
                                                                      first_start)
        self.time_origin_ns = origin
        other = {"producer": _PRODUCER, "time_origin_unix_ns": str(origin),
                 "ts_unit": "microseconds since time_origin_unix_ns"}
        self._events = 0
        head = _dumps({"displayTimeUnit": "ms", "otherData": other})
        return head[:-1] + b',"traceEvents":['

    def _suffix(self) -> bytes:
        return self._SUFFIX

    def _encode(self, spans: Sequence[ReadableSpan]) -> tuple[bytes, Callable[[], None]]:
        assert self.time_origin_ns is not None
        origin = self.time_origin_ns
        new_tids: dict[tuple[int, int], int] = {}
        new_pids: set[int] = set()
        next_tid = self._next_tid
        events: list[bytes] = []
        for span in spans:
            pid, service = _process_of(span)
            if pid not in self._named_pids and pid not in new_pids:
                new_pids.add(pid)
                events.append(_dumps({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                      "args": {"name": f"{_PRODUCER} {service}"}}))
            ctx = span.get_span_context()
            trace_id = ctx.trace_id if ctx is not None else 0
            key = (pid, trace_id)
            tid = self._tids.get(key) or new_tids.get(key)
            if tid is None:
                tid = new_tids[key] = next_tid
                next_tid += 1
                events.append(_dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                      "args": {"name": f"trace {tid} {_hex_trace(trace_id)}"}}))
            start = span.start_time or 0
            end = span.end_time if span.end_time is not None else start
            args = {k: _json_value(v) for k, v in (span.attributes or {}).items()}
            if span.status.status_code is not StatusCode.UNSET:
                args["status"] = span.status.status_code.name
            events.append(_dumps({"ph": "X", "name": span.name,
                                  "cat": span.name.partition(".")[0] or _PRODUCER,
                                  "ts": (start - origin) / 1000, "dur": (end - start) / 1000,
                                  "pid": pid, "tid": tid, "args": args}))
        sep = b",\n" if self._events else b"\n"
        data = sep + b",\n".join(events)

        def commit() -> None:
            self._events += len(events)
            self._named_pids |= new_pids
            self._tids.update(new_tids)
            self._next_tid = next_tid
            while len(self._tids) > self.max_tracks:
                del self._tids[next(iter(self._tids))]

        return data, commit


    def _encode_traces(self, batch: Sequence[Traces]) -> tuple[bytes, Callable[[], None]]:
        assert self.time_origin_ns is not None
        origin = self.time_origin_ns
        events: list[str] = []
        new_pids: set[int] = set()
        tids = [self._next_tid]  # each trace is a new track

        def extra(values: dict[str, Any], rows: list[list[int]]) -> None:
            tid = tids[0]
            tids[0] = tid + 1
            values["tid"] = tid
            values["tn"] = f"trace {tid} {values['t']}"
            for i, r in enumerate(rows):
                values[f"T{i}"] = (r[R_START] - origin) / 1000
                values[f"U{i}"] = (r[R_END] - r[R_START]) / 1000

        templates = self._templates
        for traces in batch:
            pid, service = _process_of_resource(traces.source.resource)
            if pid not in self._named_pids and pid not in new_pids:
                new_pids.add(pid)
                events.append(_dumps({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                      "args": {"name": f"{_PRODUCER} {service}"}}).decode())
            for _, _, text in templates.traces([traces], extra):
                events.append(text)
        sep = ",\n" if self._events else "\n"
        data = (sep + ",\n".join(events)).encode()
        added = len(events)
        next_tid = tids[0]

        def commit() -> None:
            self._events += added
            self._named_pids |= new_pids
            self._next_tid = next_tid

        return data, commit


def _perfetto_trace(traces: Traces, rows: list[list[int]], counts: list[int],
                    slot: Slot) -> str:
    """A trace's events in Chrome trace JSON: its track's name, then one per span."""
    src = traces.source
    pid, _ = _process_of_resource(src.resource)
    out = [_dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": slot.number("tid"),
                   "args": {"name": slot.text("tn")}})]
    for i in reversed(range(len(rows))):  # in the order SDK spans end: children first
        r = rows[i]
        name = src.span_name(r[R_PHASE])
        args = {k: _json_value(v) for k, v in record_span_attributes(traces, r, counts[i],
                                                               slot.number(f"c{i}")).items()}
        if r[R_ERROR]:
            args["status"] = StatusCode.ERROR.name
        out.append(_dumps({"ph": "X", "name": name, "cat": name.partition(".")[0] or _PRODUCER,
                           "ts": slot.number(f"T{i}"), "dur": slot.number(f"U{i}"),
                           "pid": pid, "tid": slot.number("tid"), "args": args}))
    return b",\n".join(out).decode()


def record_span_attributes(traces: Traces, row: list[int], count: int, count_value: Any
                     ) -> dict[str, Any]:
    """A span's attributes as :func:`~resettrace.tracing.spans.build_spans` sets
    them: the recorder's, its reset count (``count_value`` when it has one), and on a
    root the trace's root attributes."""
    attrs = dict(traces.attrs)
    if count >= 0:
        attrs[ATTR_RESET_COUNT] = count_value
    if row[R_PARENT] < 0 and traces.root_attrs:
        attrs.update(traces.root_attrs)
    return attrs


def _process_of_resource(attrs: Any) -> tuple[int, str]:
    pid: Any = attrs.get(PROCESS_PID)
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        pid = os.getpid()
    return pid, str(attrs.get(SERVICE_NAME, _UNKNOWN_SERVICE))


def _process_of(span: ReadableSpan) -> tuple[int, str]:
    """The span's process id (resource ``process.pid``, else ours) and service name."""
    return _process_of_resource(span.resource.attributes if span.resource is not None else {})


# --- OTLP-JSON -----------------------------------------------------------------------------------

def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def otlp_json_ids_to_hex(request: dict[str, Any]) -> dict[str, Any]:
    """Rewrite, in place, the base64 ids of a ``MessageToDict`` trace request as OTLP hex."""
    for rs in request.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                for obj in (span, *span.get("links", ())):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in obj:
                            obj[key] = _b64_to_hex(obj[key])
    return request


class OtlpJsonSpanExporter(FileExporter):
    """Writes spans as OTLP-JSON lines, loadable in Jaeger's UI (see the module docstring)."""

    kind = outputs.OTLP_JSON

    def __init__(self, path: str | os.PathLike[str], *, pid: int | None = None) -> None:
        super().__init__(path, pid=pid)
        # The OTLP encoder pulls in protobuf: loaded only when this exporter is used.
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        self._to_dict = MessageToDict
        self._encode_spans = encode_spans

        self._templates = TextTemplates(self._trace_template)
        #: per span source: the request's text before and after its spans
        self._frame: tuple[int, bytes, bytes] | None = None

    def _request(self, spans: Sequence[ReadableSpan]) -> dict[str, Any]:
        return self._to_dict(self._encode_spans(spans), use_integers_for_enums=True)

    def _encode(self, spans: Sequence[ReadableSpan]) -> tuple[bytes, Callable[[], None]]:
        line = _dumps(otlp_json_ids_to_hex(self._request(spans))) + b"\n"
        return line, nothing_to_commit

    def _encode_traces(self, batch: Sequence[Traces]) -> tuple[bytes, Callable[[], None]]:
        texts = [text for _, _, text in self._templates.traces(batch)]
        if not texts:
            return b"", nothing_to_commit
        source = batch[0].source
        if self._frame is None or self._frame[0] != id(source):
            self._frame = (id(source), *self._around_spans(batch[0]))
        _, head, tail = self._frame
        return head + ",".join(texts).encode() + tail, nothing_to_commit

    def _sample(self, traces: Traces, rows: list[list[int]]) -> list[ReadableSpan]:
        """SDK spans of one trace of ``traces`` (``rows``), built as the export process
        builds them: what the format's own encoder renders a shape from."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

        from resettrace.catalog import INSTRUMENTATION_SCOPE
        from resettrace.tracing.spans import build_spans

        ended: list[ReadableSpan] = []

        class _Keep(SpanProcessor):
            def on_end(self, span: ReadableSpan) -> None:
                ended.append(span)

        provider = TracerProvider(resource=Resource(dict(traces.source.resource)))
        provider.add_span_processor(_Keep())
        build_spans(provider.get_tracer(INSTRUMENTATION_SCOPE), rows, traces.attrs, 0,
                    traces.source.error_name, traces.source.span_name, traces.root_attrs)
        return ended

    def _around_spans(self, traces: Traces) -> tuple[bytes, bytes]:
        rows = traces.records[:traces.starts[1]].tolist()
        request = self._request(self._sample(traces, rows))
        mark = "rt-spans-" + os.urandom(6).hex()
        request["resourceSpans"][0]["scopeSpans"][0]["spans"] = [mark]
        head, _, tail = _dumps(request).partition(f'"{mark}"'.encode())
        return head, tail + b"\n"

    def _trace_template(self, traces: Traces, rows: list[list[int]], counts: list[int],
                        slot: Slot) -> str:
        """A trace's spans as the SDK encoder renders them, with slots for its values."""
        request = self._request(self._sample(traces, rows))
        spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
        for span, i in zip(spans, reversed(range(len(rows))), strict=True):  # children first
            span["traceId"] = slot.text("t")
            span["spanId"] = slot.text(f"s{i}")
            if rows[i][R_PARENT] >= 0:
                span["parentSpanId"] = slot.text(f"s{rows[i][R_PARENT]}")
            span["startTimeUnixNano"] = slot.text(f"b{i}")
            span["endTimeUnixNano"] = slot.text(f"e{i}")
            for kv in span.get("attributes", ()):
                if kv["key"] == ATTR_RESET_COUNT:
                    kv["value"] = {"intValue": slot.text(f"c{i}")}
        return ",".join(_dumps(span).decode() for span in spans)


def nothing_to_commit() -> None:
    """The commit step of a write that changes no exporter state."""
    return None


# --- Jaeger UI JSON ------------------------------------------------------------------------------

def _jaeger_tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        if not math.isfinite(value):  # JSON has no NaN or infinity: written as text
            return {"key": key, "type": "string", "value": str(value)}
        return {"key": key, "type": "float64", "value": value}
    return {"key": key, "type": "string", "value": str(_json_value(value))}


class JaegerJsonSpanExporter(FileExporter):
    """Writes Jaeger UI JSON: ``{"data": [{traceID, spans, processes}, ...]}``.

    Jaeger's UI loads such a file with its JSON upload and converts it in the browser, so
    it opens with no Jaeger server (an ``otlp-json`` file is sent to a running Jaeger's
    ``/api/transform`` instead). Times are microseconds (Jaeger's unit: spans under 1 us
    show as 0us). Each export call adds one entry per trace; the export process hands
    over whole traces.
    """

    kind = outputs.JAEGER_JSON
    _SUFFIX = b"\n]}\n"

    def __init__(self, path: str | os.PathLike[str], *, pid: int | None = None) -> None:
        super().__init__(path, pid=pid)
        self._entries = 0
        self._templates = TextTemplates(_jaeger_trace)

    def _header(self, first_start: int | None) -> bytes:
        self._entries = 0
        return b'{"data":['

    def _suffix(self) -> bytes:
        return self._SUFFIX

    def _encode(self, spans: Sequence[ReadableSpan]) -> tuple[bytes, Callable[[], None]]:
        traces: dict[int, list[ReadableSpan]] = {}
        for span in spans:
            ctx = span.get_span_context()
            traces.setdefault(ctx.trace_id if ctx is not None else 0, []).append(span)
        entries = []
        for trace_id, members in traces.items():
            tid = _hex_trace(trace_id)
            processes: dict[str, dict[str, Any]] = {}
            by_resource: dict[int, str] = {}
            out = []
            for span in members:
                key = id(span.resource)
                pid = by_resource.get(key)
                if pid is None:
                    pid = by_resource[key] = f"p{len(by_resource) + 1}"
                    attrs = span.resource.attributes if span.resource is not None else {}
                    processes[pid] = {
                        "serviceName": str(attrs.get(SERVICE_NAME, _UNKNOWN_SERVICE)),
                        "tags": [_jaeger_tag(k, v) for k, v in attrs.items()
                                 if k != SERVICE_NAME]}
                ctx = span.get_span_context()
                start = span.start_time or 0
                end = span.end_time if span.end_time is not None else start
                tags = [_jaeger_tag(k, v) for k, v in (span.attributes or {}).items()]
                if span.status.status_code is StatusCode.ERROR:
                    tags.append(_jaeger_tag("error", True))
                    if span.status.description:
                        tags.append(_jaeger_tag("otel.status_description",
                                                span.status.description))
                refs = [] if span.parent is None else [
                    {"refType": "CHILD_OF", "traceID": tid,
                     "spanID": _hex_span(span.parent.span_id)}]
                out.append({"traceID": tid,
                            "spanID": _hex_span(ctx.span_id) if ctx is not None else "",
                            "operationName": span.name, "references": refs,
                            # both ends floored to the microsecond (a duration floored
                            # on its own let a child end 1 us after its parent)
                            "startTime": start // 1000,
                            "duration": end // 1000 - start // 1000,
                            "tags": tags, "logs": [], "processID": pid, "warnings": None})
            entries.append(_dumps({"traceID": tid, "spans": out, "processes": processes}))
        sep = b",\n" if self._entries else b"\n"
        data = sep + b",\n".join(entries)
        added = len(entries)

        def commit() -> None:
            self._entries += added

        return data, commit

    def _encode_traces(self, batch: Sequence[Traces]) -> tuple[bytes, Callable[[], None]]:
        entries = [text for _, _, text in self._templates.traces(batch, _jaeger_times)]
        sep = ",\n" if self._entries else "\n"
        data = (sep + ",\n".join(entries)).encode()
        added = len(entries)

        def commit() -> None:
            self._entries += added

        return data, commit


def _jaeger_times(values: dict[str, Any], rows: list[list[int]]) -> None:
    for i, r in enumerate(rows):
        values[f"B{i}"] = r[R_START] // 1000
        values[f"D{i}"] = r[R_END] // 1000 - r[R_START] // 1000  # (both ends floored)


_COUNT = object()  # where a span's reset count goes


def _jaeger_trace(traces: Traces, rows: list[list[int]], counts: list[int], slot: Slot) -> str:
    """A trace's entry in Jaeger UI JSON (one process: the training process)."""
    src = traces.source
    attrs = src.resource
    processes = {"p1": {"serviceName": str(attrs.get(SERVICE_NAME, _UNKNOWN_SERVICE)),
                        "tags": [_jaeger_tag(k, v) for k, v in attrs.items()
                                 if k != SERVICE_NAME]}}
    out = []
    for i in reversed(range(len(rows))):  # in the order SDK spans end: children first
        r = rows[i]
        tags = [{"key": k, "type": "int64", "value": slot.number(f"c{i}")} if v is _COUNT
                else _jaeger_tag(k, v)
                for k, v in record_span_attributes(traces, r, counts[i], _COUNT).items()]
        if r[R_ERROR]:
            tags.append(_jaeger_tag("error", True))
            description = src.error_name(r[R_ERROR])
            if description:
                tags.append(_jaeger_tag("otel.status_description", description))
        refs = [] if r[R_PARENT] < 0 else [
            {"refType": "CHILD_OF", "traceID": slot.text("t"),
             "spanID": slot.text(f"s{r[R_PARENT]}")}]
        out.append({"traceID": slot.text("t"), "spanID": slot.text(f"s{i}"),
                    "operationName": src.span_name(r[R_PHASE]), "references": refs,
                    "startTime": slot.number(f"B{i}"), "duration": slot.number(f"D{i}"),
                    "tags": tags, "logs": [], "processID": "p1", "warnings": None})
    return _dumps({"traceID": slot.text("t"), "spans": out, "processes": processes}).decode()
