"""Who this process is in its job, from what launched it.

A job's records are told apart by their ``identity`` (:func:`resettrace.record.identity_of`),
taken from the launcher, first match wins:

==============================  ==========================  ===============================
launched by                     identity                    world size
==============================  ==========================  ===============================
torch.distributed (its default  ``rank get_rank()``         ``get_world_size()``
group, once initialized)
Ray (an actor's process, a      ``ray actor <id>``, an      -
task's)                         RLlib EnvRunner's ``rllib
                                worker <worker_index>``,
                                ``ray worker <id>``
``RESETTRACE_WORKER_RANK``      ``rank N``                  ``WORLD_SIZE`` if set
torchrun / torch.distributed    ``rank RANK``               ``WORLD_SIZE``
(``RANK``)
SLURM (``SLURM_PROCID``)        ``rank SLURM_PROCID``       ``SLURM_NTASKS``
a multiprocessing worker        ``rank R`` (parent rank x   -
(fork, forkserver, spawn)       1000 + its number); forked
                                by a Ray actor: ``ray actor
                                <id>, rank R``
anything else                   ``rank 0``                  -
==============================  ==========================  ===============================

The rank is :func:`resettrace.launcher.process_rank` (the span attribute
``resettrace.worker.rank``, ``{rank}`` in paths); a Ray actor's record has its RLlib worker
index as its rank, else none (its actor id tells it apart).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resettrace.envvars import INT_MAX, MAX_NUMBER_TEXT, Number, shown, warn_env

ENV_WORKER_RANK = "RESETTRACE_WORKER_RANK"
#: the variables that give a process its rank, the first set wins
ENV_RANK = (ENV_WORKER_RANK, "RANK", "SLURM_PROCID")
#: what a process publishes of its rank for the multiprocessing workers it starts:
#: ``RANK:IDENTITY:GIVEN`` (its rank, its multiprocessing identity as dotted numbers, and
#: the rank text it was given, if any)
ENV_PARENT_RANK = "RESETTRACE_PARENT_RANK"
#: a rank's range (``Config.worker_rank``'s, :data:`resettrace.config.NUMBERS`)
WORKER_RANK = Number(ENV_RANK, int, 0, INT_MAX)

log = logging.getLogger("resettrace.config")  # (the rank rule's lines, as before)

__all__ = ["Identity", "identity", "parent_pid", "process_rank", "remember_launcher",
           "WORKER_RANK_BASE"]


@dataclass(frozen=True)
class Identity:
    """A process's place in its job."""

    identity: str
    #: ``resettrace``, ``torchrun``, ``slurm``, ``ray``, ``rllib``, ``multiprocessing``;
    #: None: a main process nothing named
    launcher: str | None
    rank: int | None
    world_size: int | None = None


#: the launcher each rank variable belongs to
_LAUNCHERS = {ENV_WORKER_RANK: "resettrace", "RANK": "torchrun", "SLURM_PROCID": "slurm"}
_WORLD = {"resettrace": "WORLD_SIZE", "torchrun": "WORLD_SIZE", "slurm": "SLURM_NTASKS"}


def _count(raw: str | None) -> int | None:
    if raw is None or not raw.strip():
        return None
    value = WORKER_RANK.parse(raw.strip())[0]
    return value if isinstance(value, int) and value > 0 else None


#: this process's torch.distributed rank, once found (by its exit the group may be gone)
_TORCH_FOUND: dict[int, Identity] = {}


def _remembered(found: dict[int, Identity], look: Any) -> Identity | None:
    """What ``look()`` finds, kept for this process's life once found (by pid)."""
    known = found.get(os.getpid())
    if known is not None:
        return known
    now = look()
    if now is not None:
        found.clear()  # (a forked child's inherited entry is another pid's)
        found[os.getpid()] = now
    return now


#: the Ray actor this process was found to be, by pid: an actor's process stays that actor
#: until it exits, and by the time its exit record is written (an actor ended gracefully:
#: ``__ray_terminate__``, ``exit_actor``) Ray is shut down in it and no longer says who it was
_RAY_FOUND: dict[int, Identity] = {}


