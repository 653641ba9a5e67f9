"""The ``resettrace`` command line.

``resettrace bench collector``  the env step breakdown (the main job)
``resettrace bench overhead``   tracing off vs timing vs trace, side by side
``resettrace bench set-state-ab`` the shipped set_state vs the published path vs the engine floor
``resettrace bench export``     span export designs: delivery and training slowdown
``resettrace bench stacks``     env step cost of the shipped stack instrumentations
``resettrace bench snapshots``  what keeping each process's run record current costs
``resettrace bench compare-aa RUN`` compare's false-positive rate on A/A pairs of one run
``resettrace compare BASE NEW``  two sets of collector runs, per key, with verdicts
``resettrace fit RUN...``       the cost model a + b*k of every phase (and c*N across env counts)
``resettrace report RUN [--compare BASE] -o report.html``  one self-contained HTML report
``resettrace merge RUN... -o merged.json``  many workers' runs as one job
``resettrace run [--instrument SPEC] -- COMMAND ...``  an unmodified command, traced

Tracing settings come from ``RESETTRACE`` / ``RESETTRACE_*`` / ``OTEL_*`` (see
``resettrace.config``). The CLI owns the tracing session it creates and shuts it
down with a bounded timeout before it exits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from resettrace.cli.analysis import cmd_compare, cmd_compare_aa, cmd_fit, cmd_merge, cmd_report
from resettrace.cli.bench import (
    cmd_export,
    cmd_overhead,
    cmd_set_state_ab,
    cmd_snapshots,
    cmd_stacks,
)
from resettrace.cli.collector import cmd_collector
from resettrace.cli.run import cmd_run

__all__ = ["build_parser", "main"]

log = logging.getLogger("resettrace")


def build_parser() -> argparse.ArgumentParser:
    from resettrace.bench.export import DEFAULT_CANDIDATES, EXPORTING
    from resettrace.settings import help_text

    p = argparse.ArgumentParser(prog="resettrace", description=__doc__.split("\n\n")[0],
                                epilog=help_text(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench",
                                                                       required=True)

    def common(b: argparse.ArgumentParser, num_envs: int) -> None:
        b.add_argument("--task", default="g1_walk_flat")
        b.add_argument("--backend", default="mujoco")
        b.add_argument("--num-envs", type=int, default=num_envs)
        b.add_argument("--model", default=None, help="MJCF file instead of the bundled G1")
        b.add_argument("--nthread", type=int, default=None, help="engine threads (all CPUs)")

    c = bench.add_parser("collector", help="env step breakdown of a noisy-action rollout")
    common(c, 1024)
    c.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    c.add_argument("--steps", type=int, default=200, help="timed steps")
    c.add_argument("--out", default=None, help="folder for timing.json, timing.csv, spans")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--action-noise", type=float, default=1.0,
                   help="std of the random actions (sets how often envs fall)")
    c.add_argument("--control-dt", type=float, default=None, metavar="SECONDS",
                   help="control period (default 0.02); physics substeps per env step = this "
                        "/ the model's timestep, which must be a whole number")
    c.add_argument("--randomize", action="store_true",
                   help="per-env friction, mass, kp/kd and geom sizes, drawn at every reset")
    c.add_argument("--numba-ab", action="store_true",
                   help="step a numpy and a numba update_state env side by side (same seed and"
                        " actions, interleaved) and print their A/B table")
    c.add_argument("--config", default=None, help=argparse.SUPPRESS)  # a --workers worker's
    c.add_argument("--workers", type=int, default=1, metavar="W",
                   help="run W worker processes (spawned), each its own env and rank "
                        "(RESETTRACE_WORKER_RANK), into OUT/rank<r>/, and merge them into "
                        "OUT/merged.json")
    c.add_argument("--report", action="store_true",
                   help="also write OUT/report.html (resettrace report of this run)")
    c.set_defaults(func=cmd_collector, needs=("sim",))

    o = bench.add_parser("overhead", help="reset_done with tracing off / timing / trace")
    common(o, 1024)
    o.add_argument("--ratio", type=float, default=0.05, help="share of envs reset per call")
    o.add_argument("--rounds", type=int, default=100, help="interleaved rounds")
    o.add_argument("--calls", type=int, default=3, help="reset_done calls per mode per round")
    o.add_argument("--warmup", type=int, default=5, help="untimed calls per mode first")
    o.add_argument("--repeats", type=int, default=5,
                   help="groups of rounds; each ratio is the median over the groups")
    o.add_argument("--json", default=None, help="write the result as JSON")
    o.set_defaults(func=cmd_overhead, needs=("sim",))

    sn = bench.add_parser("snapshots", help="what keeping each process's run record "
                                            "current costs its training (interleaved, A/A)")
    common(sn, 1024)
    sn.add_argument("--ratio", type=float, default=0.05, help="share of envs reset per step")
    sn.add_argument("--rounds", type=int, default=12, help="interleaved rounds")
    sn.add_argument("--steps", type=int, default=60, help="steps per mode per round")
    sn.add_argument("--period", type=float, default=0.25,
                    help="seconds between snapshots while measuring (0.25: 20x the default)")
    sn.add_argument("--json", default=None, help="write the result as JSON")
    sn.set_defaults(func=cmd_snapshots, needs=("sim",))

    x = bench.add_parser("export", help="span export designs: throughput, delivery and the "
                                        "training slowdown, interleaved")
    common(x, 64)
    x.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    x.add_argument("--steps", type=int, default=1000,
                   help="env steps per candidate per round (each round ends with a timed "
                        "flush: keep rounds long)")
    x.add_argument("--warmup", type=int, default=20, help="untimed steps per candidate first")
    x.add_argument("--candidates", nargs="+", default=list(DEFAULT_CANDIDATES), metavar="NAME",
                   help=f"exporting candidates to run ({', '.join(EXPORTING)}; timing and "
                        "timing_aa always run)")
    x.add_argument("--json", default=None, help="write the result as JSON")
    x.set_defaults(func=cmd_export, needs=("sim",))

    st = bench.add_parser("stacks", help="env step cost of each shipped instrumentation "
                                         "(MotrixLab, Gymnasium, mjlab): timing vs off vs "
                                         "bare")
    st.add_argument("--stack", nargs="+", default=["motrixlab", "gymnasium"],
                    metavar="NAME", help="stacks to measure (motrixlab, gymnasium; mjlab in a "
                                         "venv with the mjlab extra)")
    st.add_argument("--motrixlab-envs", type=int, default=1024,
                    help="envs of the MotrixLab env")
    st.add_argument("--gymnasium-envs", type=int, default=16,
                    help="sub-envs of the Gymnasium sync vector env")
    st.add_argument("--mjlab-envs", type=int, default=64, help="envs of the mjlab env")
    st.add_argument("--mjlab-task", default="Mjlab-Cartpole-Balance",
                    help="the mjlab task (one of mjlab's registered tasks)")
    st.add_argument("--mjlab-episode-s", type=float, default=1.0,
                    help="the mjlab task's episode length in s (resets: one per episode)")
    st.add_argument("--rounds", type=int, default=40, help="interleaved rounds")
    st.add_argument("--block", type=int, default=None,
                    help="env steps per timed block (default: as many as --block-ms takes)")
    st.add_argument("--block-ms", type=float, default=100.0,
                    help="length of a timed block in ms, its steps sized from the off "
                         "mode's warm-up steps (default 100)")
    st.add_argument("--warmup", type=int, default=10, help="untimed steps per mode first")
    st.add_argument("--settle", type=int, default=2,
                    help="untimed steps before each timed block, in its mode")
    st.add_argument("--seed", type=int, default=0)
    st.add_argument("--json", default=None, help="write the result as JSON")
    st.set_defaults(func=cmd_stacks)  # (the extras of the stacks named: cmd_stacks)

    a = bench.add_parser("set-state-ab",
                         help="set_state: published path vs shipped path vs engine floor")
    a.add_argument("--backends", nargs="+", default=["mujoco", "motrix"])
    a.add_argument("--num-envs", type=int, nargs="+", default=[1024, 2048, 4096])
    a.add_argument("--ratios", type=float, nargs="+", default=[0.02, 0.05, 0.25, 0.5],
                   help="shares of envs reset per call")
    a.add_argument("--calls", type=int, default=30,
                   help="timed calls per variant and cell, at least")
    a.add_argument("--min-seconds", type=float, default=3.0, metavar="S",
                   help="timed seconds per cell, at least: cells of short calls (small k) run "
                        "more than --calls rounds, as many as their warmup says fill S "
                        "(default 3; 0: --calls)")
    a.add_argument("--warmup", type=int, default=5, help="untimed calls per variant first")
    a.add_argument("--fixed-k", type=int, default=82,
                   help="rows reset on every --num-envs to check N-independence (0: skip)")
    a.add_argument("--model", default=None, help="MJCF file instead of the bundled G1")
    a.add_argument("--nthread", type=int, default=None, help="engine threads (all CPUs)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--idle-us", type=float, default=1000.0, metavar="US",
                   help="busy microseconds before every call, as the env's own Python between "
                        "a step and its resets (default 1000; 0: calls back to back)")
    a.add_argument("--no-per-key", action="store_true", help="print the summary tables only")
    a.add_argument("--json", default=None, help="write the result as JSON")
    a.set_defaults(func=cmd_set_state_ab, needs=("sim",))

    def compare_flags(q: argparse.ArgumentParser) -> None:
        q.add_argument("--noise", type=float, default=3.0, metavar="PCT",
                       help="noise floor: a change within +-PCT%% is 'within noise' (3)")
        q.add_argument("--confidence", type=float, default=0.99,
                       help="confidence level of the bootstrap interval (0.99: dozens of "
                            "keys are judged at once)")
        q.add_argument("--reference", default="physics_ms", metavar="KEY",
                       help="a key the change leaves alone: its shift between the sides "
                            "(the machine's drift) widens the noise floor (physics_ms; "
                            "'none': the fixed floor only)")
        q.add_argument("--blocks", type=int, default=10,
                       help="blocks per run whose medians are the statistical units (10)")
        q.add_argument("--json", default=None, help="write the result as JSON")

    cmp_ = sub.add_parser("compare", help="two sets of collector runs side by side, per key")
    cmp_.add_argument("base", metavar="BASE", help="timing.json, or a folder of runs")
    cmp_.add_argument("new", metavar="NEW", help="timing.json, or a folder of runs")
    cmp_.add_argument("--fail-on-regression", type=float, default=None, metavar="PCT",
                      help="exit 1 when a key is slower beyond noise by more than PCT%%")
    compare_flags(cmp_)
    cmp_.set_defaults(func=cmd_compare, needs=("report",))

    fit = sub.add_parser("fit", help="cost model of every phase: ms = a + b*k per call, and "
                                     "the dependence on N across env counts")
    fit.add_argument("runs", nargs="+", metavar="RUN",
                     help="timing.json files or folders (any env counts), or one bench "
                          "set-state-ab JSON")
    fit.add_argument("--json", default=None, help="write the result as JSON")
    fit.set_defaults(func=cmd_fit, needs=("report",))

    mg = sub.add_parser("merge", help="many workers' collector runs as one job: per-rank "
                                      "table and merged statistics")
    mg.add_argument("runs", nargs="+", metavar="RUN",
                    help="run records (timing.json, resettrace run's job.PID.json, ...) or "
                         "folders of them (a job record beside its processes' is left out)")
    mg.add_argument("-o", "--output", default=None, help="write the merged JSON here")
    mg.add_argument("--allow-mixed", action="store_true",
                    help="merge runs of different configurations anyway")
    mg.add_argument("--allow-duplicates", action="store_true",
                    help="merge processes that claim one identity (two rank 0s: records of "
                         "different jobs?) anyway; the job lists them")
    mg.set_defaults(func=cmd_merge)

    rep = sub.add_parser("report", help="one self-contained HTML report of a run record")
    rep.add_argument("run", metavar="RUN",
                     help="a run record (timing.json, a resettrace run --stats-json file), "
                          "or the folder of a timing.json")
    rep.add_argument("--compare", default=None, metavar="BASE",
                     help="also compare against BASE (timing.json or a folder of runs)")
    rep.add_argument("-o", "--output", default="report.html", help="the HTML file (report.html)")
    rep.set_defaults(func=cmd_report, needs=("report",))

    aa = bench.add_parser("compare-aa", help="compare's false-positive rate on A/A pairs "
                                             "cut from one long run")
    aa.add_argument("run", metavar="RUN", help="timing.json, or a folder of runs")
    aa.add_argument("--pairs", type=int, default=10, help="A/A pairs per run (10)")
    compare_flags(aa)
    aa.set_defaults(func=cmd_compare_aa, needs=("report",))

    r = sub.add_parser(
        "run", help="run an unmodified command with tracing installed",
        description="Run COMMAND with resettrace installed in each of its Python processes "
                    "(a sitecustomize on PYTHONPATH): the spec's functions are recorded, "
                    "RESETTRACE defaults to 'timing', every process that recorded something "
                    "writes its run record at exit, and at the end the records of the whole "
                    "process tree are merged into the job's, printed to stderr with a line "
                    "per rank. RESETTRACE_EXPORTER and the other variables work as usual.")
    r.add_argument("--instrument", metavar="SPEC", default=None,
                   help="TOML spec of attributes, phases and functions to record "
                        "(default: $RESETTRACE_INSTRUMENT)")
    r.add_argument("--no-summary", action="store_true", help="print no stats at exit")
    r.add_argument("--stats-json", metavar="PATH", default=None,
                   help="write the job's run record to PATH, and each process's beside it "
                        "(STEM.PID.json); with {pid} or {rank} in PATH, only each "
                        "process's, as named")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    r.set_defaults(func=cmd_run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="resettrace: %(levelname)s: %(message)s")
    from resettrace.extras import MissingExtra, require

    try:
        # a command whose extra is not installed: one line naming it, before any work
        needs = list(getattr(args, "needs", ()))
        if args.func is cmd_collector and args.report:
            needs.append("report")
        for extra in needs:
            require(extra, " ".join(["resettrace", args.command]
                                    + ([args.bench] if args.command == "bench" else [])))
        return int(args.func(args))
    except MissingExtra as e:  # (and one a command's own call found)
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # before or after the timed part: no traceback
        print("resettrace: interrupted", file=sys.stderr)
        return 128 + int(getattr(e, "signum", signal.SIGINT))
    finally:
        from resettrace import outputs

        outputs.release_claims()  # the command is over: its output paths are free


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
