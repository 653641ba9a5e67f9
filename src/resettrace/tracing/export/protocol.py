"""The pipe between the training process and its export process: every frame kind, in one
table that both ends use.

A frame is ``<I`` payload length, one kind byte, then the payload: the kind's fixed head
(:data:`HEADS`), then what follows it. The export process answers on its stdout with one
JSON status per line.

=========  =============  ====================================================================
kind       head           payload after the head
=========  =============  ====================================================================
SETTINGS   (none)         JSON: the config, exporters, resource and the parent's pid
REGISTER   ``<Iq``        recorder id, epoch offset (ns); JSON of its span attributes
ERROR      ``<I``         error code; the exception type's name (UTF-8)
PHASE      ``<I``         catalog index; the span name (UTF-8): phases reach the export
                          process by name, so one registered after the session started
                          exports like a built-in one
TRACE      ``<IIq``       recorder id, record count ``n``, spans dropped so far;
                          ``RECORD_FIELDS * n`` int64 (the records)
FLUSH      ``<I``         sequence number (the status echoes it when all before is out)
QUIT       ``<d``         seconds left to finish, from the moment the frame is read
=========  =============  ====================================================================
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any

__all__ = ["Kind", "FRAME", "HEADS", "TRACE_HEAD", "frame", "head_of", "trace_packer"]


class Kind(IntEnum):
    SETTINGS = ord("C")
    REGISTER = ord("R")
    ERROR = ord("E")
    PHASE = ord("P")
    TRACE = ord("T")
    FLUSH = ord("F")
    QUIT = ord("Q")


#: the frame header: payload length, kind
FRAME = struct.Struct("<IB")

#: each kind's fixed head (SETTINGS has none: its payload is JSON)
HEADS: dict[Kind, struct.Struct] = {
    Kind.SETTINGS: struct.Struct(""),
    Kind.REGISTER: struct.Struct("<Iq"),
    Kind.ERROR: struct.Struct("<I"),
    Kind.PHASE: struct.Struct("<I"),
    Kind.TRACE: struct.Struct("<IIq"),
    Kind.FLUSH: struct.Struct("<I"),
    Kind.QUIT: struct.Struct("<d"),
}

#: a whole TRACE frame's header and head: its records' int64s follow (the training
#: process's hot path writes a recorder's trace block after it as it is)
TRACE_HEAD = struct.Struct(FRAME.format + HEADS[Kind.TRACE].format[1:])

#: struct per record count: a TRACE frame's header, head and every record field in one
#: ``pack`` call (the training process's hot path)
_TRACE_PACKERS: dict[int, struct.Struct] = {}


def frame(kind: Kind, *head: int | float, rest: bytes = b"") -> bytes:
    """One frame of ``kind``: its head's values, then ``rest``."""
    payload = HEADS[kind].pack(*head) + rest
    return FRAME.pack(len(payload), kind) + payload


def trace_packer(n: int, fields: int) -> struct.Struct:
    """The struct of a whole TRACE frame of ``n`` records of ``fields`` int64 each: pack it
    with the payload length, ``Kind.TRACE``, the head's values and the record fields."""
    packer = _TRACE_PACKERS.get(n)
    if packer is None:
        packer = _TRACE_PACKERS[n] = struct.Struct(
            f"{FRAME.format}{HEADS[Kind.TRACE].format[1:]}{n * fields}q")
    return packer


def head_of(kind: int, payload: memoryview) -> tuple[tuple[Any, ...], memoryview]:
    """A received payload of ``kind``: its head's values and the rest."""
    head = HEADS[Kind(kind)]
    if len(payload) < head.size:
        raise ValueError(f"a {Kind(kind).name} frame of {len(payload)} bytes")
    return head.unpack_from(payload), payload[head.size:]
