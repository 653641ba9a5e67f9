"""The hot-path recorder: nested phase scopes that only read the clock.

``with recorder.scope(PHASE):`` costs two ``perf_counter_ns`` reads and six int64s
written into the recorder's record buffer; no OpenTelemetry call is made on the training
thread. When the outermost
scope closes, the finished tree of records (a *trace*) is packed into one block of int64
fields (:data:`Trace`: no Python object per record) and handed to the sinks: the
:class:`~resettrace.tracing.aggregate.Aggregator` aggregates it (a trace closed in C goes
straight into its :data:`TraceQueue`), and in ``trace`` mode the span sinks export it.
With the compiled part (:data:`COMPILED`) the common cases of all this run in C, on the
state the recorder's C base holds; the Python code below is every case, and the whole
recorder when the part is not built.

With tracing off every component gets :data:`NOOP_RECORDER`, whose ``scope()``
returns one shared do-nothing scope and whose ``timing()`` is ``None``.

A record is six int64s, the fields of :mod:`resettrace.tracing.layout` in its order (the
C part reads the same names from the header written from it): its phase's index in the
recorder's :class:`~resettrace.catalog.Catalog`, its parent's position in the trace or -1,
start and end ns, the envs reset (-1: not given), and 0 or the code of the exception type
that left the scope (:func:`error_name`). The open trace's records live in one flat int64
buffer per recorder (:data:`Records`; a recorder records on one thread), record ``j``'s
field ``f`` at ``j * RECORD_FIELDS + f``: no Python object per record, and a closing trace
is one copy of a block (:data:`Trace`).

A trace that opens makes its recorder the thread's current one (:data:`CURRENT`, read
by ``resettrace.current_recorder``) until it closes,
and a scope opened on another recorder of the same thread while a trace is open
joins that trace: an env, its manager and its backend give one trace whatever
recorder objects they hold (the open trace's attributes apply).

Misuse never raises here: scopes nest through a stack, so a phase may re-enter
itself, sit under any parent or be left by an exception; a scope exited without
being entered is ignored; a recorder used from a thread other than the one that
created it records that thread's calls as traces of their own. Each such surprise
is logged once (:func:`note_once`); the statistics treat them in
:mod:`~resettrace.tracing.processor`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import sys
import threading
import time
import weakref
from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, overload

from resettrace.catalog import CATALOG, Catalog, Phase
from resettrace.tracing import devicecounts, lifecycle
from resettrace.tracing.devicecounts import DeferredCount
from resettrace.tracing.layout import (
    NO_COUNT,
    R_COUNT,
    R_END,
    R_ERROR,
    R_PARENT,
    R_PHASE,
    R_START,
    RECORD_FIELDS,
)

__all__ = [
    "Recorder", "NoopRecorder", "NOOP_RECORDER", "Record", "Scope", "NoopScope", "TraceSink",
    "use_clock", "note_once", "count_of", "env_count_of",
]

log = logging.getLogger("resettrace")

Record = Sequence[int]  # the fields of resettrace.tracing.layout, in its order
F = RECORD_FIELDS
#: ``records[_LAST_END]``: the end of the last record of a trace's buffer (an index, not
#: a ``len()`` call: a signal handler runs after a call returns, see _ScopeCore)
_LAST_END = R_END - F

#: exception type names by error code (code 0: no error); append-only
ERROR_NAMES: list[str] = [""]
_ERROR_CODES: dict[str, int] = {}

_NOTED: set[str] = set()
#: records one trace may hold: a scope entered and never exited must not grow it forever
#: (set it with :func:`set_max_trace_records`, which the C part is told by)
MAX_TRACE_RECORDS = 100_000
#: the int64s of MAX_TRACE_RECORDS records
_MAX_FIELDS = MAX_TRACE_RECORDS * F


def set_max_trace_records(n: int) -> int:
    """Set :data:`MAX_TRACE_RECORDS` (in Python and in the C part); the previous value."""
    global MAX_TRACE_RECORDS, _MAX_FIELDS
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the records of a trace must be an int >= 1, got {n!r}")
    old, MAX_TRACE_RECORDS = MAX_TRACE_RECORDS, n
    _MAX_FIELDS = n * F
    if _FAST is not None:
        _FAST.set_max_records(n)
    return old


def note_once(kind: str, message: str, *args: Any) -> None:
    """Log the first surprise of each ``kind`` (misuse that is handled, not raised)."""
    if kind not in _NOTED:
        _NOTED.add(kind)
        log.warning("resettrace: " + message + " (logged once)", *args)


def error_code(name: str) -> int:
    """The code of an exception type name (assigned on first use)."""
    code = _ERROR_CODES.get(name)
    if code is None:
        code = _ERROR_CODES[name] = len(ERROR_NAMES)
        ERROR_NAMES.append(name)
    return code


def error_name(code: int) -> str:
    return ERROR_NAMES[code] if 0 < code < len(ERROR_NAMES) else f"error {code}"


#: the largest count a record holds: records pack as int64
MAX_COUNT = (1 << 63) - 1
#: numpy's array type and count_nonzero once count_of has met a numpy array (this module
#: does not import numpy: ``import resettrace`` stays light)
_NUMPY: list[Any] = [None, None]
_NOT_COUNTS = (str, bytes, bytearray, memoryview, Mapping)


def _not_a_count(kind: str) -> int:
    note_once(f"count:{kind}", "a count of %s is not one (a count is an int in [0, 2**63), a "
              "bool mask or a sequence of env ids); recorded without a count", kind)
    return NO_COUNT


def _int_count(n: int) -> int:
    if 0 <= n <= MAX_COUNT:
        return n
    return _not_a_count("a negative int" if n < 0 else "an int beyond int64")


def _array_count(value: Any) -> int:
    """A numpy array's count: a bool mask's True values, else its length; 0-d: a bool is a
    mask of one, an integer one env id (``ids.nonzero()[0].squeeze()`` of one reset)."""
    kind = value.dtype.kind
    if value.ndim:
        return int(_NUMPY[1](value)) if kind == "b" else len(value)
    if kind == "b":
        return int(bool(value))
    if kind in "iu":
        return _one_env_id("ndarray")
    return _not_a_count(f"a 0-d numpy array of {value.dtype}")


def _one_env_id(kind: str) -> int:
    """The count of a 0-d integer array or tensor: one env id (``nonzero().squeeze()`` of
    one reset), said once."""
    note_once("count:0-d", "a count of a 0-d integer %s is read as one env id "
              "(nonzero().squeeze() of one reset), not as its value: for a count "
              "(torch's mask.sum() is a 0-d tensor too) pass the mask itself, or an int",
              kind)
    return 1


def _kind(dtype: Any) -> str:
    """A dtype's kind as numpy spells it (``b``, ``i``, ``u``, ``f``, ...): numpy's own,
    torch's from its name (``torch.bool``, ``torch.int64``; str() of a numpy dtype is slow,
    so numpy's ``kind`` first); other integer-free dtypes ``f``."""
    kind = getattr(dtype, "kind", None)
    if kind is not None:
        return str(kind)
    name = str(dtype)
    return "b" if name == "torch.bool" else "i" if name.startswith(
        ("torch.int", "torch.uint")) else "f"


