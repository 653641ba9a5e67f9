"""``resettrace compare``: verdicts on synthetic samples with known answers, and the CLI on
real collector runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from resettrace.analysis.compare import (
    Run,
    aa_false_positive_rate,
    compare_key,
    compare_runs,
    render_compare,
)


def _samples(rng: np.random.Generator, n: int, median: float, drift: float = 0.0) -> list[float]:
    """Log-normal call times around ``median`` ms, with a slow drift over the run."""
    t = np.linspace(0.0, 1.0, n)
    return list(median * (1.0 + drift * np.sin(6.0 * t)) * rng.lognormal(0.0, 0.15, n))


def test_a_real_shift_is_found_and_signed() -> None:
    rng = np.random.default_rng(1)
    base = [_samples(rng, 2000, 1.0)]
    slower = compare_key("k", base, [_samples(rng, 2000, 1.10)])
    assert slower.verdict == "slower" and 7 < slower.delta_pct < 13
    assert slower.ci_low_pct > 3.0 and slower.ci_low_pct < slower.delta_pct < slower.ci_high_pct
    faster = compare_key("k", base, [_samples(rng, 2000, 0.85)])
    assert faster.verdict == "faster" and faster.ci_high_pct < -3.0


def test_an_aa_pair_is_within_noise() -> None:
    rng = np.random.default_rng(2)
    for seed in range(20):
        a = _samples(np.random.default_rng([seed, 0]), 1500, 2.0, drift=0.02)
        b = _samples(np.random.default_rng([seed, 1]), 1500, 2.0, drift=0.02)
        v = compare_key("k", [a], [b])
        assert v.verdict == "within noise", (seed, v)
    # a shift inside the noise floor is not a change either, however many samples
    v = compare_key("k", [_samples(rng, 20_000, 1.0)], [_samples(rng, 20_000, 1.015)])
    assert v.verdict == "within noise" and 0.5 < v.delta_pct < 2.5


def test_a_phase_that_appears_or_vanishes() -> None:
    rng = np.random.default_rng(3)
    off = compare_key("rand", [[0.0] * 100], [_samples(rng, 100, 0.05)])
    assert off.verdict == "slower"  # randomization switched on: the phase now costs time
    assert compare_key("k", [], [[1.0, 2.0]]).verdict == "new"
    assert compare_key("k", [[1.0, 2.0]], []).verdict == "gone"


def _run(source: str, samples: dict[str, list[float]], **config: object) -> Run:
    cfg = {"task": "g1_walk_flat", "backend": "mujoco", "num_envs": 64, "mode": "timing",
           **config}
    return Run(source, cfg, 1000.0, 0.02, samples)


def test_configuration_differences_come_first_and_aa_from_one_run() -> None:
    rng = np.random.default_rng(4)
    long = _run("long", {"env_step_total_ms": _samples(rng, 4000, 5.0, drift=0.02),
                         "physics_ms": _samples(rng, 4000, 4.0, drift=0.02),
                         "reset_done_ms": _samples(rng, 4000, 0.5, drift=0.02)})
    aa = aa_false_positive_rate(long, pairs=10)
    assert aa["verdicts"] == 30 and aa["false_positives"] == 0
    other = _run("other", long.samples, backend="motrix", num_envs=1024)
    result = compare_runs([long], [other])
    assert result["not_comparable"] == ['backend: "mujoco" -> "motrix"',
                                        "num_envs: 64 -> 1024"]
    text = render_compare(result)
    assert text.startswith("NOT COMPARABLE: the runs differ in\n  backend")
    shares = result["shares"]["base"]  # of total times
    assert shares["reset_done_of_env_step_pct"] == pytest.approx(
        100 * sum(long.samples["reset_done_ms"]) / sum(long.samples["env_step_total_ms"]))
    assert 40 < shares["reset_done_of_overhead_pct"] < 60


def test_calls_per_parent_call_are_shown_and_a_change_of_them_is_said() -> None:
    """A key's calls per call of its parent, each side's: physics at 4 substeps a step in
    one run and 5 in the other is said in one line (its delta is per substep, not per
    step), and shown in the table; counts from the records' statistics when given (samples
    thinned), else the samples; a key with no parent phase has none."""
    rng = np.random.default_rng(6)

    def side(substeps: int, thinned: bool) -> Run:
        steps = 400
        run = _run("r", {"env_step_total_ms": _samples(rng, steps, 5.0),
                         "physics_ms": _samples(rng, steps * substeps // (2 if thinned else 1),
                                                1.0),
                         "reset_done_ms": _samples(rng, 100, 0.5)})
        if thinned:  # a record's samples thinned to half: its statistics count every call
            run.counts.update({"env_step_total_ms": steps, "physics_ms": steps * substeps,
                               "reset_done_ms": 100})
        return run

    result = compare_runs([side(4, thinned=True)], [side(5, thinned=False)])
    keys = {k["key"]: k for k in result["keys"]}
    assert (keys["physics_ms"]["base_per_parent"], keys["physics_ms"]["new_per_parent"]) \
        == (4.0, 5.0)
    assert keys["reset_done_ms"]["base_per_parent"] == keys["reset_done_ms"]["new_per_parent"] \
        == 0.25
    assert keys["env_step_total_ms"]["base_per_parent"] is None
    assert any("calls per parent call differ for physics_ms (4.000 -> 5.000)" in n
               for n in result["notes"])
    text = render_compare(result)
    assert "per parent" in text and "4.000 -> 5.000" in text and "0.250" in text
    assert "reset_done_ms (" not in text  # (the same on both sides: no line for it)
    same = compare_runs([side(4, thinned=False)], [side(4, thinned=True)])
    assert not any("per parent" in n for n in same["notes"])
    # a share that moves (reset_done in 25% of steps, then 30%): in the table, not the
    # line; a key on one side only: no figure on the other (not 0)
    more = side(4, thinned=False)
    more.samples["reset_done_ms"] = _samples(rng, 120, 0.5)
    more.samples["update_state_ms"] = _samples(rng, 400, 0.3)
    moved = compare_runs([side(4, thinned=False)], [more])
    assert not any("per parent" in n for n in moved["notes"]), moved["notes"]
    keys = {k["key"]: k for k in moved["keys"]}
    assert keys["reset_done_ms"]["new_per_parent"] == 0.3
    assert "0.250 -> 0.300" in render_compare(moved)
    assert keys["update_state_ms"]["base_per_parent"] is None  # (its parent ran there)
    assert keys["update_state_ms"]["new_per_parent"] == 1.0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resettrace.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_compare_cli_on_real_runs(tmp_path: Path) -> None:
    runs = {}
    for name, extra in (("a", []), ("b", []), ("rand", ["--randomize"])):
        out = tmp_path / name
        r = _cli("bench", "collector", "--num-envs", "16", "--steps", "150", "--warmup", "5",
                 "--nthread", "1", "--out", str(out), *extra)
        assert r.returncode == 0, r.stderr
        runs[name] = out / "timing.json"
    report = tmp_path / "cmp.json"
    r = _cli("compare", str(runs["a"]), str(runs["rand"]), "--json", str(report),
             "--fail-on-regression", "5")
    assert "NOT COMPARABLE" in r.stdout and "randomize: false -> true" in r.stdout
    keys = {k["key"]: k for k in json.loads(report.read_text())["keys"]}
    for key in ("set_state_reset_rand_ms", "set_state_geom_overrides_ms"):
        assert keys[key]["verdict"] == "slower", keys[key]  # randomization found
    assert r.returncode == 1 and "set_state_reset_rand_ms" in r.stderr
    folder = _cli("compare", str(tmp_path / "a"), str(tmp_path / "b"))  # folders of runs
    assert folder.returncode == 0 and "env/s:" in folder.stdout, folder.stderr
    assert "per parent" in folder.stdout  # (calls per parent call: physics per env step)
    aa = _cli("bench", "compare-aa", str(runs["a"]), "--pairs", "3")
    assert aa.returncode == 0 and "false-positive rate" in aa.stdout, aa.stderr
    missing = _cli("compare", str(tmp_path / "none.json"), str(runs["a"]))
    assert missing.returncode == 2 and "no such run" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_a_machine_that_ran_slower_for_one_side_moves_no_verdict() -> None:
    """Every key 8% slower, physics included: the machine, not the change. A key that
    moved beyond the machine's shift is still found."""
    rng = np.random.default_rng(5)

    def side(scale: float, reset_scale: float) -> Run:
        return _run("r", {"physics_ms": _samples(rng, 3000, 4.0 * scale),
                          "update_state_ms": _samples(rng, 3000, 0.4 * scale),
                          "reset_done_ms": _samples(rng, 3000, 0.5 * reset_scale)})

    keys = {k["key"]: k for k in compare_runs([side(1.0, 1.0)], [side(1.08, 1.08)])["keys"]}
    assert all(k["verdict"] == "within noise" for k in keys.values()), keys
    fixed = {k["key"]: k for k in compare_runs([side(1.0, 1.0)], [side(1.08, 1.08)],
                                               reference=None)["keys"]}
    assert fixed["update_state_ms"]["verdict"] == "slower"  # without the reference
    real = {k["key"]: k for k in compare_runs([side(1.0, 1.0)], [side(1.08, 1.40)])["keys"]}
    assert real["reset_done_ms"]["verdict"] == "slower"


