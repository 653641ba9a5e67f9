"""Turn recorder traces into real OpenTelemetry spans, off the training thread.

:meth:`SpanMaterializer.on_trace` (the recorder's sink in ``trace`` mode) only
appends the finished trace to a bounded queue; a daemon thread builds the SDK
spans with the records' exact timestamps and parent links and ends them, which
hands them to the provider's span processors and exporters. A full queue drops
the trace and counts its spans (:attr:`dropped_spans`): the hot path never waits.

Every span carries the recorder's attributes (backend, task, env count) and, in
the subtree of a reset, the number of envs it reset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from resettrace.catalog import CATALOG, INSTRUMENTATION_SCOPE, Catalog
from resettrace.tracing import lifecycle
from resettrace.tracing.recorder import Record, error_name
from resettrace.tracing.spans import build_spans

if TYPE_CHECKING:
    from resettrace.tracing.recorder import Recorder

log = logging.getLogger(__name__)

__all__ = ["SpanMaterializer"]


class SpanMaterializer:
    """Builds SDK spans from recorder traces on a background thread."""

    def __init__(self, tracer_provider: trace.TracerProvider, *, queue_size: int = 4096,
                 catalog: Catalog = CATALOG) -> None:
        self._catalog = catalog
        self._tracer = tracer_provider.get_tracer(INSTRUMENTATION_SCOPE)
        self._queue: deque[tuple[Sequence[Record], dict[str, Any], int]] = deque()
        self._queue_size = queue_size
        self._cv = threading.Condition()
        self._busy = False
        self._closed = False
        self.dropped_spans = 0
        self.materialised_spans = 0
        self._start_thread()
        lifecycle.track(self)

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name="resettrace-materialise",
                                        daemon=True)
        self._thread.start()

    def _after_fork_in_child(self) -> None:
        """The parent's queue and thread stay behind: start empty, with a new thread."""
        self._queue.clear()
        self._cv = threading.Condition()
        self._busy = False
        self.dropped_spans = self.materialised_spans = 0
        if not self._closed:
            self._start_thread()

    # -- hot path ---------------------------------------------------------------------------
    def on_trace(self, records: Sequence[Record], recorder: Recorder) -> None:
        if self._closed or len(self._queue) >= self._queue_size:
            self.dropped_spans += len(records)
            return
        self._queue.append((records, recorder.attributes, recorder.epoch_offset_ns))
        if not self._busy:
            with self._cv:
                self._cv.notify()

    # -- worker -----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._busy = False
                    self._cv.wait(0.5)
                if not self._queue and self._closed:
                    self._busy = False
                    self._cv.notify_all()
                    return
                self._busy = True
            while self._queue:
                records, attrs, offset = self._queue.popleft()
                try:
                    self._materialise(records, attrs, offset)
                except Exception:  # never let one bad trace stop the exporter thread
                    log.exception("resettrace: failed to build spans for one trace")
                    self.dropped_spans += len(records)
                # hand the GIL back between traces: a training thread returning from an
                # engine call must not wait a whole switch interval for it
                time.sleep(0)
            with self._cv:
                self._cv.notify_all()

    def _materialise(self, records: Sequence[Record], attrs: dict[str, Any], offset: int) -> None:
        catalog = self._catalog
        build_spans(self._tracer, records, attrs, offset, error_name,
                    lambda i: catalog[i].span)
        self.materialised_spans += len(records)

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def pending_spans(self) -> int:
        return sum(len(t[0]) for t in list(self._queue))

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued trace is built; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._cv.notify()
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return not self._queue and not self._busy
                self._cv.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Build what is queued (within ``timeout_s``), then stop; later traces are dropped."""
        self.flush(timeout_s)
        with self._cv:
            self._closed = True
            self.dropped_spans += self.pending_spans
            self._queue.clear()
            self._cv.notify_all()
        self._thread.join(timeout=max(0.0, min(timeout_s, 1.0)))