def env_count_of(value: Any) -> int:
    """An env count (``env_count=``: the envs in the batch, never env ids): a 0-d integer
    array or tensor is its value, when on the host (one on a device, and a bool mask on a
    device, are not read); anything else as :func:`count_of`."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and type(value) is not bool:
        kind = _kind(dtype)
        zero_d_int = kind in ("i", "u") and not getattr(value, "ndim", 1)
        if zero_d_int or kind == "b":  # (a mask on a device: a count never recorded)
            where = _device(value)
            if where is not None:
                DEVICES.add(where)
                note_once(f"env_count:{where}", "an env count on %s is not read (reading it "
                          "would wait for the device): give it as an int", where)
                return NO_COUNT
        if zero_d_int:
            return _int_count(int(value))
    return count_of(value)


#: the accelerators counts were seen on in this process (``"cuda:0"``): its run record
#: says so (``extra["devices"]``), and so does ``resettrace run``
DEVICES: set[str] = set()


def _device(value: Any) -> str | None:
    """The accelerator an array lives on (``"cuda:0"``), read without touching its data;
    None for host memory (numpy, a CPU tensor) or an array that does not say."""
    dev = getattr(value, "device", None)
    if dev is None or isinstance(dev, str):  # (numpy 2's ndarray.device is "cpu")
        return None
    kind = getattr(dev, "type", None)  # torch.device
    if isinstance(kind, str):
        return None if kind == "cpu" else str(dev)
    is_cpu = getattr(dev, "is_cpu", None)  # warp.context.Device
    if isinstance(is_cpu, bool):
        return None if is_cpu else str(dev)
    return str(dev) if hasattr(value, "__cuda_array_interface__") else None  # cupy's


def count_of(value: Any) -> int:
    """The envs a count value stands for: the one rule every entry point reads a count by
    (``scope(phase, count)``, ``Scope.set_count`` and ``.count``, ``Scope.lap``,
    ``traced(count=...)``, in Python and in C), so a record holds an int, never the value.
    numpy arrays and torch tensors (or another array with a ``dtype``) count alike:

    - a bool mask (any shape) counts its True values; a bool alone (Python's, numpy's, a
      0-d bool array) is a mask of one: 1 or 0;
    - an index array (1-d or more) counts its length (its first dimension), a list, a
      tuple or another sized collection of env ids counts its length; a 0-d integer array
      is one env id (``nonzero().squeeze()`` of one reset): 1;
    - an int (Python's, not a bool; a numpy integer scalar, what ``mask.sum()`` and
      ``len()`` give) *is* the count, when in ``[0, 2**63)``;
    - an array on an accelerator (a CUDA tensor) is never read on the host: counting
      would wait for the device inside the call it times. Its length and shape are on the
      host, so env ids and a 0-d id count as above; a torch bool mask on CUDA is counted
      on the device, and what is returned is a :class:`DeferredCount` (an int of -2 or
      below) that records hold until the count arrives
      (:mod:`~resettrace.tracing.devicecounts`); a mask on another device is no count (one
      warning: pass the ids, ``mask.nonzero()``'s length, or a count);
    - anything else (a negative or too large int, a float, a 0-d float array, None, a
      string, bytes, a mapping, an object without ``len()``) is no count: ``NO_COUNT``
      (-1), with one warning per kind. It never raises. (``traced`` reads None and
      ``slice(None)``, "all envs", as the env count when it knows it.)
    """
    try:
        t = type(value)
        if t is int:
            return value if 0 <= value <= MAX_COUNT else _int_count(value)
        if t is _NUMPY[0]:  # numpy's: the common case of a done mask or env ids
            return _array_count(value)
        if t is list or t is tuple:
            return len(value)
        if t is bool:
            return int(value)
        dtype = getattr(value, "dtype", None)
        if dtype is not None:
            if t.__name__ == "ndarray" and t.__module__ == "numpy":  # known from now on
                _NUMPY[:] = [t, sys.modules["numpy"].count_nonzero]
                return _array_count(value)
            kind = _kind(dtype)
            ndim = getattr(value, "ndim", 0)
            if t.__module__ == "numpy" and not ndim and kind in "iu":
                return _int_count(int(value))  # a numpy integer scalar: a count
            where = _device(value)
            if where is not None:
                DEVICES.add(where)
                note_once("device", "env counts live on %s: resettrace's spans time the "
                          "host, so work launched on the device (kernels, CUDA graph "
                          "replays) shows in the phase where the host next waits for it, "
                          "not in the one that launched it (docs/instrument.md, \"On a "
                          "GPU\")", where)
                if kind == "b":  # counted on the device, the record's count to come
                    handle = devicecounts.defer(value)
                    if handle is not None:
                        return handle
                    return _not_a_count(f"a bool mask on {where} that cannot be counted "
                                        "there (counting it here would wait for the "
                                        "device; a CUDA graph being captured, or a "
                                        "library other than torch)")
            if ndim:
                return int(value.sum()) if kind == "b" else len(value)
            if kind == "b":
                return int(bool(value))
            if kind in "iu":  # a 0-d index array: one env id
                return _one_env_id(t.__name__)
            return _not_a_count(f"a {t.__name__} of {dtype}")
        if t is DeferredCount:  # a count on a device, passed on
            devicecounts.keep(value)
            return value
        if isinstance(value, int):  # an int subclass (an IntEnum)
            return _int_count(int(value))
        if value is None or isinstance(value, _NOT_COUNTS) or not hasattr(t, "__len__"):
            return _not_a_count(f"a {t.__name__}")
        return len(value)
    except Exception as e:  # a count never breaks the call it is read for
        return _not_a_count(f"a {type(value).__name__} that failed to count "
                            f"({type(e).__name__})")


def _count(count: Any) -> int:
    """``count`` as a record holds it: an int as given (``NO_COUNT``: none), else
    :func:`count_of`'s."""
    if count.__class__ is int and NO_COUNT <= count <= MAX_COUNT:
        return count
    return count_of(count)


_perf_ns = time.perf_counter_ns
_get_ident = threading.get_ident

class _Slot(threading.local):
    value: Any = None


def _first_start(records: Any, pos: int, t: int) -> int:
    """The start of the record at ``pos``, begun at ``t``, that a signal handler's records
    entered while it opened: theirs, when earlier (they are inside it)."""
    return min([t, *(records[j * F + R_START] for j in range(pos + 1, len(records) // F))])


def _last_end(records: Any, pos: int, t: int) -> int:
    """The end of the record at ``pos``, ended at ``t``, that a signal handler's records
    outlast (they ran after its clock read, inside it): the last of theirs."""
    return max([t, *(records[j * F + R_END] for j in range(pos + 1, len(records) // F))])


def _compiled() -> Any:
    """The compiled hot path (``resettrace.tracing._fast``), unless it is not built or
    ``RESETTRACE_PURE_PYTHON=1``; both record the same."""
    import os

    global NOT_BUILT
    if os.environ.get("RESETTRACE_PURE_PYTHON", "").strip() not in ("", "0"):
        return None
    try:
        from resettrace.tracing import _fast  # type: ignore[attr-defined]
    except ImportError as e:
        NOT_BUILT = str(e) or "not built"
        return None
    _fast.setup(error_code, MAX_TRACE_RECORDS)
    return _fast


#: why the compiled recorder is missing when it was not turned off (None: it runs, or
#: RESETTRACE_PURE_PYTHON=1 turned it off)
NOT_BUILT: str | None = None
_FAST = _compiled()
#: whether scopes enter and exit in C
COMPILED = _FAST is not None


class ThreadCurrent:
    """The current recorder of this thread: the one whose trace is open, else the one
    bound by ``resettrace.bind`` (None: the default session's recorder of the thread).

    ``get``, ``set`` (returns a token) and ``reset(token)``, as a ``ContextVar``; but a
    thread-local: a ``ContextVar`` set in the thread's context made every lookup of any
    other variable that is not set there (numpy 2 looks up its error state on every ufunc
    call) search the context instead of taking its cached default, so an open trace
    slowed the training code it timed (1.9% more instructions in a step of 16 Gymnasium
    Hoppers). A recorder belongs to its thread anyway, and a scope cannot stay open
    across an ``await``.
    """

    __slots__ = ("_slot", "get")

    def __init__(self) -> None:
        # compiled: a C thread-local the hot path reads in place
        self._slot: Any = _FAST.Slot() if _FAST is not None else _Slot()
        self.get: Callable[[], Any] = functools.partial(getattr, self._slot, "value")

    def set(self, value: Any) -> tuple[Any]:
        slot = self._slot
        token = (slot.value,)
        slot.value = value
        return token

    def reset(self, token: tuple[Any]) -> None:
        self._slot.value = token[0]


CURRENT = ThreadCurrent()
_current_get = CURRENT.get
#: the slot itself: a trace's opening and closing set it in place (what ``set`` and
#: ``reset`` do, without their frames)
_SLOT = CURRENT._slot


class TraceSink(Protocol):
    """Receives each finished trace (a :data:`Trace`: a sequence of records, each a tuple
    of the layout's ints; its ``data`` the flat int64 fields). Called on the thread that
    closed the root scope; it must not block or raise. A sink with a ``trace_queue`` (a
    :data:`TraceQueue`, or a :data:`TraceLog` of int64s) gets the traces the compiled
    recorder closes appended to it while it holds fewer than its ``limit``, without this
    call. (The :data:`Trace` a sink gets is its recorder's: the next trace of the same
    length is written into it when nothing else holds it; a sink that keeps it holds it.)"""

    def on_trace(self, records: Sequence[Record], recorder: Recorder) -> None: ...


class NoopScope:
    __slots__ = ()

    def __enter__(self) -> NoopScope:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def lap(self, phase: Phase | str | None, count: int = NO_COUNT) -> None:
        if phase.__class__ is str and phase not in CATALOG.by_span:  # typos fail when off too
            CATALOG.resolve(phase)

    def timing(self) -> None:
        return None

    @property
    def count(self) -> None:
        return None

    @count.setter
    def count(self, count: int) -> None:
        return None

    def set_count(self, count: int) -> None:
        return None


_NOOP_SCOPE = NoopScope()


class NoopRecorder:
    """The recorder of tracing ``off``: one shared scope, nothing recorded."""

    enabled = False
    attributes: Mapping[str, Any] = {}

    def scope(self, phase: Phase | str, count: int = NO_COUNT,
              lap: Phase | str | None = None) -> NoopScope:
        if phase.__class__ is str and phase not in CATALOG.by_span:  # typos fail when off too
            CATALOG.resolve(phase)
        if lap.__class__ is str and lap not in CATALOG.by_span:
            CATALOG.resolve(lap)
        return _NOOP_SCOPE

    def is_open(self, phase: Phase) -> bool:
        return False

    def innermost(self) -> None:
        return None


NOOP_RECORDER = NoopRecorder()


class _ScopeCore:
    """A scope's fields and its enter and exit, in Python: every case. With the compiled
    hot path (:data:`COMPILED`) its ``ScopeBase`` takes the common case of each (a scope
    inside an open trace) in C and calls these for the others."""

    __slots__ = ("_rec", "_index", "_count", "_first", "_pos", "_stack", "_records", "_laps",
                 "_layout", "_armed", "_stash")

    _rec: Recorder
    _index: int
    _count: int
    _first: int
    _pos: int
    _stack: list[int]
    _records: Any  # the recorder's Records
    _laps: list[int]
    _layout: tuple[int, dict[int, str], dict[str, float], str | None, int] | None
    #: ``scope()`` gave it a count and a first lap that no ``__enter__`` took yet
    _armed: bool
    #: the counts and first laps of earlier ``scope()`` calls not entered yet, when a later
    #: one came before their ``__enter__`` (a signal handler's, landing in between), or None
    _stash: list[tuple[int, int]] | None

    # A signal handler that records runs between two calls of the code it interrupts (the
    # interpreter runs it after a call returns, or as a function starts, or at a loop's
    # back edge), so at every such point below the recorder's state is one that a whole
    # scope (or trace) of the handler's can run through and leave as it found it: a record
    # goes in (``records += r``: no call) and its position is read (``len``: a handler
    # runs after it returns, its records after this one) before the position goes on the
    # stack, a trace's first record and position go in with no call in between, a record's
    # end is set and its position taken off the stack with no call in between, after a
    # last look for a handler's records that ended after the clock read (they are inside
    # it), and a trace is handed over whole (:meth:`Recorder._close_trace`). The C
    # recorder runs no Python code in its steps.
    def __enter__(self) -> Any:
        count, first = self._count, self._first  # first: a handler's scope() may follow
        if count < NO_COUNT:  # a count on a device, recorded again by a scope re-entered
            devicecounts.keep(count)  # type: ignore[arg-type]
        if self._stash is None:
            self._armed = False
        else:  # a handler's scope() came before this __enter__: this one's are back
            self._restore()
        stack = self._stack
        records = self._records
        if len(records) >= _MAX_FIELDS:
            self._rec._overflow()
        if stack:
            r = array("q", (self._index, stack[-1], 0, 0, count, 0))
            records += r
            pos = len(records) // F - 1  # where it went (a handler's records may follow it)
            stack.append(pos)
        else:  # a trace opens: its recorder is the current one until it closes
            rec = self._rec
            if records:  # the last trace's hand-over, interrupted by this (a handler)
                rec._close_trace()
            r = array("q", (self._index, -1, 0, 0, count, 0))
            pos = 0  # (no call from here to the pushes)
            rec._token = (_SLOT.value,)
            _SLOT.value = rec
            records += r
            stack += (pos,)
        at = pos * F + R_START
        if first >= 0:  # it opens with its first lap
            records += array("q", (first, pos, 0, 0, NO_COUNT, 0))
            lap = len(records) // F - 1
            stack.append(lap)
            self._laps.append(lap)
            records[at] = records[lap * F + R_START] = t = _perf_ns()
            if len(records) != (pos + 2) * F:  # a handler's scopes went in meanwhile, before
                t = _first_start(records, pos, t)  # the lap or in it: inside this scope
                records[at] = records[lap * F + R_START] = t
            return self
        records[at] = t = _perf_ns()  # R_START, last: bookkeeping is not timed
        if len(records) != (pos + 1) * F:  # a handler's scopes went in meanwhile: inside it
            records[at] = _first_start(records, pos, t)
        return self

    def _hold(self) -> None:
        """``scope()`` is called again before the ``__enter__`` of the last call (a signal
        handler's scope, landing in between): that call's count and first lap are kept for
        its ``__enter__``, which takes them after the handler's ``__enter__`` is done."""
        stash = self._stash
        if stash is None:
            self._stash = [(self._count, self._first)]
            return
        if len(stash) >= 32:  # scope() calls never entered, not handlers: deeper than any
            del stash[0]
        stash.append((self._count, self._first))

    def _settle(self) -> None:
        """``scope()`` gave this object out for a use other than a ``with`` (its
        ``timing()``, its count): what waits for an ``__enter__`` is an earlier call's, if
        any (a signal handler's use, landing between that call and its enter)."""
        if self._stash is None:
            self._armed = False
        else:
            self._restore()

    def _restore(self) -> None:
        """The count and first lap of the ``scope()`` call before the one just taken (by
        ``__enter__``, or by ``timing()``): they wait for their own ``__enter__``."""
        stash = self._stash
        if stash:
            self._count, self._first = stash.pop()
        if not stash:
            self._stash = None
        self._armed = True

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t = _perf_ns()
        code = 0 if exc_type is None else error_code(exc_type.__name__)
        stack = self._stack
        if not stack:
            note_once("exit-unopened", "scope %r exited without being entered; ignored",
                      self._rec.catalog[self._index].span)
            return
        records = self._records
        pos = stack[-1]
        laps = self._laps
        if laps and laps[-1] == pos:  # its running lap ends with it
            while records[_LAST_END] > t:  # a handler's scope inside it ran after the clock
                t = _last_end(records, pos, t)
            records[pos * F + R_END] = t
            if code:
                records[pos * F + R_ERROR] = code
            del stack[-1]  # (no call in between: statements, not methods)
            del laps[-1]
            pos = stack[-1]
        if records[pos * F + R_PHASE] != self._index:
            t = self._unwind(t)
            if t < 0:
                return  # not open: ignored (a second exit, or never entered)
            pos = stack[-1]
        while records[_LAST_END] > t:  # a handler's scope inside it ran after the clock read
            t = _last_end(records, pos, t)
        records[pos * F + R_END] = t  # (no call from here to the pop: never seen half closed)
        if code:
            records[pos * F + R_ERROR] = code
        self._pos = pos
        del stack[-1]
        if not stack:
            self._rec._close_trace()

    def _unwind(self, t: int) -> int:
        """This scope exits while inner ones are still open: close those at ``t`` too, or
        later when a signal handler's scopes ran inside them after that clock read; the
        time they end at. -1 (nothing closed) when no record of this phase is open."""
        stack, records = self._stack, self._records
        at = next((k for k in range(len(stack) - 1, -1, -1)
                   if records[stack[k] * F + R_PHASE] == self._index), -1)
        cat = self._rec.catalog
        if at < 0:
            note_once("exit-unopened", "scope %r exited while not open (a second exit?); "
                      "ignored", cat[self._index].span)
            return -1
        note_once("exit-mismatch", "scope %r exited while %r inside it was still open; the "
                  "inner scopes were closed with it", cat[self._index].span,
                  cat[records[stack[-1] * F + R_PHASE]].span)
        laps, cut = self._laps, stack[at + 1]
        k = len(laps)
        while k and laps[k - 1] >= cut:  # laps among them end too
            k -= 1
        while records[_LAST_END] > t:  # a handler's scope inside them ran after the clock read
            t = _last_end(records, cut, t)
        inner = stack[at + 1:]
        del laps[k:]  # (no call since the look for a handler's records: statements)
        del stack[at + 1:]
        for p in inner:  # off the stack: a handler's scope now goes in under this one
            records[p * F + R_END] = t
        return t


    def lap(self, phase: Phase | str | None, count: int = NO_COUNT) -> None:
        """End this scope's running lap, if any, and start ``phase`` as its next, at one
        clock read: phases that follow one another under this scope, with no gap between
        them and one Python call each where a ``with`` scope takes three (on a reset's
        small-k path, microseconds). ``None``: end the running lap only. The running lap
        ends with this scope, taking the error of an exception that leaves it. A lap is a
        child like a ``with`` scope's (scopes opened during it are its children); call it
        only while this scope, or its running lap, is the innermost open scope (else it
        is ignored, logged once)."""
        if count.__class__ is not int or not NO_COUNT <= count <= MAX_COUNT:
            count = count_of(count)  # a record holds an int: the one rule (read before
            # the clock and the stack: a value's len() may run traced code)
        t = _perf_ns()
        stack = self._stack
        if not stack:
            note_once("lap-unopened", "lap of scope %r, which is not open; ignored",
                      self._rec.catalog[self._index].span)
            return
        records = self._records
        laps = self._laps
        pos = stack[-1]
        running = laps and laps[-1] == pos
        owner = records[pos * F + R_PARENT] if running else pos
        rec = self._rec
        mine = records[owner * F + R_PHASE] == self._index
        index = -1
        if not mine:
            note_once("lap-not-innermost", "lap of scope %r while %r inside it is open; "
                      "ignored", rec.catalog[self._index].span,
                      rec.catalog[records[owner * F + R_PHASE]].span)
        elif phase is not None:
            if phase.__class__ is str:
                s = rec._named.get(phase)
                index = (s if s is not None else rec._scope_of(phase))._index
            else:
                index = phase.index  # type: ignore[assignment]
                if index >= len(rec._scopes):  # a phase registered after this recorder
                    index = rec._scope_of(phase)._index
            if len(records) >= _MAX_FIELDS:
                rec._overflow()  # closes this scope too: the lap is not recorded
                return
        r = array("q", (index, owner, 0, 0, count, 0)) if index >= 0 else None
        # in the order a signal handler's scopes may interrupt (see _ScopeCore): they ran
        # in the running lap (or this scope) after the clock read, which ends after them
        while records[_LAST_END] > t:
            t = _last_end(records, pos, t)
        if running:
            records[pos * F + R_END] = t  # of the running lap (no call from here to the pops)
            del stack[-1]
            del laps[-1]
        if r is None:
            return
        r[R_START] = t
        records += r
        at = len(records) // F - 1
        stack += (at,)  # (statements: no call from here to the lap's push)
        laps += (at,)
        if len(records) != (at + 1) * F:  # a handler's scopes went in before it was on the
            for j in range(at + 1, len(records) // F):  # stack: they ran during it, inside
                if records[j * F + R_PARENT] == owner:
                    records[j * F + R_PARENT] = at


    def timing(self) -> dict[str, float]:
        """Closed timing dict of this scope's last run: its children's keys and the gap.

        One function on purpose: it runs on the reset path right after the engine, where
        every extra Python call costs microseconds (see :func:`closed_timing`).
        """
        if self._armed:  # taken by scope() for this, not to be entered
            self._settle()
        rec = self._rec
        layout = self._layout
        if layout is None or layout[0] != rec.catalog.version:
            phase = rec.catalog[self._index]
            # (the compiled timing() checks the epoch: no phase registered since)
            epoch = _FAST.catalog_epoch() if _FAST is not None else 0
            version, key_of, zeros = rec.catalog.layout(phase)
            layout = self._layout = (version, key_of, zeros, phase.gap_key, epoch)
        _, key_of, zeros, gap_key, _ = layout
        out = zeros.copy()
        data = rec._records if rec._stack else rec._last.data  # flat int64 fields
        pos = self._pos
        at = pos * F
        if not 0 <= at < len(data) or data[at + R_PHASE] != self._index:
            return out  # never run
        total_ns = 0
        for b in range(at + F, len(data), F):
            if data[b + R_PARENT] == pos:  # a direct child
                key = key_of.get(data[b + R_PHASE])
                if key is not None:
                    d = data[b + R_END] - data[b + R_START]
                    total_ns += d
                    out[key] += d * 1e-6
        if gap_key is not None:
            out[gap_key] = (data[at + R_END] - data[at + R_START] - total_ns) * 1e-6
        return out


class _PyTrace(Sequence[tuple[int, ...]]):
    """A finished trace as the sinks get it: its records' fields (the layout's order) in
    one ``array('q')``, :attr:`data`, no Python object per record; read as a sequence of
    records, each a tuple of ints. The compiled recorder's ``_fast.Trace`` is the same in
    C (its ``data`` a memoryview of the same int64s)."""

    __slots__ = ("data",)

    def __init__(self, records: Sequence[Sequence[int]]) -> None:
        if any(len(r) != RECORD_FIELDS for r in records):
            raise ValueError(f"a record holds {RECORD_FIELDS} fields")
        self.data = array("q", itertools.chain.from_iterable(records))

    def __len__(self) -> int:
        return len(self.data) // RECORD_FIELDS

    @overload
    def __getitem__(self, i: int) -> tuple[int, ...]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, ...]]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, ...] | list[tuple[int, ...]]:
        n = len(self)
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(n))]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("trace index out of range")
        at = i * RECORD_FIELDS
        return tuple(self.data[at:at + RECORD_FIELDS])

    def __repr__(self) -> str:
        return f"<resettrace trace of {len(self)} records>"


#: what a finished trace is handed to the sinks as (see :class:`_PyTrace`)
Trace: Any = _FAST.Trace if _FAST is not None else _PyTrace


class _PyRecords(array):
    """The open trace's records of a recorder: RECORD_FIELDS int64s per record in one flat
    ``array('q')``, record ``j``'s field ``f`` at ``j * RECORD_FIELDS + f``; a record goes
    in with ``records += array('q', fields)``. The compiled recorder's ``_fast.Records``
    is the same in C (a block it keeps across traces, written in place)."""

    def __new__(cls) -> _PyRecords:
        return super().__new__(cls, "q")  # type: ignore[return-value]

    def take(self) -> _PyTrace:
        """The records as a :data:`Trace`, this left empty, at once: from the copy to the
        emptying, no call (after which a signal handler runs) and no new object of the
        cyclic GC's (whose allocation may run a collection, and gc callbacks with it), where
        Python code that records would hand the same trace over (a slice allocates its
        array before it copies: the records it copied were the handler's, or freed)."""
        trace = _PyTrace.__new__(_PyTrace)
        data = array("q")
        data += self  # (array's own extend: a memory block, no object)
        del self[:]
        trace.data = data
        return trace

    def clear(self) -> None:
        del self[:]


#: a recorder's buffer of the open trace's records (see :class:`_PyRecords`)
Records: Any = _FAST.Records if _FAST is not None else _PyRecords


class _PyTraceQueue(deque[Any]):
    """A sink's queue of finished traces (``sink.trace_queue``): a deque with a ``limit``.
    The compiled recorder's ``_fast.TraceQueue`` is the same in C, and a trace it closes
    goes straight into it while it holds fewer than ``limit`` (no ``on_trace`` call).

    A ``keyed`` queue holds the traces of one recorder only (``take()`` returns it with
    them), each ending before ``deadline`` (ns, the records' clock); the pure-Python
    recorder hands every trace to ``on_trace``."""

    limit = 0
    keyed = False
    deadline = 0
    key: Any = None

    def take(self) -> tuple[Any, list[Any]]:
        """``(key, [the traces queued, oldest first])``, the queue left empty, no key."""
        key, items = self.key, list(self)
        self.clear()
        self.key = None
        return key, items


#: a sink's queue of finished traces (see :class:`_PyTraceQueue`)
TraceQueue: Any = _FAST.TraceQueue if _FAST is not None else _PyTraceQueue


class _PyTraceLog:
    """A sink's log of finished traces (``sink.trace_queue``) read as int64s: ``take()``
    gives the first traces' fields one after another and each one's record count, as two
    bytes-like objects (``take(most)``: a bounded batch, the rest kept). The compiled
    recorder's ``_fast.TraceLog`` is the same in C: it keeps the int64s themselves (or a
    reference to a trace another sink holds too), and a trace the compiled recorder
    closes is appended to it while it holds fewer than ``limit`` traces (no object per
    trace, no ``on_trace`` call), except the one that would make ``wake`` traces (0:
    none), which goes to ``on_trace`` (the sink's wake-up of its thread, once a batch);
    here it keeps the traces, joined when taken."""

    __slots__ = ("_items", "limit", "wake")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self.limit = 0
        self.wake = 0

    def append(self, trace: Any) -> None:
        if type(trace) is not _PyTrace:
            raise TypeError(f"a TraceLog holds Trace objects, not {type(trace).__name__}")
        self._items.append(trace)

    def take(self, most: int = 0) -> tuple[bytes, bytes]:
        """``(fields, record counts)`` of the first ``most`` traces (every one: 0)."""
        items = self._items[:most] if most > 0 else self._items[:]
        # (a signal handler's trace appended meanwhile goes at the end: not among these)
        del self._items[:len(items)]
        return (b"".join([t.data for t in items]),
                array("q", [len(t) for t in items]).tobytes())

    def clear(self) -> None:
        self._items = []

    def __len__(self) -> int:
        return len(self._items)


#: a sink's log of finished traces as int64s (see :class:`_PyTraceLog`)
TraceLog: Any = _FAST.TraceLog if _FAST is not None else _PyTraceLog


def say_if_not_built() -> None:
    """One line, once, when a session records with the pure-Python recorder because the
    compiled one is not in this install (an install without a C compiler)."""
    if NOT_BUILT is not None:
        note_once("not-built", "the compiled recorder is not in this install (%s); the "
                  "pure-Python one records the same records at more cost per scope "
                  "(reinstall with a C compiler; RESETTRACE_PURE_PYTHON=1 silences this)",
                  NOT_BUILT)


if TYPE_CHECKING:
    _ScopeBase = _ScopeCore
else:
    _ScopeBase = _FAST.ScopeBase if COMPILED else _ScopeCore


class Scope(_ScopeBase):
    """One phase's reusable scope object (what :meth:`Recorder.scope` returns).

    Use it as a context manager; :meth:`timing` gives the closed timing dict of its
    last run. The open records live on the recorder's stack, so the same scope may
    be entered again inside itself. Call ``recorder.scope(...)`` for each use rather
    than keeping the object: that call routes other threads and open traces. It holds
    direct references to its recorder's stack, records and laps: every attribute lookup
    saved here is saved ~20 times per reset.
    """

    __slots__ = ()

    # the Python implementation of what the compiled one hands back (see setup_recorder)
    _unwind = _ScopeCore._unwind
    _hold = _ScopeCore._hold
    _restore = _ScopeCore._restore
    _settle = _ScopeCore._settle

    def __init__(self, rec: Recorder, index: int) -> None:
        self._rec = rec
        self._index = index
        self._count = NO_COUNT
        self._first = -1  # the phase index of its first lap (-1: none)
        self._pos = -1
        self._stack = rec._stack
        self._records = rec._records
        self._laps = rec._laps
        self._layout = None
        self._armed = False
        self._stash = None

    @property
    def phase(self) -> Phase:
        return self._rec.catalog[self._index]

    @property
    def count(self) -> int | None:
        """The envs this scope's open (else last) call resets; ``None``: none given."""
        if self._armed:  # taken by scope() for this, not to be entered
            self._settle()
        stack, records = self._stack, self._records
        for k in range(len(stack) - 1, -1, -1):
            if records[stack[k] * F + R_PHASE] == self._index:
                return _read_count(records[stack[k] * F + R_COUNT])
        return _read_count(self._count)

    @count.setter
    def count(self, count: int) -> None:
        self.set_count(count)

    def set_count(self, count: int) -> None:
        """Set the envs this scope's open call resets, once it is known (a done mask
        computed inside the timed code, say): an int, a bool mask (its True values) or
        a sequence of env ids, read by :func:`count_of` (anything else: no count, logged
        once). Outside the scope it is ignored (logged once)."""
        count = _count(count)  # first: a value whose len() runs traced code cannot move it
        if self._armed:  # taken by scope() for this, not to be entered
            self._settle()
        stack, records = self._stack, self._records
        for k in range(len(stack) - 1, -1, -1):
            if records[stack[k] * F + R_PHASE] == self._index:
                records[stack[k] * F + R_COUNT] = count
                return
        note_once("count-unopened", "count of scope %r set while it is not open; ignored",
                  self._rec.catalog[self._index].span)



#: called before any recorder's span attributes change (see :class:`SpanAttributes`)
_ATTRIBUTE_WATCHERS: weakref.WeakSet[Any] = weakref.WeakSet()


def _read_count(c: int) -> int | None:
    """A record's count as ``Scope.count`` gives it: None for none; one still on the
    device waited for (asked for, as ``int(mask.sum())`` would)."""
    if c < NO_COUNT:
        handle = devicecounts.handle_of(c)
        return handle.wait() if type(handle) is DeferredCount else None
    return None if c == NO_COUNT else c


def watch_attributes(sink: Any) -> None:
    """Call ``sink.attributes_changing(recorder_attributes)`` before any recorder's span
    attributes change, while the sink lives: a sink that holds traces to export later
    (a keyed :data:`TraceQueue`) sends them with the attributes they closed with."""
    _ATTRIBUTE_WATCHERS.add(sink)


class SpanAttributes(dict[str, Any]):
    """A recorder's span attributes: a dict that tells the sinks watching
    (:func:`watch_attributes`) before it changes."""

    __slots__ = ()

    def _changing(self) -> None:
        for sink in list(_ATTRIBUTE_WATCHERS):
            sink.attributes_changing(self)

    def __setitem__(self, key: str, value: Any) -> None:
        self._changing()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._changing()
        super().__delitem__(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._changing()
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._changing()
        return super().setdefault(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self._changing()
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, Any]:
        self._changing()
        return super().popitem()

    def clear(self) -> None:
        self._changing()
        super().clear()

    def __ior__(self, other: Any) -> SpanAttributes:  # type: ignore[override,misc]
        self._changing()
        super().update(other)
        return self


class _State:
    """The state of a recorder that the hot path reads, in Python: what the compiled
    ``RecorderBase`` holds in C when it runs (:data:`COMPILED`)."""

    __slots__ = ("_stack", "_records", "_laps", "_scopes", "_named", "_owner", "_token",
                 "_last", "_sinks", "_serial")

    _stack: list[int]
    #: the open trace's records (a :data:`Records`, kept across traces)
    _records: Any
    #: positions of the running laps (:meth:`Scope.lap`), each also on the stack
    _laps: list[int]
    _scopes: list[Scope]
    _named: dict[str, Scope]
    _owner: int
    #: ``(the thread's current recorder before the open trace opened,)``, or None
    _token: tuple[Any] | None
    #: the last trace handed to the sinks (a :data:`Trace`)
    _last: Any
    _sinks: tuple[TraceSink, ...]
    #: the traces closed so far: a call that finds it changed when it returns knows its
    #: trace was cut meanwhile (an overflow), whatever the buffer holds now
    _serial: int

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        self = super().__new__(cls)
        self._stack = []
        self._records = _PyRecords()
        self._laps = []
        self._scopes = []
        self._named = {}
        self._owner = _get_ident()
        self._token = None
        self._last = _PyTrace(())
        self._sinks = ()
        self._serial = 0
        return self


if TYPE_CHECKING:
    _RecorderBase = _State
else:
    _RecorderBase = _FAST.RecorderBase if COMPILED else _State


class Recorder(_RecorderBase):
    """Records nested phase scopes for one env (and its backend) on one thread.

    ``attributes`` are attached to every exported span of this recorder (backend
    and task names, env count). A recorder belongs to the thread that created it;
    scopes opened from another thread go to a recorder of that thread with the same
    sinks and attributes, so each thread's traces stay whole.
    """

    # the state the hot path works on (stack, records, laps) and the owner are the base's
    __slots__ = ("__dict__", "__weakref__")

    enabled = True

    def __init__(self, sinks: Sequence[TraceSink] = (), *,
                 attributes: Mapping[str, Any] | None = None,
                 catalog: Catalog = CATALOG) -> None:
        self._sinks = tuple(sinks)
        self.catalog = catalog
        self._attributes = SpanAttributes(attributes or {})
        self._grow()
        self._threads: dict[int, Recorder] = {}
        #: wall-clock ns minus perf_counter ns, to place records in real time
        self.epoch_offset_ns = time.time_ns() - time.perf_counter_ns()
        _RECORDERS.add(self)
        if devicecounts.active():  # counts on a device: its traces may wait for them
            devicecounts.park(self)

    @property
    def attributes(self) -> SpanAttributes:
        """The span attributes (a dict: set keys on it, or set another)."""
        return self._attributes

    @attributes.setter
    def attributes(self, value: Mapping[str, Any]) -> None:
        self._attributes._changing()
        # a SpanAttributes is kept as it is: recorders may share one (see _other_thread)
        self._attributes = value if type(value) is SpanAttributes else SpanAttributes(value)

    def _grow(self) -> None:
        scopes = self._scopes
        scopes.extend(Scope(self, i) for i in range(len(scopes), len(self.catalog)))

    def _scope_general(self, phase: Phase | str, count: int = NO_COUNT,
                       lap: Phase | str | None = None) -> Scope:
        """The scope of ``phase`` (a :class:`Phase` or a registered span name).

        ``count`` is the envs it resets (an attribute), read by :func:`count_of`: an int,
        a bool mask, env ids; anything else is no count (logged once, never raised). An
        unknown name raises ``ValueError`` listing the closest registered names. ``lap``:
        a phase the scope opens with as its first lap (:meth:`Scope.lap`), on the same
        clock read.
        """
        if not self._stack or _get_ident() != self._owner:
            rec = self._target()  # another thread's, or this thread's open trace
            if rec is not self:
                return rec.scope(phase, count, lap)
        if count.__class__ is not int or not NO_COUNT <= count <= MAX_COUNT:
            count = count_of(count)  # a record holds an int: the one rule
        if phase.__class__ is str:
            s = self._named.get(phase)
            if s is None:
                s = self._scope_of(phase)
        else:
            try:
                s = self._scopes[phase.index]  # type: ignore[index]
            except (AttributeError, IndexError):  # a phase registered after this recorder
                s = self._scope_of(phase)
        if lap is None:
            first = -1
        elif isinstance(lap, str):  # a span name, as ``phase`` may be
            f = self._named.get(lap)
            first = (f if f is not None else self._scope_of(lap))._index
        else:
            try:
                first = self._scopes[lap.index]._index
            except (AttributeError, IndexError):
                first = self._scope_of(lap)._index
        # the scope object is shared: a signal handler's scope of the same phase, landing
        # between this call and the ``with``'s ``__enter__``, must not take this count
        if s._armed:  # an earlier call's, not entered yet: kept for its __enter__
            s._hold()
        s._count = count  # (statements: no call from here to the __enter__'s read)
        s._first = first
        s._armed = True
        return s

    if TYPE_CHECKING or not COMPILED:
        scope = _scope_general
    # else: RecorderBase.scope, in C, takes the common case and hands the others to
    # _scope_general (see setup_recorder below the class)

    def is_open(self, phase: Phase) -> bool:
        """Whether a scope of ``phase`` is open on this recorder (or on the trace this
        thread has open on another recorder, which scopes opened here join)."""
        rec: Recorder = self
        if not self._stack:
            cur = _current_get()
            if cur is None or not cur._stack or cur._owner != _get_ident():
                return False
            rec = cur
        records, index = rec._records, phase.index
        for p in rec._stack:  # a plain loop: a generator costs more than the few entries
            if records[p * F + R_PHASE] == index:
                return True
        return False

    def innermost(self) -> tuple[Phase, int] | None:
        """The innermost open phase of this thread's trace (this recorder's, or the one
        this thread has open on another recorder) and its count (``NO_COUNT``: none);
        ``None`` when no scope is open. What an instrumentation of a stack's own profiler
        places its scopes under. A count still on a device (:func:`count_of` of a CUDA
        mask) is its :class:`~resettrace.tracing.devicecounts.DeferredCount`, which
        passed on as a count stands for the same one."""
        rec: Recorder = self
        if not self._stack:
            cur = _current_get()
            if cur is None or not cur._stack or cur._owner != _get_ident():
                return None
            rec = cur
        at = rec._stack[-1] * F
        records = rec._records
        count = records[at + R_COUNT]
        if count < NO_COUNT:  # a count still on the device: passed on as its handle
            count = devicecounts.handle_of(count)
        return rec.catalog[records[at + R_PHASE]], count

    def _target(self) -> Recorder:
        """The recorder a scope opened here now goes to (the one rule :meth:`scope`,
        :meth:`call` and :meth:`call_chain` route by): this thread's own one (a recorder
        used from another thread has one per thread), or the trace this thread has open on
        another recorder, which it joins."""
        ident = _get_ident()
        if ident != self._owner:
            return self._other_thread()._target()
        if not self._stack:
            cur = _current_get()
            if (cur is not None and cur is not self and cur.enabled and cur._stack
                    and cur._owner == ident):
                return cur
        return self

    def call(self, phase: Phase, count: int, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` inside a scope of ``phase`` with ``count``, routed as
        :meth:`scope` routes it: what :func:`~resettrace.tracing.api.traced` runs.

        The same records as ``with self.scope(phase, count): fn(...)``, in one frame where
        that is three: a traced call records between stretches of training code that
        have pushed the recorder's code and data out of the CPU caches, so each
        instruction saved here counts several times over in a training step. A scope that
        is not on top when ``fn`` returns (left open inside it, a lap of its own, an
        overflow) exits as a ``with`` scope's would."""
        stack = self._stack
        if not stack or _get_ident() != self._owner:
            rec = self._target()  # another thread's, or this thread's open trace
            if rec is not self:
                return rec.call(phase, count, fn, args, kwargs)
        if count.__class__ is not int or not NO_COUNT <= count <= MAX_COUNT:
            count = count_of(count)  # a record holds an int: the one rule
        index = phase.index
        if index >= len(self._scopes):  # a phase registered after this recorder
            index = self._scope_of(phase)._index
        records = self._records
        if len(records) >= _MAX_FIELDS:
            self._overflow()
        # in the order a signal handler's scopes may interrupt (see _ScopeCore.__enter__);
        # serial: read with no call from there to the record's push
        if stack:
            r = array("q", (index, stack[-1], 0, 0, count, 0))
            serial = self._serial
            records += r
            pos = len(records) // F - 1
            stack.append(pos)
        else:  # a trace opens: its recorder is the current one until it closes
            if records:  # the last trace's hand-over, interrupted by this (a handler)
                self._close_trace()
            r = array("q", (index, -1, 0, 0, count, 0))
            pos = 0  # (no call from here to the pushes)
            serial = self._serial
            self._token = (_SLOT.value,)
            _SLOT.value = self
            records += r
            stack += (pos,)
        exc_type = None
        at = pos * F
        records[at + R_START] = t = _perf_ns()  # R_START, last: bookkeeping is not timed
        if len(records) != at + F:  # a handler's scopes went in meanwhile: it holds them
            records[at + R_START] = _first_start(records, pos, t)
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            exc_type = type(e)
            raise
        finally:
            t = _perf_ns()
            code = 0 if exc_type is None else error_code(exc_type.__name__)
            if stack and stack[-1] == pos and self._serial == serial:
                s = self._scopes[index]  # it remembers the run: its timing(), its count
                s._pos = pos
                if not s._armed:  # (else a scope() waits for its enter: its count stays)
                    s._count = count
                while records[_LAST_END] > t:  # a handler's scope inside it, after the clock
                    t = _last_end(records, pos, t)
                records[at + R_END] = t  # (no call from here to the pop)
                if code:
                    records[at + R_ERROR] = code
                del stack[-1]
                if not stack:
                    self._close_trace()
            else:  # not on top: it exits as a ``with`` scope's would
                self._scopes[index].__exit__(exc_type, None, None)

    def call_leaf(self, phase: Phase, count: int, fn: Callable[..., Any],
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """:meth:`call` for a function of an extension (``mujoco.mj_forward``): inside an
        open trace of this thread, its record goes in without a turn on the stack, as
        nothing it runs is expected to open scopes. If something does (a Python callback
        the engine calls, or a signal handler), the scopes it opened are moved under this
        record afterwards, so the tree is the same as :meth:`call` makes."""
        stack = self._stack
        if not stack or _get_ident() != self._owner:
            return self.call(phase, count, fn, args, kwargs)
        if count.__class__ is not int or not NO_COUNT <= count <= MAX_COUNT:
            count = count_of(count)  # a record holds an int: the one rule
        index = phase.index
        if index >= len(self._scopes):  # a phase registered after this recorder
            index = self._scope_of(phase)._index
        records = self._records
        if not stack or len(records) >= _MAX_FIELDS:  # (the count's reader closed it)
            return self.call(phase, count, fn, args, kwargs)
        # in the order a signal handler's scopes may interrupt (see _ScopeCore.__enter__):
        # theirs that go in beside it before its end is read are its children (adopted)
        parent = stack[-1]
        r = array("q", (index, parent, 0, 0, count, 0))
        serial = self._serial  # (no call from here to the push)
        records += r
        pos = len(records) // F - 1
        at = pos * F
        exc_type = None
        records[at + R_START] = t = _perf_ns()
        if len(records) != at + F:  # a handler's scopes went in meanwhile: it holds them
            records[at + R_START] = _first_start(records, pos, t)
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            exc_type = type(e)
            raise
        finally:
            t = _perf_ns()
            code = 0 if exc_type is None else error_code(exc_type.__name__)
            if self._serial == serial and len(records) >= at + F:
                records[at + R_END] = t
                if code:
                    records[at + R_ERROR] = code
            if len(records) != at + F or self._serial != serial:  # scopes opened inside it
                self._adopt(pos, parent, index, serial)

    def _adopt(self, pos: int, parent: int, index: int, serial: int) -> None:
        """A leaf's call (:meth:`call_leaf`) opened scopes: they are its children, and it
        ends after them (a signal handler's may have run after its end was read).
        ``serial``: :attr:`_serial` when it went in (another: its trace was cut)."""
        records = self._records
        at = pos * F
        if self._serial == serial and at + F <= len(records):
            end = records[at + R_END]
            for b in range(at + F, len(records), F):  # (a handler's records after these
                if records[b + R_PARENT] == parent:  # run after its end: they stay beside)
                    records[b + R_PARENT] = pos
                    if records[b + R_END] > end:
                        end = records[b + R_END]
            records[at + R_END] = end
        else:  # its trace was cut meanwhile (an overflow): its record went with it
            note_once("leaf-lost", "a call of %r outlived its trace; not recorded",
                      self.catalog[index].span)

    def call_chain(self, indices: Sequence[int], count: int, fn: Callable[..., Any],
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` inside the phases at catalog ``indices``, each inside
        the one before, all opened with one clock read and closed with one: the levels of
        the catalog that one call of a stack is at once (a Gymnasium sub-env's reset is
        ``reset_done`` down to ``set_state``), each a record with ``count``. Scopes opened
        meanwhile nest in the last; scopes left open inside them are closed with them, as
        a scope's exit does (said once)."""
        rec = self
        if not self._stack or _get_ident() != self._owner:
            rec = self._target()  # another thread's, or this thread's open trace
        if count.__class__ is not int or not NO_COUNT <= count <= MAX_COUNT:
            count = count_of(count)  # a record holds an int: the one rule
        n = len(indices)
        if max(indices) >= len(rec._scopes):  # a phase registered after this recorder
            rec._grow()
        stack, records = rec._stack, rec._records
        if len(records) + n * F > _MAX_FIELDS:
            rec._overflow()
        # in the order a signal handler's scopes may interrupt (see _ScopeCore.__enter__):
        # the records go in together (one ``+=``: no call), each under the one before,
        # before their positions go on the stack; serial: read with no call from there to
        # the push
        opened = array("q", [0, stack[-1] if stack else -1, 0, 0, count, 0] * n)
        opened[R_PHASE::F] = array("q", indices)
        if stack:  # (each under the one before, once where they went is known)
            serial = rec._serial
            records += opened
            base = len(records) // F - n  # (a handler's records may follow them)
            for k in range(1, n):  # (off the stack meanwhile: a handler does not see them)
                records[(base + k) * F + R_PARENT] = base + k - 1
            stack += range(base, base + n)
        else:  # a trace opens: its recorder is the current one until it closes
            if records:  # the last trace's hand-over, interrupted by this (a handler)
                rec._close_trace()
            base = 0
            opened[R_PARENT] = -1
            for k in range(1, n):
                opened[k * F + R_PARENT] = k - 1
            positions = range(n)  # (no call from here to the pushes)
            serial = rec._serial
            rec._token = (_SLOT.value,)
            _SLOT.value = rec
            records += opened
            stack += positions
        last = base + n - 1
        exc_type = None
        t = _perf_ns()  # R_START, last: bookkeeping is not timed
        for b in range(base * F + R_START, (last + 1) * F, F):
            records[b] = t
        if len(records) != (last + 1) * F:  # a handler's scopes went in meanwhile: inside
            t = _first_start(records, last, t)
            for b in range(base * F + R_START, (last + 1) * F, F):
                records[b] = t
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            exc_type = type(e)
            raise
        finally:
            t = _perf_ns()
            code = 0 if exc_type is None else error_code(exc_type.__name__)
            if (len(stack) < n or stack[-1] != last or stack[-n] != base
                    or rec._serial != serial):
                # not on top as opened (scopes left open inside, or the trace overflowed):
                # each level exits as its scope would, innermost first
                if rec._serial == serial and len(records) > last * F:
                    for pos in range(last, base - 1, -1):
                        rec._scopes[records[pos * F + R_PHASE]].__exit__(exc_type, None, None)
            else:
                scopes = rec._scopes
                for pos in range(base, last + 1):
                    if code:
                        records[pos * F + R_ERROR] = code
                    scopes[records[pos * F + R_PHASE]]._pos = pos  # each remembers its run
                ends = range(base * F + R_END, (last + 1) * F, F)
                while True:  # their ends, then a last look for a handler's records that
                    for b in ends:  # ended after them (inside them: they end later)
                        records[b] = t
                    if records[_LAST_END] <= t:
                        break
                    t = _last_end(records, last, t)
                del stack[-n:]  # (no call since the look)
                if not stack:
                    rec._close_trace()

    def _scope_of(self, phase: Phase | str) -> Scope:
        p = self.catalog.resolve(phase)
        if p.index >= len(self._scopes):
            self._grow()
        s = self._scopes[p.index]
        self._named[p.span] = s
        return s

    def _overflow(self) -> None:
        """A trace reached :data:`MAX_TRACE_RECORDS` (a scope never exited?): close what
        is open now and hand the trace on, so memory stays bounded."""
        note_once("overflow", "a trace reached %d records (a scope entered and never "
                  "exited?); its open scopes were closed", MAX_TRACE_RECORDS)
        stack, records, laps = self._stack, self._records, self._laps
        t = _perf_ns()
        while stack:  # their ends, then a last look for a handler's records that ended
            for pos in stack:  # after them (inside them: they end later)
                records[pos * F + R_END] = t
            if not stack or records[_LAST_END] <= t:  # (a handler's scope cut it meanwhile)
                del laps[:]  # (no call since the look: a handler sees it closed, whole)
                del stack[:]
                break
            t = _last_end(records, stack[0], t)
        del laps[:]
        self._close_trace()

    @lifecycle.uncut
    def _close_trace(self) -> None:
        """The trace's outermost scope closed: the thread's current recorder is again the
        one before it opened, and a copy of the trace goes to the sinks (the scopes hold
        ``self._records``: the buffer is reused).

        A signal handler's scope that opens a trace before this runs (its stack is empty,
        its records not) calls it first: the trace is handed over once, whole, by whichever
        call comes first (``take()`` copies the records and empties the buffer at once)."""
        token, self._token = self._token, None
        if token is not None:
            _SLOT.value = token[0]
        if not self._records:
            return  # handed over already
        trace = self._records.take()  # one object: no Python object per record from here
        self._serial += 1
        if not trace:
            return  # handed over meanwhile (a handler's trace, between the look and take)
        self._last = trace
        for sink in self._sinks:
            try:
                sink.on_trace(trace, self)
            except Exception:  # a sink must never break training
                log.exception("resettrace: a trace sink failed")

    def _other_thread(self) -> Recorder:
        ident = _get_ident()
        rec = self._threads.get(ident)
        if rec is None:
            rec = Recorder(self._sinks, attributes=self.attributes, catalog=self.catalog)
            rec.attributes = self.attributes  # one dict: attributes set later apply to both
            self._threads[ident] = rec
            if self._stack:
                note_once("other-thread", "a recorder was used from a second thread while its"
                          " own thread had a trace open; each thread's calls are recorded as "
                          "traces of their own")
        return rec


def _sink_failed(exc: BaseException) -> None:
    """A trace sink raised (the compiled hand-over's): logged, never raised into training."""
    log.error("resettrace: a trace sink failed", exc_info=exc)


if COMPILED:
    from resettrace.catalog import ON_REGISTER

    ON_REGISTER.append(_FAST.catalog_changed)
    _FAST.setup_recorder(scope=Recorder._scope_general, enter=_ScopeCore.__enter__,
                         exit=_ScopeCore.__exit__, lap=_ScopeCore.lap,
                         timing=_ScopeCore.timing, sink_failed=_sink_failed,
                         adopt=Recorder._adopt)


def default_changed() -> None:
    """The default tracing session changed (made, replaced, shut down; a fork): the
    compiled traced calls forget each thread's default recorder they were told of
    (:func:`remember_default`) and ask the Python path again."""
    if _FAST is not None:
        _FAST.default_changed()


def default_epoch() -> int:
    """The epoch of the default session now (see :func:`remember_default`)."""
    return _FAST.default_epoch() if _FAST is not None else 0


def remember_default(rec: Recorder | None, epoch: int) -> None:
    """Tell the compiled traced calls this thread's default recorder as resolved at
    ``epoch`` (:func:`default_epoch`, read before resolving it); ``None``: tracing off
    (they run the call untraced). A weak reference: the session holds the recorder."""
    if _FAST is not None:
        _FAST.remember_default(rec, epoch)


#: every recorder alive, for :func:`_discard_open_traces`
_RECORDERS: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _discard_open_traces() -> None:
    """In a forked child: the traces open at the fork are its parent's (the parent closes
    and counts them), and the code that would close them may never run here (a
    ``multiprocessing`` worker forked inside a traced step): every one is dropped, so the
    child's own scopes open traces of their own. The thread's current recorder is again
    the one before the outermost of them opened."""
    current = _SLOT.value
    while isinstance(current, Recorder) and (current._stack or current._records):
        token = current._token
        current = token[0] if token is not None else None
    for rec in list(_RECORDERS):
        if rec._stack or rec._records:
            del rec._stack[:]
            rec._records.clear()
            del rec._laps[:]
            rec._token = None
            rec._serial += 1
    _SLOT.value = current


lifecycle.at_fork(_discard_open_traces)
# a forked child counts on the devices it uses itself (CUDA does not survive a fork)
lifecycle.at_fork(DEVICES.clear)
lifecycle.at_fork(devicecounts.after_fork_in_child)
devicecounts.bind(note_once, Trace, _RECORDERS, watch_attributes)


def use_clock(clock_ns: Callable[[], int] | None) -> None:
    """Replace the recorder clock (tests); ``None`` restores ``perf_counter_ns``."""
    global _perf_ns
    _perf_ns = time.perf_counter_ns if clock_ns is None else clock_ns
    if _FAST is not None:
        _FAST.set_clock(clock_ns)
