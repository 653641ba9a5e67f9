"""The public recording API: sessions, recorders, the current recorder and ``traced``.

Three ways to time your own code, all feeding the same statistics and spans:

- ``rec = resettrace.recorder(backend="mylab", env_count=4096)`` then
  ``with rec.scope("set_state", k) as s: ...``; ``s.timing()`` is the closed
  timing dict of that run;
- the *current* recorder (:func:`current_recorder`, per thread: see
  :class:`~resettrace.tracing.recorder.ThreadCurrent`) is the one whose trace is open, so
  the env, the domain-randomization manager and the backend nest into one trace
  without passing the recorder around; ``with resettrace.bind(rec):`` chooses it
  for a block before any trace is open (``bind(NOOP_RECORDER)`` silences one);
- ``@resettrace.traced("dr_reset", count="env_ids")`` records every call of a
  function with the current recorder.

The default session (:func:`get_tracing`) is created from the environment
(``RESETTRACE=off|timing|trace``) on first use; :func:`configure` replaces it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from resettrace.catalog import ATTR_ENV_COUNT, CATALOG, Phase, text_problem
from resettrace.config import Config
from resettrace.tracing import lifecycle
from resettrace.tracing import recorder as _rec
from resettrace.tracing.layout import NO_COUNT, R_PHASE, RECORD_FIELDS
from resettrace.tracing.recorder import (
    CURRENT,
    MAX_COUNT,
    NoopRecorder,
    Recorder,
    count_of,
    env_count_of,
    note_once,
)

if TYPE_CHECKING:
    from resettrace.tracing.processor import KeyStats
    from resettrace.tracing.session import Tracing

__all__ = ["configure", "get_tracing", "use_tracing", "stats", "recorder", "bind",
           "current_recorder", "recording", "traced", "count_of"]

F = TypeVar("F", bound=Callable[..., Any])

#: re-entrant: a signal handler that records may run on the thread that holds it
_lock = threading.RLock()
_default: Tracing | None = None
#: the default session is being made (under the lock), and the session a signal handler
#: that interrupts the making gets meanwhile (see :func:`get_tracing`)
_making = False
_while_making: Tracing | None = None
_CURRENT = CURRENT
_get_current = _CURRENT.get
if _rec.COMPILED:
    _rec._FAST.setup_api(Recorder, ATTR_ENV_COUNT)
_default_changed = _rec.default_changed
#: told the default recorder it resolves (the compiled core only: pure Python asks each call)
_tell_default = _rec.COMPILED
_default_epoch = _rec.default_epoch
_remember_default = _rec.remember_default
lifecycle.at_fork(_default_changed)


# -- sessions -----------------------------------------------------------------------------
def configure(config: Config | None = None, *, tracer_provider: Any = None,
              **options: Any) -> Tracing:
    """Start a new default tracing session; the previous one is flushed and shut down.

    ``options`` are :class:`Config` fields (``mode="timing"``, ``exporters=...``); they
    win over the environment, which wins over the defaults. A ``tracer_provider``
    passed in receives the spans and is never shut down by resettrace.
    """
    from resettrace.tracing.session import Tracing

    global _default
    if config is not None and not isinstance(config, Config):
        hint = f" (configure(mode={config!r})?)" if isinstance(config, str) else ""
        raise TypeError(f"configure() takes a Config or Config fields as keywords, not "
                        f"{type(config).__name__} {config!r}{hint}")
    cfg = config if config is not None else Config.from_env(**options)
    new = Tracing(cfg, tracer_provider=tracer_provider)
    with _lock:
        old, _default = _default, new
        _default_changed()
    if old is not None:
        old.shutdown()
    return new


def get_tracing() -> Tracing:
    """The default tracing session, created from the environment on first use.

    A signal handler that records, run on the thread making it (it takes a while: the span
    export process starts), gets a session that records nothing until it is made (said
    once): it must not wait for the lock its own thread holds, nor make a second one."""
    global _default, _making
    session = _default
    if session is not None:
        return session
    with _lock:
        if _default is not None:
            return _default
        if _making:  # re-entered: only a signal handler of this thread gets in here
            return _meanwhile()
        _making = True  # (no call since the lock was taken: no handler ran in between)
        try:
            from resettrace.tracing.session import Tracing

            made = Tracing(Config.from_env())
        finally:
            _making = False
        _default = made
        _default_changed()
        return made


def _meanwhile() -> Tracing:
    global _while_making
    note_once("reentered-start", "a signal handler recorded while the default session was "
              "being made; what it recorded until then was not recorded")
    if _while_making is None:
        from resettrace.tracing.session import Tracing

        _while_making = Tracing(Config(mode="off"))
    return _while_making


def default_session() -> Tracing | None:
    """The default session if one was made (none is made here)."""
    return _default


@contextlib.contextmanager
def use_tracing(session: Tracing) -> Iterator[Tracing]:
    """Make ``session`` the default for the ``with`` block, then restore the previous one.

    Neither session is shut down: the caller owns ``session``.
    """
    global _default
    with _lock:
        previous, _default = _default, session
        _default_changed()
    try:
        yield session
    finally:
        with _lock:
            _default = previous
            _default_changed()


def stats() -> dict[str, KeyStats]:
    """Aggregated statistics per timing key of the default session."""
    return get_tracing().stats()


def _shutdown_default() -> None:
    if _default is not None:
        _default.shutdown()


lifecycle.at_exit("default session", _shutdown_default)


# -- recorders ----------------------------------------------------------------------------
def recorder(*, backend: str | None = None, task: str | None = None,
             env_count: int | None = None, tracing: Tracing | None = None,
             attributes: Mapping[str, Any] | None = None) -> Recorder | NoopRecorder:
    """A recorder of ``tracing`` (default: the default session) for one env/backend.

    ``backend``, ``task``, ``env_count`` and ``attributes`` go on every span it
    exports. With tracing off it is the shared no-op recorder. Attribute values are taken
    as OpenTelemetry carries them: a numpy scalar (``np.int64(7)``, ``np.float32``,
    ``np.bool_``) becomes its Python value, a list or tuple of them a list or tuple of one
    type. Anything else (bytes, a set, None, any other object, a sequence mixing types, a
    key that is not a string) raises ``TypeError``, and text no exporter could write (a
    lone surrogate, a control character) or an int outside int64 ``ValueError``, naming
    its key, here, in every mode.
    """
    session = tracing if tracing is not None else get_tracing()
    return session.recorder(backend=backend, task=task, env_count=env_count,
                            attributes=attributes)


class bind:  # noqa: N801 - used like a function: ``with resettrace.bind(rec):``
    """Make ``recorder`` the current one for the ``with`` block (nestable, per thread)."""

    __slots__ = ("_recorder", "_token")

    def __init__(self, recorder: Recorder | NoopRecorder) -> None:
        if not hasattr(recorder, "scope"):
            raise TypeError(f"bind() takes a recorder, got {type(recorder).__name__}")
        self._recorder = recorder
        self._token: tuple[Any] | None = None

    def __enter__(self) -> Recorder | NoopRecorder:
        self._token = _CURRENT.set(self._recorder)
        return self._recorder

    def __exit__(self, *exc: object) -> None:
        token, self._token = self._token, None
        if token is not None:
            _CURRENT.reset(token)


def current_recorder(default: Recorder | NoopRecorder | None = None
                     ) -> Recorder | NoopRecorder:
    """The recorder whose trace is open in this context, or the one bound by
    :func:`bind`; else ``default`` when given; else the default session's recorder
    for this thread (the no-op one when tracing is off)."""
    rec = _get_current()
    if rec is not None:
        return rec
    if default is not None:
        return default
    session = _default if _default is not None else get_tracing()
    return session.thread_recorder()


def recording() -> Recorder | None:
    """The current recorder (as :func:`current_recorder`) when it records, else ``None``
    (tracing off): what a wrapper asks before it opens a scope. Off, with no recorder
    bound, it costs a thread-local read and an attribute check."""
    rec = _get_current()
    if rec is None:
        session = _default
        if session is not None and session.aggregator is None:
            return None
        rec = current_recorder()
    return rec if rec.enabled else None


# -- the decorator ------------------------------------------------------------------------
def _with_parents(rec: Recorder, lineage: list[Phase], phase: Phase, count: int,
                  fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  chains: dict[int, tuple[int, ...]]) -> Any:
    """``fn`` under ``phase`` and its parents that are not open (see :func:`traced`),
    opened and closed together (:meth:`Recorder.call_chain`). ``chains``: the levels to
    open under each innermost open phase (-1: none), worked out once per wrapper."""
    stack = rec._stack  # this thread's open trace is rec's (rec is the current one)
    key = rec._records[stack[-1] * RECORD_FIELDS + R_PHASE] if stack else -1
    chain = chains.get(key)
    if chain is None:
        top = rec.innermost()
        if top is None:
            missing = lineage[:-1]  # every parent below the root
        else:
            at = next((i for i, p in enumerate(lineage) if p is top[0]), -1)
            missing = lineage[:at] if at >= 0 else []  # else: recorded where it is
        chain = chains[key] = tuple(p.index for p in [*missing[::-1], phase])
    return rec.call_chain(chain, count, fn, args, kwargs)


def argument_reader(fn: Callable[..., Any], spec: str | Callable[..., Any] | None, what: str
                    ) -> Callable[[tuple[Any, ...], dict[str, Any]], Any] | None:
    """A function of ``(args, kwargs)`` reading ``spec`` from a call of ``fn``.

    ``spec``: an argument name, optionally followed by an attribute path
    (``"self.num_envs"``), or a callable taking the call's arguments.
    """
    if spec is None:
        return None
    if callable(spec):
        return lambda args, kwargs: spec(*args, **kwargs)
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"{what} must be an argument name or a callable, got {spec!r}")
    problem = text_problem(spec)
    if problem is not None:
        raise ValueError(f"{what} {spec!r} {problem}")
    name, *path = spec.split(".")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if params and name not in {p.name for p in params}:
        raise ValueError(f"{what} {spec!r}: {getattr(fn, '__qualname__', fn)!r} has no "
                         f"argument {name!r} (arguments: {', '.join(p.name for p in params)})")
    at = positional.index(name) if name in positional else -1
    default = next((p.default for p in params if p.name == name), inspect.Parameter.empty)

    def read(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if 0 <= at < len(args):
            value = args[at]
        elif name in kwargs:
            value = kwargs[name]
        elif default is not inspect.Parameter.empty:
            value = default
        else:
            raise LookupError(f"argument {name!r} not passed")
        for attr in path:
            value = getattr(value, attr)
        return value

    read.position = at if not path else -1  # type: ignore[attr-defined]
    read.at, read.path = at, tuple(path)  # type: ignore[attr-defined]
    return read


def _deferred_kind(fn: Any) -> tuple[str, str, str] | None:
    """``(kind, what a call makes, what its work runs across)`` for a function whose work
    runs after the call returns (also under ``staticmethod`` or ``classmethod``, or as an
    object's ``__call__``); None for any other."""
    if isinstance(fn, staticmethod | classmethod):
        inner = _deferred_kind(fn.__func__)
        if inner is None:
            return None
        return (f"a {type(fn).__name__} of {inner[0]}", *inner[1:])
    if inspect.isasyncgenfunction(fn):
        return "an async generator function", "an async generator", "yields and awaits"
    if inspect.iscoroutinefunction(fn):
        return "a coroutine function", "a coroutine", "awaits"
    if inspect.isgeneratorfunction(fn):
        return "a generator function", "a generator", "yields"
    if not inspect.isroutine(fn) and not isinstance(fn, type) and callable(fn):
        call = type(fn).__call__  # callable(fn): its type has one
        inner = None if inspect.isbuiltin(call) else _deferred_kind(call)
        if inner is not None:
            return (f"an object whose __call__ is {inner[0]}", *inner[1:])
    return None


def traced(phase: Phase | str, *, count: str | Callable[..., Any] | int | None = None,
           env_count: str | Callable[..., Any] | None = None,
           within: Phase | str | None = None, parents: bool = False) -> Callable[[F], F]:
    """Record every call of the decorated function under ``phase``, with the current
    recorder (:func:`current_recorder`).

    ``count`` (the envs the call resets) and ``env_count`` (envs in the batch, set on
    the recorder's attributes on its first call) are an argument name, an attribute
    path from one (``"self.done"``), or a callable taking the call's arguments; the
    value counts by :func:`count_of` (a bool mask its True values, env ids their number,
    an int itself); an int ``count`` is that count for every call (a Gymnasium sub-env's
    reset: 1). A count that cannot be read, or is none by that rule, is left out (logged
    once), never raised. It is read before the call's scope opens, so a reader that runs
    traced code (a ``done`` property calling a traced helper) records that code beside
    the call's scope, not inside it. An unknown phase raises ``ValueError`` here, at
    decoration.

    ``within``: record a call only while a scope of that phase is open (a method shared
    by the step and the reset path, recorded on the reset path only); other calls run as
    they are, unrecorded.

    ``parents``: also open the phase's registered parents that are not open, with the
    same count, on the same call: those between it and the innermost open phase when
    that is one of its parents, else every parent below the root phase. For a stack
    whose one call is several levels of the catalog (a Gymnasium sub-env's reset is
    ``reset_done``, its reset call, ``dr_reset`` and ``set_state`` at once).

    Generator, coroutine and async generator functions are refused (``TypeError``, at
    decoration): a call only creates the generator or coroutine, and its work runs later,
    across yields or awaits, where a scope would mis-nest with the other code of the
    thread. Trace the code that consumes it, or a synchronous helper it calls.
    """
    resolved = CATALOG.resolve(phase)
    inside = None if within is None else CATALOG.resolve(within)
    if isinstance(count, bool) or (isinstance(count, int) and not 0 <= count <= MAX_COUNT):
        raise ValueError(f"count must be an argument name, a callable or an int in "
                         f"[0, 2**63), got {count!r}" if isinstance(count, bool) or count < 0 else
                         "count must be an int in [0, 2**63), got one beyond int64")
    fixed = count if isinstance(count, int) else None
    lineage: list[Phase] = []  # its parents, nearest first
    if parents:
        p = resolved
        while p.parent is not None:
            p = CATALOG.resolve(p.parent)
            lineage.append(p)

    def decorate(fn: F) -> F:
        deferred = _deferred_kind(fn)
        if deferred is not None:
            kind, made, across = deferred
            named = (fn.__func__ if isinstance(fn, staticmethod | classmethod)
                     else type(fn).__call__ if kind.startswith("an object") else fn)
            qualname = getattr(named, "__qualname__", None) or repr(named)
            name = f"{getattr(named, '__module__', None) or '?'}.{qualname}"
            raise TypeError(
                f"traced() cannot record {name}: it is {kind}, so a call only creates {made} "
                f"and its work runs after the call returns, across {across}, where a scope "
                "would mis-nest with the other code of the thread; trace the code that "
                "consumes it, or a synchronous helper it calls, instead")
        read_count = None if fixed is not None else argument_reader(
            fn, count, "count")  # type: ignore[arg-type]
        read_envs = argument_reader(fn, env_count, "env_count")
        # a plain positional argument is read in place (the common case: ``env_ids``)
        at = getattr(read_count, "position", -1)
        chains: dict[int, tuple[int, ...]] = {}  # see _with_parents
        leaf = isinstance(fn, types.BuiltinFunctionType)  # an extension's: see call_leaf

        def general(args: tuple[Any, ...], kwargs: dict[str, Any], c: int | None = None
                    ) -> Any:
            """Every case, as the recorder's methods route it (the compiled ``Traced``
            takes the common ones, recording what this records). ``c``: the count, when
            it read it already (a count is read once per call)."""
            rec = _get_current()
            if rec is None:
                epoch = _default_epoch() if _tell_default else 0  # (before the session is read)
                session = _default
                if session is not None and session.aggregator is None:
                    if _tell_default:
                        _remember_default(None, epoch)
                    return fn(*args, **kwargs)  # tracing off, nothing bound: the fast path
                if session is None:
                    session = get_tracing()
                rec = getattr(session._local, "recorder", None)  # thread_recorder(), inline
                if rec is None or session._closed:
                    rec = session.thread_recorder()
                if _tell_default:  # the compiled core takes this thread's next root calls
                    _remember_default(rec if rec.enabled else None, epoch)
            if not rec.enabled:
                return fn(*args, **kwargs)
            if inside is not None:
                stack = rec._stack  # the innermost open scope first: the usual place
                if not (stack and inside.index
                        == rec._records[stack[-1] * RECORD_FIELDS + R_PHASE]) \
                        and not rec.is_open(inside):
                    return fn(*args, **kwargs)  # not on the path it is recorded on
            if c is None:
                c = count_now(args, kwargs)
            if read_envs is not None and ATTR_ENV_COUNT not in rec.attributes:
                try:
                    n = env_count_of(read_envs(args, kwargs))
                    if n >= 0:
                        rec.attributes[ATTR_ENV_COUNT] = n
                except Exception as e:
                    note_once(f"env_count:{resolved.span}", "cannot read the env count of "
                              "%r (%s: %s)", resolved.span, type(e).__name__, e)
            if lineage:
                return _with_parents(rec, lineage, resolved, c, fn, args, kwargs, chains)
            if leaf:
                return rec.call_leaf(resolved, c, fn, args, kwargs)
            return rec.call(resolved, c, fn, args, kwargs)

        def count_now(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
            if read_count is None:
                return NO_COUNT if fixed is None else fixed
            try:
                v = args[at] if 0 <= at < len(args) else read_count(args, kwargs)
            except Exception as e:  # never break the user's call over a count
                note_once(f"count:{resolved.span}", "cannot read the count of %r "
                          "(%s: %s); recorded without one", resolved.span,
                          type(e).__name__, e)
                return NO_COUNT
            if v.__class__ is int and 0 <= v <= MAX_COUNT:
                return v
            if v is None or (v.__class__ is slice and v.start is None and v.stop is None
                             and v.step is None):
                return every_env(args, kwargs)
            return count_of(v)

        def every_env(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
            """The count of None or ``slice(None)`` ("every env", mjlab's and Isaac Lab's
            env_ids): the env count, from the target's ``env_count`` or the recorder's
            attribute; else none (one warning)."""
            n = NO_COUNT
            if read_envs is not None:
                try:
                    n = env_count_of(read_envs(args, kwargs))
                except Exception:
                    n = NO_COUNT
            if n < 0:
                known = getattr(current_recorder(), "attributes", {}).get(ATTR_ENV_COUNT)
                n = known if known.__class__ is int and 0 <= known <= MAX_COUNT else NO_COUNT
            if n < 0:
                note_once(f"all:{resolved.span}", "the count of %r is None or slice(None) "
                          "(every env) but the env count is not known: give the target an "
                          "env_count; recorded without a count", resolved.span)
            return n

        # the count of every call when it is one (else read per call by count_now)
        static = None if read_count is not None else NO_COUNT if fixed is None else fixed
        within = -1 if inside is None else inside.index
        if _rec.COMPILED:  # the common case of each kind in C (Traced); the rest: general
            fast_kind = 2 if lineage else 1 if leaf and inside is not None else 0
            run = _rec._FAST.Traced(kind=fast_kind, fn=fn, general=general, count_now=count_now,
                                    static=static, index=resolved.index, within=within,
                                    envs=read_envs is not None, chains=chains,
                                    count_at=getattr(read_count, "at", -1),
                                    count_path=getattr(read_count, "path", ()))

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return run(args, kwargs)
        else:  # the one Python path: the recorder's methods route and record every case
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return general(args, kwargs)
        functools.update_wrapper(wrapper, fn)
        wrapper.__resettrace_phase__ = resolved  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
