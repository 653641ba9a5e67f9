"""Every file resettrace writes opens here: one rule for all of its output paths.

Span files (``file:``, ``perfetto:``, ``otlp-json:``, ``jaeger-json:``), ``timing.json`` and
``timing.csv``, benchmark ``--json`` files, ``resettrace merge -o``, ``resettrace run
--stats-json``, the pytest plugin's ``--resettrace-json``, ``report.html`` and the worker logs
of ``bench collector --workers`` all go through :func:`open_output` (files written as they
grow) or :func:`write_output` (files written whole: a temporary file, then ``os.replace``).
Training jobs often run as root, so a path given to resettrace must never let it write
somewhere else or destroy a file it did not write:

1. A symbolic link at the path (its last component) is never followed: the file is opened
   with ``O_NOFOLLOW`` and checked with ``fstat`` on the opened descriptor, so the check
   cannot race the open. A symbolic link there is refused: :class:`OutputRefused`, whose
   message names the path and says it is a symbolic link. (Links among the parent folders
   are the caller's choice and are followed.)
2. An existing path that is not a regular file (a folder, FIFO, device or socket) is
   refused likewise, and never opened for writing when ``lstat`` already shows it.
3. An existing regular file is replaced only when it is empty or is recognisably a
   resettrace output of the same kind (:class:`OutputKind`: a cheap signature read from
   its first 64 KiB). Any other file is left as it is and resettrace writes beside it,
   ``NAME.1.SUFFIX`` (the first of ``NAME.N.SUFFIX`` that is free or resettrace's own of the
   same kind, itself checked by these rules), and logs a warning naming both. The path
   actually written is returned, so callers report the real file.
4. :func:`write_output` creates its temporary file with ``O_EXCL | O_NOFOLLOW`` (a link or
   file planted at the temporary name is neither followed nor removed: another name is
   taken) and checks the final path by the rules above just before ``os.replace`` (which
   replaces a directory entry and never follows a link).

Two jobs on one path: a command claims the files it will write when it starts
(:func:`claim_output`: what is there now). When it writes one (:func:`write_output`), the
check and the ``os.replace`` run under a short ``flock`` of the folder, which every
resettrace writer takes, and a file that another process has written at the path since this
one claimed it (another job that overlapped this one) is left as it is: this one writes
``NAME.pPID.SUFFIX`` beside it (by the same rules) and logs one warning naming both. Its own
earlier file (a rerun after the first job ended, or this job's own earlier write) is
replaced in place. A path not claimed (a library call) is written by the rules above.

Span files are also held by one process (``lock=True``: an exclusive ``flock``): when another
live process holds the path, this one writes ``NAME.pPID.SUFFIX`` beside it (by the same
rules) and logs a warning naming both, so that no process truncates or interleaves
another's spans. A tracing session opens (and so locks) its span files when it is set up and
keeps them until it shuts down (:mod:`resettrace.tracing.export.parent`).

:class:`OutputRefused` is an ``OSError``: span exporters count the spans of a refused file as
not delivered (the reason is logged once), and the CLI prints its message as one line and
exits 2. This module uses the standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

#: the header row of timing.csv (:func:`resettrace.tables.write_csv`), by which a file there
#: is recognised as resettrace's
CSV_COLUMNS = ("key", "count", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "total_ms",
               "share_of_parent")

__all__ = ["OutputKind", "OutputRefused", "open_output", "write_output", "output_path",
           "claim_output", "release_claims",
           "SPANS_JSONL", "PERFETTO", "OTLP_JSON", "JAEGER_JSON", "JSON", "CSV", "REPORT_HTML",
           "WORKER_LOG", "SPAN_KINDS", "JSON_MARKER", "CSV_COLUMNS", "worker_log_header",
           "expand_path"]

#: bytes read from an existing file to recognise it
HEAD_BYTES = 1 << 16
#: ``NAME.N.SUFFIX`` names tried beside a file that is not resettrace's
MAX_BESIDE = 100


class OutputRefused(OSError):
    """resettrace will not write this path (a symbolic link, or not a regular file)."""


@dataclass(frozen=True)
class OutputKind:
    """One kind of output: what it is called, and how its first bytes are recognised."""

    #: what the file is, in messages ("JSON-lines span file")
    name: str
    #: True when ``head`` (the first :data:`HEAD_BYTES` of a non-empty file) is the start
    #: of a file resettrace writes of this kind
    recognise: Callable[[bytes], bool]


def _first_line(head: bytes) -> bytes | None:
    line, newline, _ = head.partition(b"\n")
    return line if newline else None


def _is_span_line(head: bytes) -> bool:
    # the first line of resettrace.tracing.export.exporters.JsonLinesSpanExporter's file
    line = _first_line(head)
    if line is None:
        return False
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and {"name", "trace_id", "span_id", "parent_id", "start_ns",
                                      "end_ns"} <= obj.keys()


def _is_perfetto(head: bytes) -> bool:
    # ChromeTraceSpanExporter's header: otherData names the producer first
    return head.startswith(b'{"displayTimeUnit":"ms","otherData":{"producer":"resettrace"')


def _is_otlp_json(head: bytes) -> bool:
    # one ExportTraceServiceRequest per line; the spans' instrumentation scope is resettrace's
    return head.startswith(b'{"resourceSpans":[') and b'"scope":{"name":"resettrace.' in head


def _is_jaeger_json(head: bytes) -> bool:
    # JaegerJsonSpanExporter's layout: '{"data":[' and a newline, then no entry yet or
    # entries whose tags (span attributes, the process's worker rank) are resettrace's
    if not head.startswith(b'{"data":[\n'):
        return False
    rest = head[len(b'{"data":[\n'):]
    return rest.startswith(b"]}") or (rest.startswith(b'{"traceID":"')
                                      and b'"key":"resettrace.' in head)


#: the first key of every JSON file resettrace writes (value: its version)
JSON_MARKER = "resettrace"
# the first key of each JSON file written before JSON_MARKER existed (timing.json, bench
# and compare / fit / merge results, run stats, pytest stats), in write_json's layout
_EARLIER_JSON_KEYS = ("config", "pid", "tests", "base", "runs", "sources", "source")


def _is_json(head: bytes) -> bool:
    keys = (JSON_MARKER,) + _EARLIER_JSON_KEYS
    return any(head.startswith(b'{\n "' + k.encode() + b'": ') for k in keys) or \
        head.startswith(b'{"' + JSON_MARKER.encode() + b'":"')  # write_json(compact=True)


def _is_csv(head: bytes) -> bool:
    # the header row resettrace.tables.write_csv writes
    line = _first_line(head)
    header = ",".join(CSV_COLUMNS)
    return line is not None and line.rstrip(b"\r") == header.encode()


def _is_report(head: bytes) -> bool:
    # resettrace.report.build_report's first bytes
    return head.startswith(b'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                           b"<title>resettrace report: ")


_LOG_PREFIX = "resettrace worker log: "


def worker_log_header(rank: int, command: str) -> bytes:
    """The first line of a ``bench collector --workers`` log file (its signature)."""
    return f"{_LOG_PREFIX}rank {rank}: {command}\n".encode()


def _is_worker_log(head: bytes) -> bool:
    return head.startswith(_LOG_PREFIX.encode())


SPANS_JSONL = OutputKind("JSON-lines span file", _is_span_line)
PERFETTO = OutputKind("Chrome trace (Perfetto) span file", _is_perfetto)
OTLP_JSON = OutputKind("OTLP-JSON span file", _is_otlp_json)
JAEGER_JSON = OutputKind("Jaeger UI JSON span file", _is_jaeger_json)
JSON = OutputKind("resettrace JSON file", _is_json)
CSV = OutputKind("timing CSV file", _is_csv)
REPORT_HTML = OutputKind("resettrace HTML report", _is_report)
WORKER_LOG = OutputKind("worker log", _is_worker_log)
#: the output kind of each span file exporter (``KIND:PATH`` of ``RESETTRACE_EXPORTER``)
SPAN_KINDS = {"file": SPANS_JSONL, "perfetto": PERFETTO, "otlp-json": OTLP_JSON,
              "jaeger-json": JAEGER_JSON}


# -- the rules --------------------------------------------------------------------------------

def _refuse_type(path: Path, mode: int) -> None:
    """Raise :class:`OutputRefused` unless ``mode`` is a regular file's."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISLNK(mode):
        what = "a symbolic link (resettrace never writes through one)"
    elif stat.S_ISDIR(mode):
        what = "a directory"
    elif stat.S_ISFIFO(mode):
        what = "a FIFO, not a regular file"
    elif stat.S_ISSOCK(mode):
        what = "a socket, not a regular file"
    else:
        what = "a device, not a regular file"
    raise OutputRefused(f"cannot write {path}: it is {what}; choose another path")