def _ray() -> Identity | None:
    """A Ray actor's identity, when this process is one (Ray already imported: never
    imported here); once found, kept for the process's life."""
    return _remembered(_RAY_FOUND, _ray_now)


def remember_launcher() -> None:
    """Find this process's Ray or torch.distributed identity now, if it has one (when its
    session starts, and at each snapshot: by its exit Ray may be shut down in it, its
    process group destroyed); the rank rule is not run here (a worker may still set its
    own rank)."""
    _remembered(_TORCH_FOUND, _torch_distributed)
    _ray()


def _ray_now() -> Identity | None:
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        worker = getattr(ctx, "worker", None)
        actor = ctx.get_actor_id()
        if not actor:
            if getattr(worker, "mode", None) != getattr(ray, "WORKER_MODE", 1):
                return None  # the driver
            return Identity(f"ray worker {ctx.get_worker_id()[:16]}", "ray", None)
        index = None
        for instance in (getattr(worker, "actors", None) or {}).values():
            value = getattr(instance, "worker_index", None)  # an RLlib EnvRunner
            if isinstance(value, int) and not isinstance(value, bool):
                index = value
        if index is not None:
            return Identity(f"rllib worker {index}", "rllib", index)
        return Identity(f"ray actor {actor[:16]}", "ray", None)
    except Exception:  # noqa: BLE001 - Ray's internals: never break a record over them
        return None


