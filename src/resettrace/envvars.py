"""How a setting is read from the environment, below every module that reads one
(:mod:`resettrace.config`, the rank rule in :mod:`resettrace.launcher`): a number is
bounded before any arithmetic (:class:`Number`), the first of a setting's variables that is
set wins (:func:`first_set`), and a bad value is said once per process however many
readers the setting has (:func:`warn_env`)."""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: (the settings' warnings keep the logger they always had)
log = logging.getLogger("resettrace.config")

#: the largest int a numeric setting may hold (a 32-bit signed int's)
INT_MAX = 2**31 - 1
#: a numeric setting longer than this is refused unread (no valid one comes close)
MAX_NUMBER_TEXT = 64


@dataclass(frozen=True)
class Number:
    """A numeric setting: its variables (the first set wins), type, valid range and the
    factor from the variable's unit to the field's (ms -> s: 0.001)."""

    env: tuple[str, ...]
    kind: type
    low: float
    high: float
    scale: float = 1.0

    def problem(self, value: float) -> str | None:
        """Why ``value`` (in the field's unit) is not valid, or ``None``. Exact for an int
        of any size (never converted to a float, which overflows past 1e308)."""
        if not isinstance(value, (int, float)) or isinstance(value, bool) or (
                self.kind is int and isinstance(value, float) and not value.is_integer()):
            return f"must be {'an integer' if self.kind is int else 'a number'}"
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        lo, hi = self.low * self.scale, self.high * self.scale
        if not lo <= value <= hi:
            return f"must be in {fmt_number(lo)} - {fmt_number(hi)}"
        return None

    def parse(self, raw: str) -> tuple[Any, str | None]:
        """The value of the variable text ``raw`` in the field's unit, or ``None`` and
        why not: every numeric setting is read here, bounded before any arithmetic (a
        number of any length is refused, never an ``OverflowError``)."""
        text = raw.strip()
        bad = f"is not valid ({fmt_number(self.low)} - {fmt_number(self.high)})"
        if len(text) > MAX_NUMBER_TEXT:
            return None, bad
        try:
            value: float = int(text) if self.kind is int else float(text)
        except ValueError:
            try:
                value = float(text)  # "1e3" or "2.0" for an integer setting
            except ValueError:
                return None, "is not a number"
        if isinstance(value, float) and not math.isfinite(value):
            return None, bad
        if not self.low <= value <= self.high:  # in the variable's unit: exact for ints
            return None, bad
        value = value * self.scale if self.scale != 1.0 else value
        if self.problem(value) is not None:  # 2.5 for an integer setting
            return None, bad
        return self.kind(value), None


def fmt_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"



def first_set(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str | None]:
    for name in names:
        raw = env.get(name)
        if raw is not None and raw.strip():
            return name, raw.strip()
    return names[-1], None



#: the warnings about this process's environment given so far: each is given once
_REPORTED: set[str] = set()
_REPORTED_LOCK = threading.Lock()


def warn_env(env: Mapping[str, str], msg: str, *args: Any, level: int = logging.WARNING) -> None:
    """Log ``msg % args``: once per process when ``env`` is the process's environment
    (every reader of a setting may read it again: one bad setting is still one line)."""
    if env is os.environ:
        text = msg % args
        with _REPORTED_LOCK:
            if text in _REPORTED:
                return
            _REPORTED.add(text)
    log.log(level, msg, *args)


def say_once(msg: str, *args: Any, level: int = logging.WARNING) -> None:
    """Log ``msg % args`` about a setting of this process's environment, once per process
    (the same text from another reader of the setting is not said again)."""
    warn_env(os.environ, msg, *args, level=level)



def shown(raw: str) -> str:
    """``raw`` quoted for a one-line warning, cut to a readable length."""
    return repr(raw) if len(raw) <= 40 else repr(raw[:20]) + f"... ({len(raw)} characters)"
