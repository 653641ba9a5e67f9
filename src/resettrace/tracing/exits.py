"""How a process with tracing sessions ends: their spans flushed at normal exit, when a
``multiprocessing`` worker leaves (through ``os._exit``, where ``atexit`` never runs), and on
SIGTERM when no other handler is installed (``SystemExit(143)``, so ``finally`` blocks and
exit hooks run; a second SIGTERM kills); signals held around a critical section
(:func:`holding_signals`), and a SIGTERM left pending in a worker watched for."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from resettrace.tracing import lifecycle

if TYPE_CHECKING:
    from resettrace.tracing.session import Tracing

log = logging.getLogger("resettrace")

# -- process exit ---------------------------------------------------------------------------
_EXPORTING: weakref.WeakSet[Tracing] = weakref.WeakSet()
_hooks_lock = threading.Lock()
_finalize_pid: int | None = None
_sigterm_installed = False


class HeldSignals:
    """Signals that arrived while :func:`holding_signals` held them (first of each kind)."""

    def __init__(self) -> None:
        self.received: list[int] = []

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None


#: what the scheduler, the pool or the user sends to stop a process
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def holding_signals(signums: tuple[int, ...] = STOP_SIGNALS, *, redeliver: bool = False,
                    already: tuple[int, ...] = ()) -> Iterator[HeldSignals]:
    """Let a bounded piece of work (a final flush, writing the run's files) finish when a
    stop signal arrives: the first of each kind is noted, a second one ends the process
    at once (default action), as does the first of those in ``already`` (signals that
    asked for the stop before). Afterwards the handlers in place before come back; with
    ``redeliver``, a noted signal is then raised again for a handler of the user's (the
    default action, or resettrace's own, would only end a process that is ending).
    Only the main thread can set handlers: elsewhere this holds nothing."""
    held = HeldSignals()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous: dict[int, Any] = {}

    def note(signum: int, frame: Any) -> None:
        if signum in held.received or signum in already:  # the second one: at once
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        held.received.append(signum)

    try:
        for signum in signums:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored stays ignored
                previous[signum] = signal.signal(signum, note)
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if redeliver:
            for signum in held.received:
                handler = previous.get(signum)
                if callable(handler) and handler not in (_on_sigterm,
                                                         signal.default_int_handler):
                    signal.raise_signal(signum)


def shutdown_all() -> None:
    """Flush and stop every span-exporting session of this process (bounded). Runs at
    exit: a SIGTERM or SIGINT that arrives meanwhile (a pool's ``terminate()`` lands just
    as its workers leave) waits until the flush is done, within the shutdown timeout."""
    sessions = list(_EXPORTING)
    if not sessions:
        return
    with holding_signals(redeliver=True):
        for session in sessions:
            try:
                session.shutdown()
            except Exception:  # exiting: report, never raise
                log.exception("resettrace: shutdown failed")


lifecycle.at_exit("spans", shutdown_all)


def install_sigterm_exit() -> bool:
    """End this process on SIGTERM through ``SystemExit(143)`` (so ``finally`` blocks and
    exit hooks run: flushes, summaries, run records), when SIGTERM has no handler yet and
    this is the main thread. True when installed (now or before)."""
    global _sigterm_installed
    with _hooks_lock:
        if _sigterm_installed:
            return True
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
            return False
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True
        return True


def _on_sigterm(signum: int, frame: Any) -> None:
    # Leave through SystemExit rather than flushing here: the signal may land while the
    # training thread holds an exporter lock. The stack unwinds (releasing it), then the
    # exit hooks flush. A second SIGTERM kills at once. A signal that lands inside a call
    # that must not be cut in two (a trace handed to the sinks, the export queue's
    # bookkeeping) is taken again once that call is done.
    if lifecycle.inside_uncut(frame):
        since = _AGAIN["since"] = _AGAIN["since"] or time.monotonic()
        if time.monotonic() - since < _AGAIN_GIVE_UP_S and _take_again_later(signum):
            return
        # put off for seconds (a recording signal handler and a full pipe can keep the
        # main thread inside hand-overs at every try): a process that will not end is
        # worse than the trace under way, which may be left uncounted
        log.warning("resettrace: SIGTERM taken inside a trace hand-over after %.1f s of "
                    "waiting for one to end; the spans it held may be left uncounted",
                    time.monotonic() - since)
    _AGAIN["delay_s"] = _AGAIN_FIRST_S
    _AGAIN["since"] = 0.0
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _leaving(frame):
        # A multiprocessing worker already leaving (a pool's terminate() comes just as its
        # workers read their sentinel): its exit finalizers run in one loop that stops at
        # anything but an Exception, so a SystemExit now would skip the span flush and
        # the run record. It is leaving anyway.
        return
    raise SystemExit(128 + signum)


#: a SIGTERM put off (:func:`_take_again_later`) comes back after this, then twice as long
#: each time it is put off again, up to the last
_AGAIN_FIRST_S = 0.001
_AGAIN_LAST_S = 0.05
#: a SIGTERM put off this long is taken even inside a hand-over
_AGAIN_GIVE_UP_S = 2.0
_AGAIN: dict[str, Any] = {"pending": False, "delay_s": _AGAIN_FIRST_S, "since": 0.0}


def _take_again_later(signum: int) -> bool:
    """Send ``signum`` to this process again in a moment (once, however many arrive
    meanwhile): the handler stays in place and runs then. False when no thread can start
    (the interpreter is shutting down): the signal is taken now."""
    if _AGAIN["pending"]:
        return True
    delay = _AGAIN["delay_s"]
    _AGAIN["delay_s"] = min(_AGAIN_LAST_S, 2 * delay)

    def again() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # they go to the main thread
        time.sleep(delay)
        _AGAIN["pending"] = False
        os.kill(os.getpid(), signum)

    _AGAIN["pending"] = True
    try:
        threading.Thread(target=again, daemon=True, name="resettrace-sigterm-again").start()
    except RuntimeError:
        _AGAIN["pending"] = False
        return False
    return True


def _leaving(frame: Any) -> bool:
    """Whether this process runs multiprocessing's exit function (the frame a signal
    interrupted is inside it, from its first line: its own flag is set a few lines in)."""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return False
    if util.is_exiting():
        return True
    code = getattr(getattr(util, "_exit_function", None), "__code__", None)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


#: how long a SIGTERM's handler may stay pending before the main thread is woken
SIGTERM_NUDGE_S = 0.5
#: the signal that wakes it: a real-time one, given a handler that does nothing (the
#: wake-up only makes the main thread run the handlers pending, if any)
NUDGE_SIGNAL = getattr(signal, "SIGRTMAX", None)
#: the watcher of this process: its pid, and the socket pair of the wakeup fd it reads
_WATCH: dict[str, Any] = {"pid": None, "sockets": ()}


def watch_sigterm() -> bool:
    """In a multiprocessing worker, make sure a SIGTERM reaches :func:`_on_sigterm`.

    CPython runs a signal's Python handler on the main thread when it next runs Python
    code; a main thread blocked in a system call is woken by the signal (EINTR) and runs it
    then. A SIGTERM that lands just before the thread blocks is left pending while it
    sleeps: a pool worker waiting for its task queue's lock when ``terminate()``
    (``with Pool(...)``'s exit) signals it then never leaves, and the pool waits for it for
    ever (about one pool exit in a hundred with any Python SIGTERM handler, resettrace or
    not; seen with the handler tripped and the main thread in ``sem_wait``). A daemon
    thread reads the signal numbers CPython writes to the wakeup fd: when resettrace's
    handler has still not run :data:`SIGTERM_NUDGE_S` after a SIGTERM, it wakes the main
    thread with :data:`NUDGE_SIGNAL`, whose handler does nothing, and the pending SIGTERM
    handler runs. (A wake-up that finds nothing pending, say for a byte a child wrote
    between its fork and its exec, does nothing.) Nothing is installed when the wakeup fd or
    the wake-up signal is someone else's (asyncio's, the user's), outside a worker, off the
    main thread, or when SIGTERM has another handler. True when watching."""
    import multiprocessing

    if _WATCH["pid"] == os.getpid():
        return True
    if (NUDGE_SIGNAL is None or threading.current_thread() is not threading.main_thread()
            or multiprocessing.parent_process() is None
            or signal.getsignal(signal.SIGTERM) is not _on_sigterm
            or signal.getsignal(NUDGE_SIGNAL) not in (signal.SIG_DFL, _woken)):
        return False
    r, w = socket.socketpair()
    w.setblocking(False)
    try:
        old = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):
        old = None
    if old != -1:  # not ours to take
        if old is not None:
            signal.set_wakeup_fd(old)
        r.close()
        w.close()
        return False
    signal.signal(NUDGE_SIGNAL, _woken)
    _WATCH.update(pid=os.getpid(), sockets=(r, w))
    threading.Thread(target=_watch, args=(r, threading.main_thread().ident, NUDGE_SIGNAL),
                     daemon=True, name="resettrace-sigterm").start()
    return True


def _woken(signum: int, frame: Any) -> None:
    """The main thread was woken to run the handlers pending: nothing else to do."""


def _watch(r: socket.socket, main: int, nudge: int) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # they go to the main thread
    while True:
        try:
            data = r.recv(512)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM not in data:
            continue
        for _ in range(10):
            time.sleep(SIGTERM_NUDGE_S)
            # still resettrace's handler: it has not run (it puts the default action back)
            if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
                break
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(main, nudge)


def _unwatch_after_fork() -> None:
    """A forked child must not write its signals to its parent's watcher."""
    if _WATCH["pid"] is not None and _WATCH["pid"] != os.getpid():
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for sock in _WATCH["sockets"]:
            sock.close()
        _WATCH.update(pid=None, sockets=())


lifecycle.at_fork(_unwatch_after_fork)


def _forget_again_after_fork() -> None:
    """A signal put off in the parent is the parent's: its sending thread is not here."""
    _AGAIN.update(pending=False, delay_s=_AGAIN_FIRST_S)


lifecycle.at_fork(_forget_again_after_fork)


def _arm_worker_exit() -> None:
    """In a multiprocessing worker (it leaves through ``os._exit``, where ``atexit`` never
    runs): the exit stages run from multiprocessing's own exit path
    (:func:`~resettrace.tracing.lifecycle.arm_worker_exit`), and its SIGTERM is watched
    (once per process)."""
    global _finalize_pid
    pid = os.getpid()
    if _finalize_pid != pid and lifecycle.arm_worker_exit():
        _finalize_pid = pid
        watch_sigterm()


def _armed_after_fork(session: Tracing) -> None:
    # runs in a forked multiprocessing worker, after multiprocessing cleared the finalizers
    _arm_worker_exit()


def register_exit_hooks(session: Tracing) -> None:
    """``session`` is flushed at exit (the ``spans`` stage of
    :data:`~resettrace.tracing.lifecycle.EXIT_STAGES`), in this process and in a
    multiprocessing worker that inherits it or makes it."""
    import multiprocessing
    from multiprocessing import util

    _EXPORTING.add(session)
    with _hooks_lock:
        _arm_worker_exit()
        util.register_after_fork(session, _armed_after_fork)
    if session.config.handle_sigterm:
        install_sigterm_exit()
        if multiprocessing.parent_process() is not None:
            # a spawned worker: its handler is only installed now, and the watcher needs it
            # (_arm_worker_exit above found none; a forked one inherited it)
            watch_sigterm()
