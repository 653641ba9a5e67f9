"""Recorder traces as spans without SDK span objects: what the export process encodes.

The export process receives packed records. :class:`TraceQueue` keeps them as
:class:`Traces` (whole traces of one recorder: their records, with clocks turned into
Unix epoch ns, and the trace and span ids given to them on arrival) and cuts them into
batches of whole traces; every exporter of the process writes the same batch, so a span
has the same ids in every file and request.

The file formats are written from such batches by :class:`TextTemplates`: traces repeat a
few shapes (the same phases under the same parents, with the same errors and the same
spans carrying a reset count), so each format renders a shape once, with its own
function and placeholders where one trace's values go, and then fills that text for
every trace of the shape. The text is what the same format writes for SDK spans with
those ids and times (tests compare the two).
"""

from __future__ import annotations

import random
import re
import secrets
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from resettrace.tracing.layout import R_COUNT, R_END, R_ERROR, R_PARENT, R_PHASE, R_START

__all__ = ["SpanSource", "Traces", "TraceQueue", "TextTemplates", "Slot"]

_U64 = np.dtype("<u8")


@dataclass(frozen=True)
class SpanSource:
    """What every trace of an export process shares: the resource of the training
    process, and how phase indices and error codes are named."""

    resource: Mapping[str, Any]
    span_name: Callable[[int], str]
    error_name: Callable[[int], str]


class Traces:
    """Whole traces of one recorder with the same root attributes.

    ``records``: int64 ``(n, RECORD_FIELDS)``, start and end in Unix epoch ns; ``starts``:
    where each trace's records begin, then ``n``; ``trace_ids`` (ints of 128 bits) and
    ``span_ids`` (one per record) were drawn when they arrived.
    """

    __slots__ = ("source", "attrs", "attrs_key", "root_attrs", "records", "starts", "trace_ids",
                 "span_ids")

    def __init__(self, source: SpanSource, attrs: Mapping[str, Any], attrs_key: str,
                 root_attrs: Mapping[str, Any], records: np.ndarray, starts: Sequence[int],
                 trace_ids: Sequence[int], span_ids: np.ndarray) -> None:
        self.source = source
        self.attrs = attrs
        #: the attributes as a hashable key (templates are cached by it)
        self.attrs_key = attrs_key
        self.root_attrs = root_attrs
        self.records = records
        self.starts = starts
        self.trace_ids = trace_ids
        self.span_ids = span_ids

    def __len__(self) -> int:
        return len(self.trace_ids)

    @property
    def spans(self) -> int:
        return self.starts[-1] - self.starts[0]

    def part(self, first: int, last: int) -> Traces:
        """Traces ``first`` up to ``last`` (exclusive) of these."""
        a, b = self.starts[first], self.starts[last]
        return Traces(self.source, self.attrs, self.attrs_key, self.root_attrs, self.records[a:b],
                      [s - a for s in self.starts[first:last + 1]],
                      self.trace_ids[first:last], self.span_ids[a:b])

    def each(self) -> Iterator[tuple[int, int, int]]:
        """(trace index, first record, end record) of each trace."""
        starts = self.starts
        for t in range(len(self.trace_ids)):
            yield t, starts[t], starts[t + 1]


class TraceQueue:
    """Traces waiting in the export process, in arrival order; :meth:`take` cuts batches
    of whole traces."""

    def __init__(self, source: SpanSource) -> None:
        self.source = source
        self._rand = random.Random().getrandbits
        self._queue: deque[Traces] = deque()
        self.pending = 0  # spans

    def add(self, attrs: Mapping[str, Any], attrs_key: str, offset: int,
            root_attrs: Mapping[str, Any], records: np.ndarray, sizes: Sequence[int]) -> None:
        """Traces of one recorder one after another in ``records`` (recorder clocks:
        ``offset`` turns them into Unix ns), ``sizes`` their record counts; ``attrs`` its
        span attributes, ``attrs_key`` a string that differs when they do."""
        sizes = [n for n in sizes if n]
        if not sizes:
            return
        records = np.array(records, dtype=np.int64)  # a copy: times are shifted in place
        records[:, R_START:R_END + 1] += offset
        starts = [0]
        for n in sizes:
            starts.append(starts[-1] + n)
        n, k = starts[-1], len(sizes)
        words = 2 * k + n
        ids = np.frombuffer(self._rand(64 * words).to_bytes(8 * words, "little"), dtype=_U64)
        ids = np.where(ids == 0, np.uint64(1), ids)  # 0 is no id in OpenTelemetry
        halves = ids[:2 * k].tolist()
        trace_ids = [halves[2 * t] << 64 | halves[2 * t + 1] for t in range(k)]
        self._queue.append(Traces(self.source, attrs, attrs_key, root_attrs, records, starts,
                                  trace_ids, ids[2 * k:]))
        self.pending += n

    def take(self, max_spans: int) -> list[Traces]:
        """The next batch: whole traces up to ``max_spans`` spans (one trace if larger);
        empty when none waits."""
        out: list[Traces] = []
        room = max_spans
        queue = self._queue
        while queue:
            head = queue[0]
            starts = head.starts
            # traces of head that fit: the first always does when the batch is empty
            end = 0
            while end < len(head) and starts[end + 1] - starts[0] <= room:
                end += 1
            if end == 0:
                if out:
                    break
                end = 1
            if end == len(head):
                out.append(queue.popleft())
            else:
                out.append(head.part(0, end))
                queue[0] = head.part(end, len(head))
            taken = starts[end] - starts[0]
            room -= taken
            self.pending -= taken
            if room <= 0:
                break
        return out


