"""The command line end to end: the collector benchmark and the overhead benchmark."""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import subprocess
import sys

import pytest

from resettrace import catalog as C
from resettrace.tables import STAT_FIELDS


def _run(args, env_extra=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "resettrace.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_collector_trace_mode_writes_every_output(tmp_path) -> None:
    out = tmp_path / "run"
    r = _run(["bench", "collector", "--num-envs", "48", "--warmup", "2", "--steps", "30",
              "--out", str(out), "--nthread", "1", "--action-noise", "2.0"],
             {"RESETTRACE": "trace"})
    assert r.returncode == 0, r.stderr
    assert "env/s" in r.stdout and "env step breakdown" in r.stdout
    for title in ("reset_done stages", "DR reset stages", "set_state phases"):
        assert title in r.stdout
    assert "step 30/30 (100%)" in r.stderr  # progress
    data = json.loads((out / "timing.json").read_text())
    assert set(data) >= {"config", "env_per_s", "stats", "samples"}
    assert data["env_per_s"] > 0 and data["config"]["num_envs"] == 48
    stats = data["stats"]
    for key in C.ENV_STEP_KEYS + C.SET_STATE_KEYS:
        assert key in stats, key
        assert set(stats[key]) >= set(STAT_FIELDS)
    assert stats[C.ENV_STEP.key]["count"] == 30
    assert len(data["samples"][C.PHYSICS.key]) == 30
    step = stats[C.ENV_STEP.key]["total_ms"]
    parts = sum(stats[k]["total_ms"] for k in C.ENV_STEP_KEYS[1:])
    assert parts == pytest.approx(step, rel=1e-6)  # physics + update + reset + other = total
    rows = list(csv.DictReader((out / "timing.csv").open()))
    assert {r["key"] for r in rows} == set(stats)
    spans = (out / "spans.jsonl").read_text().splitlines()
    assert any(json.loads(s)["name"] == C.SET_STATE.span for s in spans)
    assert "0 dropped (queue full)" in r.stdout
    assert data["export"]["exporters"][f"file:{out / 'spans.jsonl'}"]["undelivered"] == 0


def test_collector_defaults_to_timing_and_rejects_bad_arguments(tmp_path) -> None:
    r = _run(["bench", "collector", "--num-envs", "16", "--warmup", "0", "--steps", "3",
              "--nthread", "1", "--out", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert "mode timing" in r.stdout and not (tmp_path / "spans.jsonl").exists()
    bad = _run(["bench", "collector", "--num-envs", "0"])
    assert bad.returncode == 2 and "--num-envs must be between 1 and" in bad.stderr
    unknown = _run(["bench", "collector", "--backend", "bullet", "--num-envs", "4"])
    assert unknown.returncode == 2 and "mujoco" in unknown.stderr.split("known:")[1]


def test_overhead_json(tmp_path) -> None:
    path = tmp_path / "overhead.json"
    r = _run(["bench", "overhead", "--num-envs", "64", "--rounds", "4", "--calls", "2",
              "--repeats", "2", "--warmup", "1", "--nthread", "1", "--json", str(path)])
    assert r.returncode == 0, r.stderr
    data = json.loads(path.read_text())
    assert set(data["modes"]) == {"off", "off_aa", "timing", "trace", "otlp"}
    for mode in data["modes"].values():
        assert mode["reset_done_p50_ms"] > 0 and mode["calls"] == 8
    names = {"off_aa_vs_off", "timing_vs_off", "trace_vs_off", "otlp_vs_off"}
    assert set(data["ratios"]) == names and set(data["repeats"]) == names
    assert all(len(v) == 2 for v in data["repeats"].values())
    assert data["aa_spread"] >= 0 and data["traced_ns"]["on"] > 0
    assert 0 < data["noop_share"] < 0.5
    # reset_done, its stages and set_state's phases (lazy MuJoCo: set_state, qpos_convert)
    assert data["scopes_per_reset"] >= 10
    otlp = data["export"]["otlp"]
    assert otlp["exporters"]["otlp"]["undelivered"] == 0
    assert otlp["received_by_receiver"] == otlp["exporters"]["otlp"]["delivered"] > 0
    assert "timing_vs_off" in r.stdout and "A/A spread" in r.stdout
    # recording and aggregation apart, each thread's CPU per trace (no bounds: a figure)
    cpu = data["trace_cpu_us"]
    assert {"recording", "hand_off", "aggregation", "aggregation_full"} <= set(cpu)
    assert cpu["aggregation"] > 0 and cpu["aggregation_full"] > 0
    assert f"aggregation {cpu['aggregation']:.2f} us while the reservoirs fill" in r.stdout
    bad = _run(["bench", "overhead", "--rounds", "2", "--repeats", "3"])
    assert bad.returncode == 2 and "--repeats" in bad.stderr


def test_collector_numba_ab_table_and_json(tmp_path) -> None:
    out = tmp_path / "ab"
    r = _run(["bench", "collector", "--num-envs", "16", "--warmup", "1", "--steps", "4",
              "--nthread", "1", "--numba-ab", "--out", str(out)], {"RESETTRACE": "trace"})
    assert r.returncode == 0, r.stderr
    assert "mode timing" in r.stdout and "runs in mode 'timing'" in r.stderr
    assert "numba A/B: update_state numpy vs numba, 16 envs, 4 steps" in r.stdout
    for row in ("env/s", "env step ms p50", "env step ms mean", "update_state ms p50",
                "update_state ms mean"):
        assert row in r.stdout, row
    assert "done masks differ on 0 of 4 steps" in r.stdout
    assert "env step breakdown" in r.stdout  # the numpy variant's tables come first
    ab = json.loads((out / "timing.json").read_text())["numba_ab"]
    for name in ("numpy", "numba"):
        v = ab[name]
        assert v["env_per_s"] > 0
        assert set(v["env_step_ms"]) == set(v["update_state_ms"]) == {"p50", "mean"}
        assert 0 < v["update_state_ms"]["p50"] < v["env_step_ms"]["p50"]
    assert set(ab["speedup"]) == {"env_per_s", "env_step_p50", "env_step_mean",
                                  "update_state_p50", "update_state_mean"}
    assert ab["speedup"]["update_state_p50"] == pytest.approx(
        ab["numpy"]["update_state_ms"]["p50"] / ab["numba"]["update_state_ms"]["p50"])
    assert ab["done_mismatch_steps"] == 0 and ab["obs_max_abs_diff"] < 1e-5
    assert ab["steps"] == 4 and ab["num_envs"] == 16
    plain = _run(["bench", "collector", "--num-envs", "16", "--warmup", "0", "--steps", "2",
                  "--nthread", "1"])
    assert plain.returncode == 0, plain.stderr
    assert "numba A/B" not in plain.stdout


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_collector_with_its_report_and_timing_json(
        tmp_path, signum, code) -> None:
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    env["RESETTRACE"] = "trace"
    p = subprocess.Popen([sys.executable, "-m", "resettrace.cli", "bench", "collector",
                          "--num-envs", "16", "--warmup", "1", "--steps", "1000000",
                          "--nthread", "1", "--out", str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        for line in p.stderr:  # the first progress line: timed steps are running
            if line.startswith("step "):
                break
        p.send_signal(signum)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, stderr
    assert "Traceback" not in stderr and "interrupted by" in stderr
    data = json.loads((out / "timing.json").read_text())
    done = data["interrupted"]["steps_done"]
    assert data["interrupted"]["signal"] == signal.Signals(signum).name and done > 0
    assert data["stats"]["env_step_total_ms"]["count"] == done  # the step under way ends first
    spans = (out / "spans.jsonl").read_text().splitlines()
    delivered = data["export"]["exporters"][f"file:{out / 'spans.jsonl'}"]["delivered"]
    assert len(spans) == delivered > 0 and data["export"]["spans_not_delivered"] == 0
    assert "interrupted by" in stdout


def test_export_bench_json(tmp_path) -> None:
    path = tmp_path / "export.json"
    r = _run(["bench", "export", "--num-envs", "4", "--rounds", "2", "--steps", "3",
              "--warmup", "1", "--nthread", "1", "--json", str(path)])
    assert r.returncode == 0, r.stderr
    rows = json.loads(path.read_text())["candidates"]
    assert set(rows) == {"timing", "timing_aa", "child-wire", "child-sdk", "in-process",
                         "child-file", "child-file-sdk"}
    for name in ("child-wire", "child-sdk"):
        assert rows[name]["spans_delivered"] == rows[name]["spans_received"] \
            == rows[name]["spans_produced"] > 0
    for name in ("child-file", "child-file-sdk"):
        assert rows[name]["spans_delivered"] == rows[name]["spans_produced"] > 0
        assert rows[name]["child_cpu_us_per_span"] is not None  # (clock ticks: may read 0)
    assert rows["in-process"]["spans_received"] == rows["in-process"]["spans_produced"] > 0
    assert rows["timing"]["slowdown"] == 1.0 and "child us/span" in r.stdout
    assert rows["timing"]["slowdown_ci95"] == rows["timing"]["round_median_ci95"] == [1.0, 1.0]
    assert rows["child-wire"]["slowdown_ci95"] is None  # 2 rounds: no interval
    base = rows["timing"]["round_s"]
    for row in rows.values():  # slowdown: timing's env/s over the candidate's
        assert len(row["round_s"]) == len(row["flush_s"]) == 2
        assert row["slowdown"] == pytest.approx(sum(row["round_s"]) / sum(base))
        assert row["slowdown"] == pytest.approx(rows["timing"]["env_per_s"] / row["env_per_s"])
        assert len(row["train_cpu_s"]) == 2 and min(row["train_cpu_s"]) > 0
        assert row["train_cpu_ratio"] == pytest.approx(
            sum(row["train_cpu_s"]) / sum(rows["timing"]["train_cpu_s"]))
        assert row["round_median"] == pytest.approx(
            statistics.median(t / b for t, b in zip(row["round_s"], base, strict=True)))
    for row in rows.values():  # each round ends with its candidate's flush, timed with it
        assert row["flush_ms"] > 0 and 0 < row["flush_share"] < 1
    assert "flush ms" in r.stdout
    bad = _run(["bench", "export", "--rounds", "0"])
    assert bad.returncode == 2 and "--rounds" in bad.stderr
    unknown = _run(["bench", "export", "--candidates", "child-wire", "nope"])
    assert unknown.returncode == 2 and "got nope" in unknown.stderr
    one = tmp_path / "one.json"
    r = _run(["bench", "export", "--num-envs", "4", "--rounds", "1", "--steps", "2",
              "--warmup", "0", "--nthread", "1", "--candidates", "child-wire",
              "--json", str(one)])
    assert r.returncode == 0, r.stderr
    assert set(json.loads(one.read_text())["candidates"]) == {"timing", "timing_aa",
                                                             "child-wire"}
    missing = _run(["bench", "export", "--model", str(tmp_path / "none.xml"), "--rounds", "1"])
    assert missing.returncode == 2 and "model file not found" in missing.stderr
    assert "Traceback" not in missing.stderr
    unwritable = _run(["bench", "export", "--num-envs", "4", "--rounds", "1", "--steps", "1",
                       "--warmup", "0", "--nthread", "1", "--json", str(tmp_path)])
    assert unwritable.returncode == 2 and "cannot write" in unwritable.stderr
    assert "Traceback" not in unwritable.stderr


def test_collector_says_each_bad_setting_once(tmp_path) -> None:
    """The CLI reads the environment once: each warning is one line, not two."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    env.update(RESETTRACE_METRICS="prometheus:99999", RESETTRACE_EXPORTER="bogus",
               RESETTRACE="trace")
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "bench", "collector",
                        "--num-envs", "4", "--steps", "2", "--warmup", "0", "--nthread", "1"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("ignoring 'prometheus:99999'") == 1, r.stderr
    said = [line for line in r.stderr.splitlines() if "'bogus'" in line]
    assert len(said) == 1, r.stderr  # one line names it and the default
    assert "using the default 'file:resettrace-spans.jsonl'" in r.stderr


def test_export_slowdown_interval_is_a_paired_bootstrap_of_the_total_ratio() -> None:
    from resettrace.bench.export import _total_ci

    base = [4.0, 4.4, 3.9, 5.2, 4.1, 4.6, 4.0, 4.3]
    assert _total_ci([1.05 * b for b in base], base) == pytest.approx([1.05, 1.05])
    # a burst in both candidates' rounds alike cancels: paired, not two free samples
    noisy = [b * (1.02 if i % 2 else 0.99) for i, b in enumerate(base)]
    lo, hi = _total_ci(noisy, base)
    assert lo < sum(noisy) / sum(base) < hi and hi - lo < 0.04
    assert _total_ci(base, base) == [1.0, 1.0] and _total_ci(base[:2], base[:2]) == [1.0, 1.0]
    assert _total_ci([1.0, 2.0], [1.0, 1.0]) is None


def test_the_collector_policy_lives_with_the_collector(tmp_path) -> None:
    """What a collector run does with the environment's tracing settings (and which files
    it will write) is the collector's, a function the CLI and its workers share."""
    from resettrace import outputs
    from resettrace.bench.collector import CollectorConfig, planned_outputs, session_config
    from resettrace.config import Config

    cfg = CollectorConfig(num_envs=8, steps=1, warmup=0, out=str(tmp_path))
    off = session_config(cfg, Config(mode="off"), {})
    assert off.mode == "timing"
    assert off.resource_attributes == {"resettrace.task.name": "g1_walk_flat",
                                       "resettrace.backend.name": "mujoco",
                                       "resettrace.env.count": 8}
    trace = session_config(cfg, Config(mode="trace"), {})
    assert trace.exporters == (f"file:{tmp_path / 'spans.jsonl'}",)
    theirs = session_config(cfg, Config(mode="trace", exporters=("otlp",)),
                            {"RESETTRACE_EXPORTER": "otlp"})
    assert theirs.exporters == ("otlp",)
    ab = CollectorConfig(num_envs=8, steps=1, warmup=0, numba_ab=True)
    assert session_config(ab, Config(mode="trace"), {}).mode == "timing"
    files = planned_outputs(cfg, Config(mode="trace", exporters=(
        f"perfetto:{tmp_path}/t.{{pid}}.json", "otlp")), report=True)
    assert files == [(tmp_path / "timing.json", outputs.JSON),
                     (tmp_path / "timing.csv", outputs.CSV),
                     (tmp_path / "report.html", outputs.REPORT_HTML),
                     (f"{tmp_path}/t.{os.getpid()}.json", outputs.PERFETTO)]