def _lstat_mode(path: Path) -> int | None:
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None


def _open_checked(path: Path, flags: int) -> int:
    """``path`` opened with ``O_NOFOLLOW`` (and ``flags``), a regular file, or raise."""
    mode = _lstat_mode(path)
    if mode is not None:  # the usual case is said before anything is opened
        _refuse_type(path, mode)
    try:
        # O_NONBLOCK: a FIFO swapped in after the lstat must not block the open
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EMLINK):
            mode = _lstat_mode(path)
            if mode is not None:
                _refuse_type(path, mode)
        raise
    try:
        _refuse_type(path, os.fstat(fd).st_mode)  # what was opened, not what the name says now
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _own(fd: int, kind: OutputKind) -> bool:
    """The open regular file is empty or resettrace's own of ``kind``."""
    if os.fstat(fd).st_size == 0:
        return True
    return kind.recognise(os.pread(fd, HEAD_BYTES, 0))


def _names(path: Path) -> Iterator[Path]:
    """``path``, then ``NAME.1.SUFFIX``, ``NAME.2.SUFFIX``, ... beside it."""
    yield path
    for n in range(1, MAX_BESIDE + 1):
        yield path.with_name(f"{path.stem}.{n}{path.suffix}")


def _beside(path: Path, chosen: Path, kind: OutputKind) -> None:
    if chosen != path:
        log.warning("resettrace: %s is not a %s: left as it is; writing %s beside it", path,
                    kind.name, chosen)


