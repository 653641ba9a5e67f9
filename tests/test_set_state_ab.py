"""``bench set-state-ab``: the published baseline, the shipped set_state and the engine floor
leave identical state; the optimized path keeps the 16-key schema; the CLI writes the JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from resettrace import catalog as C
from resettrace.bench import set_state_ab as ab
from resettrace.sim.backends import make_backend, published
from resettrace.tracing.recorder import Recorder

N = 96
BACKENDS = ("mujoco", "motrix")


def _moved_backend(name: str):
    """A backend whose envs have left the keyframe (so a reset has something to undo)."""
    be = make_backend(name, num_envs=N, recorder=Recorder(), nthread=2)
    ctrl = np.tile(be.keyframe_qpos[7:], (N, 1))
    ctrl += np.random.default_rng(1).normal(0.0, 0.05, ctrl.shape)
    be.step(ctrl, 3)
    return be


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("k", [1, 5, 40])
def test_variants_leave_identical_state(name: str, k: int) -> None:
    after: dict[str, dict[str, np.ndarray]] = {}
    for variant in ab.VARIANTS:
        be = _moved_backend(name)
        ids, q, v = ab.make_inputs(be, k, np.random.default_rng(k))
        other = np.setdiff1d(np.arange(N), ids)
        before = published.final_state(be, other)
        if variant == "baseline":
            out = published.baseline_set_state(be, ids, q, v)
            assert out is not None and tuple(out["timing"]) == C.SET_STATE_KEYS
        elif variant in ("optimized", "lazy"):
            be.lazy_kinematics = variant == "lazy"  # eager, or as shipped
            be.set_state(ids, q, v)
        else:
            published.make_floor(be, ids, q, v)()
        untouched = published.final_state(be, other)
        for field in before:  # the other rows keep every bit
            np.testing.assert_array_equal(untouched[field], before[field], err_msg=field)
        after[variant] = published.final_state(be, ids)
        be.close()
    ref = after["baseline"]
    assert not np.allclose(ref["qvel"], 0.0)  # the inputs were really written
    for variant in ("optimized", "lazy", "floor"):
        for field, want in ref.items():
            np.testing.assert_array_equal(after[variant][field], want,
                                          err_msg=f"{variant} {field}")


@pytest.mark.parametrize("name", BACKENDS)
def test_optimized_timing_has_the_16_keys_and_fresh_poses(name: str) -> None:
    be = make_backend(name, num_envs=N, recorder=Recorder(), nthread=2)
    rng = np.random.default_rng(3)
    for lazy in (True, False):
        be.lazy_kinematics = lazy
        for k in (3, 17, N):  # k = N grows the scratch rows past any earlier size
            ids, q, v = ab.make_inputs(be, k, rng)
            out = be.set_state(ids, q, v)
            assert out is not None
            assert tuple(out["timing"]) == C.SET_STATE_KEYS
            assert all(t >= 0.0 for t in out["timing"].values())
            # FK inside set_state only when eager, and on MotrixSim inside the reset call
            fk = out["timing"]["set_state_forward_kinematic_ms"]
            assert (fk > 0.0) is (not lazy and name == "mujoco"), (lazy, fk)
            # the pose cache is refreshed where poses are read: the base lands where qpos
            # put it
            pose = be.get_body_pose_rows(ids, ["pelvis"])[:, 0]
            np.testing.assert_allclose(pose[:, :3], q[:, :3], atol=1e-5)
    be.close()


def test_baseline_validates_like_the_shipped_path() -> None:
    be = make_backend("motrix", num_envs=16, recorder=Recorder(), nthread=2)
    q = np.tile(be.keyframe_qpos, (2, 1))
    v = np.zeros((2, be.nv))
    for ids in ([3, 3], [0, 16], np.array([True, False])):
        with pytest.raises(ValueError):
            published.baseline_set_state(be, ids, q, v)
        with pytest.raises(ValueError):
            be.set_state(ids, q, v)
    be.close()


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        ab.SetStateABConfig(backends=("bullet",))
    with pytest.raises(ValueError, match="ratios"):
        ab.SetStateABConfig(ratios=(0.0,))
    with pytest.raises(ValueError, match="fixed-k"):
        ab.SetStateABConfig(num_envs=(64,), fixed_k=82)
    for idle in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="idle-us"):
            ab.SetStateABConfig(idle_us=idle)
    for seconds in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="min-seconds"):
            ab.SetStateABConfig(min_seconds=seconds)


def test_short_cells_run_rounds_until_min_seconds() -> None:
    """A cell whose rounds are short runs as many as its warmup says fill min_seconds (at
    least ``calls``); min_seconds 0 runs ``calls``."""
    base = dict(backends=("mujoco",), num_envs=(32,), ratios=(0.1,), calls=3, warmup=2,
                fixed_k=0, nthread=1, idle_us=0.0)
    (cell,) = ab.run_set_state_ab(ab.SetStateABConfig(**base, min_seconds=0.3))["cells"]
    assert cell["calls"] > 3
    (cell,) = ab.run_set_state_ab(ab.SetStateABConfig(**base, min_seconds=0.0))["cells"]
    assert cell["calls"] == 3


def test_every_timed_and_warm_up_call_follows_the_idle_time(monkeypatch) -> None:
    """Each variant's call, and each fixed-k call, comes after ``idle_us`` of busy Python,
    as a reset comes after the env's own work: none finds the engine's pool still awake
    from the call before."""
    waits: list[int] = []
    monkeypatch.setattr(ab, "_busy", waits.append)
    cfg = ab.SetStateABConfig(backends=("mujoco",), num_envs=(32,), ratios=(0.25,),
                              calls=3, warmup=2, fixed_k=4, nthread=1, idle_us=250.0,
                              min_seconds=0.0)
    ab.run_set_state_ab(cfg)
    per_cell = (cfg.warmup + cfg.calls) * len(ab.VARIANTS)
    assert waits == [250_000] * (per_cell + cfg.warmup + cfg.calls)


def test_cli_writes_the_json_schema(tmp_path) -> None:
    path = tmp_path / "ab.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "bench", "set-state-ab",
                        "--num-envs", "64", "128", "--ratios", "0.05", "--calls", "3",
                        "--min-seconds", "0.1",
                        "--warmup", "1", "--fixed-k", "4", "--nthread", "1",
                        "--backends", "mujoco", "motrix", "--idle-us", "200",
                        "--json", str(path)],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "set_state A/B, motrix" in r.stdout and "fixed k=4" in r.stdout
    doc = json.loads(path.read_text())
    assert doc["config"]["idle_us"] == 200.0
    cells = doc["cells"]
    assert {(c["backend"], c["num_envs"]) for c in cells} == {
        (b, n) for b in BACKENDS for n in (64, 128)}
    for c in cells:
        assert {"backend", "num_envs", "ratio", "k", "baseline_ms", "optimized_ms",
                "lazy_ms", "floor_ms", "speedup", "lazy_floor_ratio", "keys"} <= set(c)
        assert c["lazy_floor_ratio"] == pytest.approx(c["lazy_ms"] / c["floor_ms"])
        assert c["aa_ratio"] == pytest.approx(c["floor_aa_ms"] / c["floor_ms"])
        for ci in (c["floor_ratio_ci"], c["aa_ratio_ci"]):  # 3 rounds: an interval
            assert 0.0 < ci[0] <= ci[1]
        assert c["k"] == round(0.05 * c["num_envs"]) and c["ratio"] == 0.05
        assert c["calls"] >= 3
        assert set(c["keys"]) == set(C.SET_STATE_KEYS)
        assert min(c["baseline_ms"], c["optimized_ms"], c["floor_ms"]) > 0.0
        assert c["speedup"] == pytest.approx(c["baseline_ms"] / c["optimized_ms"])
        for v in c["keys"].values():
            assert {"baseline_ms", "optimized_ms", "lazy_ms", "speedup"} == set(v)
    assert [f["backend"] for f in doc["fixed_k"]] == list(BACKENDS)
    assert all(f["num_envs"] == [64, 128] and f["ratio"] > 0 for f in doc["fixed_k"])
    bad = subprocess.run([sys.executable, "-m", "resettrace.cli", "bench", "set-state-ab",
                          "--ratios", "1.5"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "ratios" in bad.stderr