# -- text templates ---------------------------------------------------------------------------
class Slot:
    """Placeholders of a template: a value rendered by the format's function, found in its
    output and replaced by ``%(name)s`` (``text``: a JSON string, quotes kept)."""

    def __init__(self) -> None:
        self._token = "rt" + secrets.token_hex(6)
        self._find = re.compile(f'"{self._token}([SN])([A-Za-z0-9_]+)"')

    def text(self, name: str) -> str:
        """A JSON string value filled per trace."""
        return f"{self._token}S{name}"

    def number(self, name: str) -> str:
        """A JSON number filled per trace (rendered as a string while the shape is)."""
        return f"{self._token}N{name}"

    def template(self, rendered: str) -> str:
        """``rendered`` (text holding slots) as a ``%``-mapping format string."""
        escaped = rendered.replace("%", "%%")

        def repl(m: re.Match[str]) -> str:
            return f'"%({m.group(2)})s"' if m.group(1) == "S" else f"%({m.group(2)})s"

        return self._find.sub(repl, escaped)


def effective_counts(rows: Sequence[Sequence[int]]) -> list[int]:
    """Per record, the reset count its span carries: its own, else its parent's."""
    counts: list[int] = []
    for r in rows:
        c = r[R_COUNT]
        if c < 0 and r[R_PARENT] >= 0:
            c = counts[r[R_PARENT]]
        counts.append(c)
    return counts


class TextTemplates:
    """The template of each trace shape for one format, and per-trace values.

    ``render(traces, rows, counts, slot)`` renders one trace of a shape with ``slot``
    placeholders (its records ``rows``, their effective ``counts``); ``fill`` turns the
    template into the text of each trace. Values each trace offers: ``t`` (trace id,
    32 hex), ``s<i>`` (span id of record i, 16 hex), ``b<i>``/``e<i>`` (start/end, Unix
    ns), ``c<i>`` (its count), and what ``extra`` adds.
    """

    _MAX = 1024  # shapes kept; beyond that the cache starts again

    def __init__(self, render: Callable[[Traces, list[list[int]], list[int], Slot], str]
                 ) -> None:
        self._render = render
        self._slot = Slot()
        self._cache: dict[tuple[Any, ...], str] = {}

    def traces(self, batch: Sequence[Traces],
               extra: Callable[[dict[str, Any], list[list[int]]], None] | None = None
               ) -> Iterator[tuple[Traces, int, str]]:
        """(traces, index, text) of every trace of ``batch``, in order; ``extra`` adds
        values of the format's own to each trace's."""
        cache = self._cache
        for traces in batch:
            rows_all = traces.records.tolist()
            ids = traces.span_ids.byteswap().tobytes().hex()
            head = (id(traces.source), traces.attrs_key, tuple(traces.root_attrs.items()))
            for t, a, b in traces.each():
                rows = rows_all[a:b]
                counts = effective_counts(rows)
                key = (head,
                       tuple((r[R_PHASE], r[R_PARENT], r[R_ERROR], c >= 0)
                             for r, c in zip(rows, counts, strict=True)))
                template = cache.get(key)
                if template is None:
                    if len(cache) >= self._MAX:
                        cache.clear()
                    template = cache[key] = self._slot.template(
                        self._render(traces, rows, counts, self._slot))
                values: dict[str, Any] = {"t": f"{traces.trace_ids[t]:032x}"}
                for i, r in enumerate(rows):
                    j = 16 * (a + i)
                    values[f"s{i}"] = ids[j:j + 16]
                    values[f"b{i}"] = r[R_START]
                    values[f"e{i}"] = r[R_END]
                    values[f"c{i}"] = counts[i]
                if extra is not None:
                    extra(values, rows)
                yield traces, t, template % values