def _no_name(path: Path, kind: OutputKind) -> OutputRefused:
    return OutputRefused(f"cannot write {path}: it is not a {kind.name}, nor are "
                         f"{MAX_BESIDE} names beside it; remove them or choose another path")


def expand_path(path: str, *, pid: int, rank: int) -> str:
    """A span file path with ``{pid}`` and ``{rank}`` replaced."""
    return path.replace("{pid}", str(pid)).replace("{rank}", str(rank))


def output_path(path: str | os.PathLike[str], kind: OutputKind) -> Path:
    """The file a write of ``kind`` to ``path`` goes to now, by the rules of the module
    docstring, without writing anything (:class:`OutputRefused` when it would be refused)."""
    return _choose(Path(path), kind)[0]


#: a file's identity: device, inode, size, modification and change times (ns); a write by
#: ``os.replace`` or in place changes it
_Identity = tuple[int, int, int, int, int]


def _identity(st: os.stat_result) -> _Identity:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _choose(path: Path, kind: OutputKind) -> tuple[Path, _Identity | None]:
    """:func:`output_path`, with the identity of the file found there (None: no file)."""
    for name in _names(path):
        if _lstat_mode(name) is None:
            return name, None
        fd = _open_checked(name, os.O_RDONLY)
        try:
            if _own(fd, kind):
                return name, _identity(os.fstat(fd))
        finally:
            os.close(fd)
    raise _no_name(path, kind)


@dataclass
class _Claim:
    """What a process saw at a path it claimed, and where its writes go."""

    pid: int
    #: the identity of each file this process found or wrote at the path or beside it (in
    #: its folder), by file name
    seen: dict[str, _Identity | None]
    #: ``NAME.pPID.SUFFIX``, once another job's file was found at the path
    moved: Path | None = None


#: the claims of this process, by path (its folder resolved)
_CLAIMS: dict[str, _Claim] = {}


def _claim_key(path: Path) -> str:
    # links among the parent folders are followed (the caller's choice), the name is not
    return os.path.join(os.path.realpath(path.parent), path.name)


def claim_output(path: str | os.PathLike[str], kind: OutputKind) -> Path:
    """Check ``path`` as :func:`output_path` does (the file a write goes to now, or
    :class:`OutputRefused`), and claim it for this process's job: its later
    :func:`write_output` calls to ``path`` replace the file only if no other process has
    written it meanwhile (module docstring). Call it when the job starts (a second call
    for the same path keeps the first)."""
    path = Path(path)
    target, ident = _choose(path, kind)
    key = _claim_key(path)
    claim = _CLAIMS.get(key)
    if claim is None or claim.pid != os.getpid():  # claimed once a job: at its start
        _CLAIMS[key] = _Claim(os.getpid(), {target.name: ident})
    return target


