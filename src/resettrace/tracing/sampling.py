"""Which finished traces are exported: all, 1 in K, or the slowest reset_done per window.

:class:`TraceSampler` sits between the recorder and the span sinks; the timing
processor is not behind it, so statistics always see every trace. Traces left out
are counted (:attr:`TraceSampler.sampled_out_spans`), not dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from resettrace.catalog import RESET_DONE
from resettrace.tracing.layout import R_END, R_PHASE, R_START
from resettrace.tracing.recorder import Record, Recorder

__all__ = ["TraceSampler"]

_RESET_DONE = RESET_DONE.index


def reset_done_ns(records: Sequence[Record]) -> int:
    """Duration of the trace's reset_done, or -1 when it has none."""
    for r in records:
        if r[R_PHASE] == _RESET_DONE:
            return int(r[R_END] - r[R_START])
    return -1


class TraceSampler:
    """Forwards the sampled traces to ``sinks`` (each with ``on_trace``)."""

    def __init__(self, sinks: Sequence[Any], *, every: int = 1,
                 slowest_window: int | None = None) -> None:
        self.sinks = tuple(sinks)
        self.every = every
        self.window = slowest_window
        self.sampled_out_spans = 0
        self._seen = 0
        self._best: tuple[int, Sequence[Record], Recorder] | None = None
        self._window_spans = 0

    @property
    def keeps_all(self) -> bool:
        """Every trace goes on to the sinks (no sampling)."""
        return self.window is None and self.every <= 1

    def on_trace(self, records: Sequence[Record], recorder: Recorder) -> None:
        if self.window is not None:
            self._slowest(records, recorder)
            return
        self._seen += 1
        if self.every > 1 and self._seen % self.every != 1:
            self.sampled_out_spans += len(records)
            return
        for sink in self.sinks:
            sink.on_trace(records, recorder)

    def _slowest(self, records: Sequence[Record], recorder: Recorder) -> None:
        d = reset_done_ns(records)
        if d >= 0 and (self._best is None or d > self._best[0]):
            self._best = (d, records, recorder)
        self._seen += 1
        self._window_spans += len(records)
        if self._seen >= self.window:  # type: ignore[operator]
            self._emit()

    def _emit(self) -> None:
        best, self._best = self._best, None
        kept = 0
        if best is not None:
            kept = len(best[1])
            for sink in self.sinks:
                sink.on_trace(best[1], best[2])
        self.sampled_out_spans += self._window_spans - kept
        self._seen = self._window_spans = 0

    def close(self) -> None:
        """Export the slowest trace of an unfinished window."""
        if self.window is not None and self._seen:
            self._emit()
