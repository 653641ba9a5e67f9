"""The benchmark commands that print a table and write ``--json``: ``bench overhead``,
``snapshots``, ``export``, ``stacks``, ``set-state-ab``."""

from __future__ import annotations

import argparse
import logging

from resettrace.cli.common import (
    run_bench,
)

log = logging.getLogger("resettrace")


def cmd_overhead(args: argparse.Namespace) -> int:
    from resettrace.bench.overhead import OverheadConfig, render_overhead, run_overhead

    return run_bench(args, lambda: OverheadConfig(
        task=args.task, backend=args.backend, num_envs=args.num_envs, ratio=args.ratio,
        rounds=args.rounds, calls=args.calls, warmup=args.warmup, repeats=args.repeats,
        model=args.model, nthread=args.nthread), run_overhead, render_overhead)


def cmd_snapshots(args: argparse.Namespace) -> int:
    from resettrace.bench.snapshots import SnapshotConfig, render_snapshots, run_snapshots

    return run_bench(args, lambda: SnapshotConfig(
        task=args.task, backend=args.backend, num_envs=args.num_envs, ratio=args.ratio,
        rounds=args.rounds, steps=args.steps, period=args.period), run_snapshots,
        render_snapshots)


def cmd_export(args: argparse.Namespace) -> int:
    from resettrace.bench.export import ExportBenchConfig, render_export_bench, run_export_bench

    return run_bench(args, lambda: ExportBenchConfig(
        task=args.task, backend=args.backend, num_envs=args.num_envs, rounds=args.rounds,
        steps=args.steps, warmup=args.warmup, model=args.model, nthread=args.nthread,
        candidates=tuple(args.candidates)), run_export_bench, render_export_bench)


def cmd_stacks(args: argparse.Namespace) -> int:
    from resettrace.bench.stacks import (
        STACK_EXTRA,
        StacksBenchConfig,
        render_stacks_bench,
        run_stacks_bench,
    )
    from resettrace.extras import require

    for stack in dict.fromkeys(args.stack):  # each named stack's extra, before any work
        if stack in STACK_EXTRA:
            require(STACK_EXTRA[stack], f"resettrace bench stacks --stack {stack}")
    return run_bench(args, lambda: StacksBenchConfig(
        stacks=tuple(args.stack), motrixlab_envs=args.motrixlab_envs,
        gymnasium_envs=args.gymnasium_envs, mjlab_envs=args.mjlab_envs,
        mjlab_task=args.mjlab_task, mjlab_episode_s=args.mjlab_episode_s,
        rounds=args.rounds, block=args.block, block_ms=args.block_ms, warmup=args.warmup,
        settle=args.settle, seed=args.seed),
        run_stacks_bench, render_stacks_bench)


def cmd_set_state_ab(args: argparse.Namespace) -> int:
    from resettrace.bench.set_state_ab import (
        SetStateABConfig,
        render_set_state_ab,
        run_set_state_ab,
    )

    return run_bench(args, lambda: SetStateABConfig(
        backends=tuple(args.backends), num_envs=tuple(args.num_envs), ratios=tuple(args.ratios),
        calls=args.calls, min_seconds=args.min_seconds, warmup=args.warmup,
        fixed_k=args.fixed_k, model=args.model, nthread=args.nthread, seed=args.seed,
        idle_us=args.idle_us), run_set_state_ab,
        lambda result: render_set_state_ab(result, per_key=not args.no_per_key))
