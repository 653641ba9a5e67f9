"""Plain-text tables and the timing.json / timing.csv writers (standard library only).

:func:`write_json` and :func:`write_csv` write through :func:`resettrace.outputs.write_output`
(atomic, never through a symbolic link, never over a file that is not resettrace's: see
:mod:`resettrace.outputs`) and return the path written. Every JSON file starts with the key
``"resettrace"`` (the version that wrote it), by which a later write recognises it as
resettrace's own.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from resettrace import outputs
from resettrace.outputs import CSV_COLUMNS
from resettrace.version import __version__

__all__ = ["format_table", "write_json", "write_csv", "STAT_FIELDS",
           "exporter_outcome"]


STAT_FIELDS = CSV_COLUMNS[1:-1]  # (count ... total_ms: timing.csv's header, outputs')


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.3f}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def format_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A titled table, first column left-aligned, the rest right-aligned."""
    cells = [list(header)] + [[_cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "-" * len(title)]
    for j, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: Path, payload: Mapping[str, Any], *, compact: bool = False) -> Path:
    """Write ``payload`` as JSON, ``"resettrace": VERSION`` first; the path written.
    ``compact``: on one line (CPython's C encoder: about 5x less CPU than indented, for a
    record written every few seconds beside the training)."""
    doc = {outputs.JSON_MARKER: __version__, **payload}
    text = json.dumps(doc, allow_nan=False, default=_json_default,
                      **({"separators": (",", ":")} if compact else {"indent": 1}))
    return outputs.write_output(path, outputs.JSON, text.encode())


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_csv(path: Path, stats: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write the per-key stats as CSV (timing.csv); the path written."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for key, s in stats.items():
        share = s.get("share_of_parent")
        w.writerow([key] + [s[k] for k in STAT_FIELDS] + ["" if share is None else share])
    return outputs.write_output(path, outputs.CSV, buf.getvalue().encode())


def exporter_outcome(e: Mapping[str, Any], dropped: int = 0) -> str:
    """What became of one exporter's spans, in words: delivered, and of the rest how many
    failed (timed out among them), were cut off by the deadline, or dropped."""
    written = f" to {e['path']}" if e.get("path") else ""
    parts = []
    if e.get("failed"):
        failed = f"{e['failed']} failed to send"
        if e.get("timed_out"):
            failed += (f" ({e['timed_out']} of them timed out waiting for the answer: the "
                       "receiver may hold those)")
        parts.append(failed)
    if e.get("cut_off"):
        parts.append(f"{e['cut_off']} cut off by the shutdown deadline (never sent)")
    if dropped and e.get("undelivered"):
        parts.append(f"{dropped} dropped before export")
    why = f"; {e['error']}" if e.get("error") else ""
    return (f"{e['delivered']} delivered{written}, {e['undelivered']} not delivered"
            + (f": {', '.join(parts)}" if parts else "") + why)
