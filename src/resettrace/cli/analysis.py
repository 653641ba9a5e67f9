"""``resettrace compare``, ``fit``, ``merge``, ``report`` and ``bench compare-aa``: the
commands that read run records."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from resettrace.cli.common import (
    refused,
    run_command,
    save_json,
)

log = logging.getLogger("resettrace")


def _compare_options(args: argparse.Namespace) -> dict[str, Any]:
    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must be between 0 and 1, got {args.confidence}")
    if not args.noise >= 0 or args.blocks < 1:
        raise ValueError("--noise must be >= 0 and --blocks >= 1")
    return {"blocks": args.blocks, "noise_pct": args.noise, "confidence": args.confidence,
            "reference": None if args.reference == "none" else args.reference}


def cmd_compare(args: argparse.Namespace) -> int:
    from resettrace import outputs
    from resettrace.analysis.compare import compare_runs, load_runs, regressions, render_compare

    if args.json and refused([(args.json, outputs.JSON)]):
        return 2
    try:
        options = _compare_options(args)
        result = compare_runs(load_runs(args.base), load_runs(args.new), **options)
    except (ValueError, FileNotFoundError) as e:
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    print(render_compare(result))
    if save_json(args.json, result):
        return 2
    if args.fail_on_regression is not None:
        slower = regressions(result, args.fail_on_regression)
        if slower:
            print(f"resettrace: {len(slower)} key(s) slower beyond noise by more than "
                  f"{args.fail_on_regression:g}%: "
                  + ", ".join(f"{k['key']} " + ("(took no time before)" if k["delta_pct"]
                                                 is None else f"{k['delta_pct']:+.1f}%")
                              for k in slower),
                  file=sys.stderr)
            return 1
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from resettrace.analysis.fit import load_fit_inputs, render_fit

    return run_command(args.json, lambda: load_fit_inputs(args.runs), render_fit)


def cmd_merge(args: argparse.Namespace) -> int:
    from resettrace.analysis.job_lines import render_merge
    from resettrace.merging import load_runs, merge_runs

    def merged() -> dict[str, Any]:
        job = merge_runs(load_runs(args.runs), allow_mixed=args.allow_mixed,
                         allow_duplicates=args.allow_duplicates)
        for line in job.extra.get("left_out") or ():  # a job record beside its processes'
            print(f"resettrace: {line}", file=sys.stderr)
        return job.to_json()

    return run_command(args.output, merged, render_merge)


def cmd_report(args: argparse.Namespace) -> int:
    from resettrace import outputs
    from resettrace.analysis.report import write_report

    if refused([(args.output, outputs.REPORT_HTML)]):
        return 2
    try:
        path = write_report(args.run, args.output, compare_base=args.compare)
    except (ValueError, FileNotFoundError) as e:
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def cmd_compare_aa(args: argparse.Namespace) -> int:
    from resettrace import outputs
    from resettrace.analysis.compare import aa_false_positive_rate, load_runs

    if args.json and refused([(args.json, outputs.JSON)]):
        return 2
    try:
        options = _compare_options(args)
        if args.pairs < 1:
            raise ValueError(f"--pairs must be >= 1, got {args.pairs}")
        runs = load_runs(args.run)
        results = [aa_false_positive_rate(r, args.pairs, **options) for r in runs]
    except (ValueError, FileNotFoundError) as e:
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    flagged = sum(r["false_positives"] for r in results)
    total = sum(r["verdicts"] for r in results)
    print(f"A/A: {args.pairs} pairs of consecutive pieces per run, {len(runs)} run(s): "
          f"{flagged} of {total} key verdicts not 'within noise' "
          f"(false-positive rate {100 * flagged / max(total, 1):.2f}%)")
    for r in results:
        for key, n in sorted(r["flagged_keys"].items()):
            print(f"  {key}: flagged in {n} of {r['pairs']} pairs")
    return save_json(args.json, {"runs": [r.source for r in runs], "results": results})
