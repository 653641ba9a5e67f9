"""A record's layout: the one definition the recorder (Python and C) and every sink index
records by.

A record is six ints, in this order: ``phase`` (the index of its phase in the recorder's
:class:`~resettrace.catalog.Catalog`), ``parent`` (the position of its parent record in
the trace, or -1), ``start`` and ``end`` (``perf_counter_ns``), ``count`` (the envs it
resets, or :data:`NO_COUNT`) and ``error`` (0, or the code of the exception type that left
the scope). The C part reads the same names from ``_layout.h``, which
``python -m resettrace.tracing.layout`` writes from this module (a test checks that the
committed header is the one it writes).
"""

from __future__ import annotations

__all__ = ["FIELDS", "R_PHASE", "R_PARENT", "R_START", "R_END", "R_COUNT", "R_ERROR",
           "RECORD_FIELDS", "NO_COUNT", "c_header"]

FIELDS = ("phase", "parent", "start", "end", "count", "error")
R_PHASE, R_PARENT, R_START, R_END, R_COUNT, R_ERROR = range(len(FIELDS))
RECORD_FIELDS = len(FIELDS)
#: a record's count when none was given
NO_COUNT = -1


def c_header() -> str:
    """The C header of this layout (``src/resettrace/tracing/_layout.h``)."""
    lines = ["/* A record's layout, written by `python -m resettrace.tracing.layout` from",
             " * layout.py (the one definition): do not edit. */",
             "#ifndef RESETTRACE_LAYOUT_H", "#define RESETTRACE_LAYOUT_H"]
    lines += [f"#define R_{name.upper()} {i}" for i, name in enumerate(FIELDS)]
    lines += [f"#define RECORD_FIELDS {RECORD_FIELDS}", f"#define NO_COUNT ({NO_COUNT})",
              "#endif", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    out = Path(__file__).with_name("_layout.h")
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if out.read_text() == c_header() else f"{out} is stale: run "
                 "python -m resettrace.tracing.layout")
    out.write_text(c_header())