def _torch_distributed() -> Identity | None:
    """The rank and world size of this process's torch.distributed default group, when it
    has one (torch already imported: never imported here): ``init_process_group`` given
    them in code (``torch.multiprocessing.spawn``) sets no variable."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        rank, world = int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - a group torn down meanwhile: the other rules
        return None
    return Identity(f"rank {rank}", "torch.distributed", rank, world)


def identity(rank: int, environ: Mapping[str, str] | None = None) -> Identity:
    """This process's identity (the module docstring's rules); ``rank`` is its resolved
    rank (:func:`resettrace.launcher.process_rank`)."""
    env = os.environ if environ is None else environ
    group = _remembered(_TORCH_FOUND, _torch_distributed)
    if group is not None:
        return group
    mp = sys.modules.get("multiprocessing")
    worker = bool(mp is not None and getattr(mp.current_process(), "_identity", ()))
    found = _ray()
    if found is not None:
        if not worker:
            return found
        # a worker forked by an actor (an AsyncVectorEnv's): Ray's state came with the fork
        return Identity(f"{found.identity}, rank {rank}", "multiprocessing", rank)
    for name in ENV_RANK:
        raw = env.get(name, "").strip()
        if raw and WORKER_RANK.parse(raw)[0] == rank and not worker:
            launcher = _LAUNCHERS[name]
            world = _count(env.get(_WORLD[launcher]))
            return Identity(f"rank {rank}", launcher, rank, world)
    if worker:
        return Identity(f"rank {rank}", "multiprocessing", rank)
    return Identity(f"rank {rank}", None, rank)


def parent_pid() -> int:
    """The pid of the process that started this one: a multiprocessing worker's parent
    (a forkserver's worker too, whose operating-system parent is the fork server), else
    the operating system's parent."""
    mp = sys.modules.get("multiprocessing")
    parent = mp.parent_process() if mp is not None else None
    return int(parent.pid) if parent is not None and parent.pid else os.getppid()


# -- the rank rule ------------------------------------------------------------------------------
#: a multiprocessing worker's rank: parent rank x this + its worker number
WORKER_RANK_BASE = 1000


def _given_text(env: Mapping[str, str]) -> str:
    for name in ENV_RANK:
        raw = env.get(name, "").strip()
        if raw:
            return f"{name}={raw}"
    return ""


def _identity() -> tuple[int, ...]:
    """This process's multiprocessing identity: () for a main process, (n,) for the n-th
    worker its parent started, (n, m) for a worker of that worker, ..."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return ()
    return tuple(getattr(mp.current_process(), "_identity", ()) or ())


def _start_text() -> str:
    """The rank text this process started with (what its parent handed down): the
    environment at the fork (when resettrace was loaded before it), else the one the
    process was started with (``/proc/self/environ``), else the current one."""
    if _AT_FORK[0] == os.getpid():
        return _AT_FORK[1]
    try:
        with open("/proc/self/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return _given_text(os.environ)
    start = {}
    for item in items:
        name, sep, value = item.partition(b"=")
        if sep:
            start[name.decode(errors="replace")] = value.decode(errors="replace")
    return _given_text(start)


_AT_FORK: list[Any] = [None, ""]  # (pid, rank text) of a forked process, at the fork


def _remember_at_fork() -> None:
    _AT_FORK[:] = [os.getpid(), _given_text(os.environ)]


os.register_at_fork(after_in_child=_remember_at_fork)


def env_worker_rank(env: Mapping[str, str] | None = None) -> int | None:
    """``RESETTRACE_WORKER_RANK``, else ``RANK`` (torchrun, torch.distributed), else
    ``SLURM_PROCID`` (srun), when one holds a valid rank (0 - 2**31-1); else None. A
    malformed ``RESETTRACE_WORKER_RANK`` is a warning naming the rank used instead; ``RANK``
    and ``SLURM_PROCID`` belong to the launcher and are used only when valid."""
    env = os.environ if env is None else env
    ranks = {}
    for name in ENV_RANK:
        raw = env.get(name, "").strip()
        if raw:
            ranks[name] = WORKER_RANK.parse(raw)[0]
    rank = ranks.get(ENV_WORKER_RANK)
    if rank is not None:
        return rank
    launcher = next((n for n in ENV_RANK[1:] if ranks.get(n) is not None), None)
    fallback = None if launcher is None else ranks[launcher]
    if ENV_WORKER_RANK in ranks:
        warn_env(env, "%s=%s is not a rank (an integer in 0 - %d); using %s", ENV_WORKER_RANK,
                 shown(env[ENV_WORKER_RANK]), INT_MAX,
                 f"{launcher}={fallback}" if launcher is not None else "the default 0")
    return fallback


def process_rank(env: Mapping[str, str] | None = None, *, publish: bool | None = None) -> int:
    """This process's rank, by one rule:

    1. a rank given to it (``RESETTRACE_WORKER_RANK``, else ``RANK``): a main process's, or
       a multiprocessing worker's when it is not the one the worker started with (a worker
       inherits its parent's environment: setting the variable in the worker gives it);
    2. a multiprocessing worker (fork, forkserver, spawn; ``concurrent.futures``, a
       Gymnasium ``AsyncVectorEnv``) with no rank of its own: parent rank x 1000 + its
       worker number (1, 2, 3, ... in the order the parent started workers; a worker of a
       worker: (parent rank x 1000 + n) x 1000 + m). The parent's rank is the one it
       published in ``RESETTRACE_PARENT_RANK`` when it resolved its own, else the rank it
       was given, else 0;
    3. else 0.

    ``publish`` (default: when ``env`` is this process's environment) puts the result in
    ``RESETTRACE_PARENT_RANK`` for the workers this process starts.
    """
    own = env is None
    env = os.environ if env is None else env
    given = env_worker_rank(env)
    text = _given_text(env)
    identity = _identity() if own else ()
    rank = 0 if given is None else given
    if identity and (given is None or text == _start_text()):  # nothing of its own
        base = 0 if given is None else given
        ancestry: tuple[int, ...] = ()
        try:
            p_rank, p_id, _ = env.get(ENV_PARENT_RANK, "").split(":", 2)
            if len(p_rank) + len(p_id) > 4 * MAX_NUMBER_TEXT:
                raise ValueError(p_rank)
            published = (int(p_rank), tuple(int(x) for x in p_id.split(".") if x))
        except ValueError:
            published = None
        if published is not None and identity[:len(published[1])] == published[1] \
                and len(identity) > len(published[1]):
            base, ancestry = published
        rank = base
        for n in identity[len(ancestry):]:
            rank = rank * WORKER_RANK_BASE + n
        if WORKER_RANK.problem(rank):
            log.warning("the worker rank rule gives %d (workers nested %d deep): out of "
                        "range; using 0", rank, len(identity))
            rank = 0
    if own if publish is None else publish:
        os.environ[ENV_PARENT_RANK] = f"{rank}:{'.'.join(map(str, identity))}:{text}"
    return rank