def release_claims() -> None:
    """Forget this process's claims (its job is over; a later write is a new job's)."""
    _CLAIMS.clear()


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` of ``folder`` (every resettrace writer's check and
    replace of a file there run under it, so two cannot interleave); without it where the
    file system cannot lock (the check alone then). A process forked while one of its
    threads holds it would keep a copy of the lock for its life: the one writer on a
    thread of its own, the run record's snapshots, never writes across a fork
    (:mod:`resettrace.record`)."""
    import fcntl

    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        fd = -1
    try:
        if fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)  # held for a check and a rename: short
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


def _target(path: Path, kind: OutputKind) -> tuple[Path, _Claim | None]:
    """Where a write to ``path`` goes now: :func:`output_path`, unless this process claimed
    ``path`` and another process has written the file there since (then
    ``NAME.pPID.SUFFIX``, with one warning). Run under :func:`_folder_locked`."""
    claim = _CLAIMS.get(_claim_key(path))
    if claim is not None and claim.pid != os.getpid():
        claim = None  # inherited over a fork: the parent's job, not this process's
    if claim is not None and claim.moved is not None:
        return _choose(claim.moved, kind)[0], claim
    target, ident = _choose(path, kind)
    if claim is None or claim.seen.get(target.name) == ident:
        _beside(path, target, kind)
        return target, claim
    claim.moved = path.with_name(f"{path.stem}.p{os.getpid()}{path.suffix}")
    mine = _choose(claim.moved, kind)[0]
    log.warning("resettrace: %s was written by another job while this one ran: left as it "
                "is; this one writes %s instead", target, mine)
    return mine, claim


def open_output(path: str | os.PathLike[str], kind: OutputKind, *, lock: bool = False,
                pid: int | None = None) -> tuple[Path, IO[bytes]]:
    """Open the output file for ``path`` empty, for writing (and reading back), by the
    rules of the module docstring: the path opened (``path`` or one beside it) and the
    unbuffered file, the caller's to close.

    ``lock``: hold the file alone (an exclusive ``flock``, until it is closed); when another
    process holds it, ``NAME.pPID.SUFFIX`` is opened instead. ``pid``: the process the file
    is for (the training process, for the export child); default this one.
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in _names(path):
        # opened without truncating (it may be another process's, or not resettrace's)
        # and without O_APPEND (the span exporters rewrite their tail in place)
        fd = _open_checked(name, os.O_RDWR | os.O_CREAT)
        f = open(fd, "r+b", buffering=0)  # noqa: SIM115 - returned to the caller
        try:
            if lock:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    mine = name.with_name(f"{name.stem}.p{os.getpid() if pid is None else pid}"
                                          f"{name.suffix}")
                    if mine == name:
                        raise
                    f.close()
                    log.warning("resettrace: %s is being written by another process; this "
                                "one writes %s instead", name, mine)
                    return open_output(mine, kind, lock=lock, pid=pid)
            if _own(fd, kind):
                f.truncate(0)
                _beside(path, name, kind)
                return name, f
        except BaseException:
            f.close()
            raise
        f.close()  # not resettrace's: left as it is, the next name is tried
    raise _no_name(path, kind)


def write_output(path: str | os.PathLike[str], kind: OutputKind, data: bytes) -> Path:
    """Write ``data`` as the whole output file for ``path``, atomically (a temporary file
    beside it, then ``os.replace``), by the rules of the module docstring: the path
    written (``path`` or one beside it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, fd = _temporary(path)
    try:
        with open(fd, "wb") as f:
            f.write(data)
        with _folder_locked(path.parent):
            target, claim = _target(path, kind)  # checked last, just before the replace
            os.replace(tmp, target)
            if claim is not None:  # this job's own file now: a later write replaces it
                claim.seen[target.name] = _identity(os.lstat(target))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # created by this call (O_EXCL): never someone else's
        raise
    return target


def _temporary(path: Path) -> tuple[Path, int]:
    """A new temporary file beside ``path``: ``NAME.tmp``, or ``NAME.RANDOM.tmp`` when that
    name is taken (by a planted link, say: O_EXCL never follows nor replaces it)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    name = path.with_name(path.name + ".tmp")
    for _ in range(100):
        try:
            return name, os.open(name, flags, 0o666)
        except FileExistsError:
            name = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))