def test_a_missing_reference_key_is_said_and_no_env_steps_print_no_nan() -> None:
    """Two Gymnasium runs: no ``physics_ms`` (the default reference) and, in worker
    records, no env step. The floor falls back to the fixed one, said in one line; the
    reset share is said to be unknown in one line, never ``nan%``."""
    rng = np.random.default_rng(6)

    def run(name: str, steps: bool) -> Run:
        samples = {"reset_done_ms": _samples(rng, 400, 0.3), "set_state_ms": _samples(rng, 400,
                                                                                      0.2)}
        if steps:
            samples["env_step_total_ms"] = _samples(rng, 400, 2.0)
        return Run(name, {"mode": "timing"}, 0.0, 0.0, samples)

    result = compare_runs([run("a.json", True)], [run("b.json", True)])
    text = render_compare(result)
    said = [line for line in text.splitlines() if "physics_ms" in line]
    assert said == ["reference key physics_ms is in neither side's runs: the noise floor is "
                    "the fixed 3% (the machine's drift between the sides is not measured)"]
    assert result["notes"] == said and result["settings"]["noise_floor_pct"] == 3.0
    assert "nan" not in text
    assert "reset_done share of the env step: " in text and "non-physics" not in text
    # one side without: which run
    one = compare_runs([run("a.json", True)], [Run("b.json", {"mode": "timing"}, 0.0, 0.0, {
        **run("x", True).samples, "physics_ms": _samples(rng, 400, 1.5)})])
    assert any(n.startswith("reference key physics_ms is not in a.json:")
               for n in one["notes"]), one["notes"]
    # no env steps on either side
    stepless = compare_runs([run("a.json", False)], [run("b.json", False)])
    text = render_compare(stepless)
    assert "nan" not in text and "reset_done share" not in text
    said = [line for line in text.splitlines() if "reset %" in line]
    assert said == ["reset % not known for base and new: runs without env steps (no "
                    "env_step recorded) have no reset share"]
    json.dumps(stepless, allow_nan=False)  # --json writes it (nan was refused there)
    # one side without
    text = render_compare(compare_runs([run("a.json", True)], [run("b.json", False)]))
    assert "nan" not in text and "-> not known" in text
    assert "reset % not known for new: runs without env steps" in text
