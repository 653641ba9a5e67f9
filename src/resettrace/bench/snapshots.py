"""``resettrace bench snapshots``: what keeping a process's run record current costs its
training.

The training pattern of ``bench overhead`` (one physics substep, then ``reset_done`` of a
random ``ratio`` share of envs) runs in ``timing`` mode in blocks of ``steps`` steps; each
round visits three blocks in a fresh random order: ``off`` (no snapshots), ``off_aa`` (the
same again: the A/A) and ``on`` (the snapshot thread of :func:`resettrace.record.
keep_record_current` writing the record every ``period`` seconds, far more often than the
default, so that each block holds several). Per mode, the median step time; the ratios
on/off and off_aa/off per round, their medians; and the CPU each snapshot took on its thread
(``time.thread_time``), which divided by the period is the CPU a second of training costs.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from resettrace.config import RUN_DEFAULTS, Config
from resettrace.tables import format_table

__all__ = ["SnapshotConfig", "run_snapshots", "render_snapshots"]

MODES = ("off", "off_aa", "on")


@dataclass(frozen=True, kw_only=True)
class SnapshotConfig:
    task: str = "g1_walk_flat"
    backend: str = "mujoco"
    num_envs: int = 1024
    ratio: float = 0.05
    rounds: int = 12
    steps: int = 60
    period: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"--ratio must be in (0, 1], got {self.ratio}")
        if self.rounds < 1 or self.steps < 1:
            raise ValueError("--rounds and --steps must be at least 1")
        if not 0.01 <= self.period <= 60:
            raise ValueError(f"--period must be in 0.01 - 60 s, got {self.period}")


def run_snapshots(cfg: SnapshotConfig, progress: Callable[[str], None] | None = None
                  ) -> dict[str, Any]:
    import resettrace
    from resettrace import exit_record
    from resettrace.config import ENV_RUN_JSON
    from resettrace.tracing.session import Tracing

    say = progress or (lambda _m: None)
    k = max(1, round(cfg.ratio * cfg.num_envs))
    session = Tracing(Config(mode="timing"))
    env = resettrace.make_env(cfg.task, backend=cfg.backend, num_envs=cfg.num_envs,
                              seed=cfg.seed, tracing=session)
    rng = np.random.default_rng(cfg.seed)
    mask = np.zeros(cfg.num_envs, dtype=bool)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    ratios: dict[str, list[float]] = {"on": [], "off_aa": []}
    cpu: list[float] = []
    saved = os.environ.get(ENV_RUN_JSON)
    with tempfile.TemporaryDirectory(prefix="resettrace-snapshots-") as tmp:
        path = Path(tmp) / "run.{pid}.json"
        os.environ[ENV_RUN_JSON] = str(path)
        exit_record._SNAP.update(pid=os.getpid(), lock=threading.Lock())

        def block(mode: str) -> float:
            stop = threading.Event()
            thread = threading.Thread(  # the process's snapshot thread, its CPU measured
                target=exit_record._snapshots, args=(session, cfg.period, stop, cpu), daemon=True)
            if mode == "on":
                thread.start()
            step: list[float] = []
            for _ in range(cfg.steps):
                mask[:] = False
                mask[rng.choice(cfg.num_envs, k, replace=False)] = True
                t0 = time.perf_counter()
                env.backend.step(env.ctrl, 1)
                env.reset_done(mask)
                step.append(time.perf_counter() - t0)
            stop.set()
            if mode == "on":
                thread.join()
            times[mode] += step
            return statistics.median(step)

        try:
            for m in MODES:  # warm: caches, the first snapshot's imports
                block(m)
            times = {m: [] for m in MODES}
            cpu.clear()
            for r in range(cfg.rounds):
                p50 = {str(m): block(str(m)) for m in rng.permutation(MODES)}
                for m in ratios:
                    ratios[m].append(p50[m] / p50["off"])
                say(f"round {r + 1}/{cfg.rounds}")
            files = sorted(Path(tmp).glob("run.*.json"))
            size = files[0].stat().st_size if files else 0
        finally:
            exit_record._SNAP.update(pid=None, lock=None)
            if saved is None:
                os.environ.pop(ENV_RUN_JSON, None)
            else:
                os.environ[ENV_RUN_JSON] = saved
            env.close()
            session.shutdown()
    per = statistics.median(cpu) if cpu else None  # (none: no snapshot fell in a block)
    return {
        "config": asdict(cfg) | {"k": k},
        "step_p50_ms": {m: statistics.median(times[m]) * 1e3 for m in MODES},
        "ratios": {f"{m}_vs_off": statistics.median(v) for m, v in ratios.items()},
        "rounds": {f"{m}_vs_off": v for m, v in ratios.items()},
        "snapshots": len(cpu),
        "snapshot_cpu_ms": {"p50": None if per is None else per * 1e3,
                            "max": max(cpu) * 1e3 if cpu else None},
        "record_bytes": size,
        "cpu_share_at_period": None if per is None else per / cfg.period,
        "cpu_share_at_default": None if per is None else per / RUN_DEFAULTS["record_period_s"],
    }


def render_snapshots(result: dict[str, Any]) -> str:
    cfg = result["config"]
    rows = [[m, result["step_p50_ms"][m],
             result["step_p50_ms"][m] / result["step_p50_ms"]["off"]] for m in MODES]
    lines = [format_table(
        f"snapshots of the run record every {cfg['period']:g} s ({cfg['task']} on "
        f"{cfg['backend']}, {cfg['num_envs']} envs, {cfg['k']} reset a step; "
        f"{cfg['rounds']} rounds of {cfg['steps']} steps a mode)",
        ["mode", "step p50 ms", "vs off"], rows)]
    r = result["ratios"]
    snap = result["snapshot_cpu_ms"]
    lines.append(f"step time, median of the rounds' ratios: on/off {r['on_vs_off']:.3f} "
                 f"(A/A off_aa/off {r['off_aa_vs_off']:.3f})")
    if not result["snapshots"]:
        lines.append(f"no snapshot fell in the 'on' blocks (each shorter than --period "
                     f"{cfg['period']:g} s): give more --steps")
        return "\n".join(lines)
    lines.append(f"{result['snapshots']} snapshots of {result['record_bytes']:,} bytes: "
                 f"{snap['p50']:.2f} ms of CPU each (p50; max {snap['max'] or 0:.2f}): "
                 f"{100 * result['cpu_share_at_period']:.3f}% of a core at every "
                 f"{cfg['period']:g} s, {100 * result['cpu_share_at_default']:.4f}% at the "
                 f"default {5:g} s")
    return "\n".join(lines)
