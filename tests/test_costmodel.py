"""The cost model a + b*k: synthetic data with known answers, the processor's exact sums
from real recorder traces, and ``resettrace fit`` / ``compare`` on real collector runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import FakeClock
from resettrace import catalog as C
from resettrace.costmodel import FitSums, fit_cells, fit_with_n
from resettrace.tracing.session import Tracing


def _sums(k: np.ndarray, y: np.ndarray) -> FitSums:
    s = FitSums()
    s.add(k.astype(np.float64), y.astype(np.float64))
    return s


def test_a_and_b_are_recovered_with_intervals_that_hold_them() -> None:
    rng = np.random.default_rng(1)
    k = rng.integers(0, 200, 5000)
    y = 0.2 + 0.004 * k + rng.normal(0, 0.02, k.size)
    f = _sums(k, y).fit()
    assert f.a_ci is not None and f.b_ci is not None and f.b_ms is not None
    assert f.a_ci[0] < 0.2 < f.a_ci[1] and f.b_ci[0] < 0.004 < f.b_ci[1]
    assert abs(f.b_ms - 0.004) < 1e-4 and f.r2 is not None and f.r2 > 0.9
    assert not f.fixed
    # the same answer as scipy's regression on the points themselves
    from scipy import stats

    ref = stats.linregress(k, y)
    assert f.b_ms == pytest.approx(ref.slope, rel=1e-9)
    assert f.a_ms == pytest.approx(ref.intercept, rel=1e-9)
    assert f.b_se == pytest.approx(ref.stderr, rel=1e-6)
    assert f.a_se == pytest.approx(ref.intercept_stderr, rel=1e-6)
    assert f.r2 == pytest.approx(ref.rvalue ** 2, rel=1e-9)


def test_a_cost_that_does_not_depend_on_k_is_fixed() -> None:
    rng = np.random.default_rng(2)
    k = rng.integers(1, 60, 4000)
    f = _sums(k, 0.3 + rng.normal(0, 0.05, k.size)).fit()
    assert f.fixed and f.b_ci is not None and f.b_ci[0] < 0 < f.b_ci[1]
    same_k = _sums(np.full(50, 7), rng.normal(1.0, 0.1, 50)).fit()
    assert same_k.b_ms is None and same_k.fixed  # k never varied: a is the mean
    assert same_k.a_ms == pytest.approx(same_k.mean_ms)


def test_sums_merge_like_one_run() -> None:
    rng = np.random.default_rng(3)
    k = rng.integers(0, 100, 3000)
    y = 0.1 + 0.002 * k + rng.normal(0, 0.01, k.size)
    whole = _sums(k, y)
    parts = _sums(k[:1000], y[:1000])
    parts.merge(FitSums.from_dict(json.loads(json.dumps(_sums(k[1000:], y[1000:]).as_dict()))))
    assert parts.fit().b_ms == pytest.approx(whole.fit().b_ms, rel=1e-9)
    assert parts.fit().a_ms == pytest.approx(whole.fit().a_ms, rel=1e-9)


def test_hidden_o_n_work_shows_across_env_counts() -> None:
    rng = np.random.default_rng(4)

    points: list[np.ndarray] = []

    def runs(c_per_1k: float) -> list[tuple[int, FitSums]]:
        out = []
        points.clear()
        for n in (256, 1024, 4096):
            k = rng.integers(0, n // 20, 2000)
            y = 0.05 + 0.003 * k + c_per_1k * n / 1000 + rng.normal(0, 0.01, k.size)
            out.append((n, _sums(k, y)))
            points.append(np.c_[np.ones(k.size), k, np.full(k.size, n / 1000), y])
        return out

    grows = fit_with_n(runs(0.02))
    assert grows is not None and grows.grows_with_n
    assert abs(grows.c_ms_per_1k_envs - 0.02) < 4 * grows.c_se
    assert abs(grows.b_ms - 0.003) < 4 * grows.b_se
    # the same answer as least squares on the stacked calls
    d = np.concatenate(points)
    beta, sse, *_ = np.linalg.lstsq(d[:, :3], d[:, 3], rcond=None)
    se = np.sqrt(np.diag(sse[0] / (len(d) - 3) * np.linalg.inv(d[:, :3].T @ d[:, :3])))
    np.testing.assert_allclose([grows.a_ms, grows.b_ms, grows.c_ms_per_1k_envs], beta,
                               rtol=1e-7)
    np.testing.assert_allclose([grows.a_se, grows.b_se, grows.c_se], se, rtol=1e-5)
    flat = fit_with_n(runs(0.0))
    assert flat is not None and not flat.grows_with_n
    assert fit_with_n(runs(0.0)[:1]) is None  # one env count: nothing to fit on N
    cells = [(n, k, 0.05 + 0.003 * k + 0.02 * n / 1000) for n in (512, 1024, 4096)
             for k in (5, 20, 80)]
    exact = fit_cells(cells)
    assert exact is not None and exact.c_ms_per_1k_envs == pytest.approx(0.02, abs=1e-9)


def test_the_processor_fits_every_call_of_real_traces(clock: FakeClock) -> None:
    """reset_done costs exactly 50 us + 3 us per env here (the recorder's clock): the fit
    over the processor's sums is exact; env steps that reset nothing count as k = 0."""
    session = Tracing(__import__("resettrace").Config(mode="timing"))
    rec = session.recorder(backend="test")
    for i in range(60):
        k = (i * 7) % 40
        with rec.scope(C.ENV_STEP):
            clock.now += 1_000_000  # physics: 1 ms whatever k
            if k:
                with rec.scope(C.RESET_DONE, k):
                    clock.now += 50_000 + 3_000 * k
    sums = session.aggregator.fit_sums()  # type: ignore[union-attr]
    f = sums[C.RESET_DONE.key].fit()
    assert f.a_ms == pytest.approx(0.05, abs=1e-9) and f.b_ms == pytest.approx(0.003, abs=1e-9)
    assert f.r2 == pytest.approx(1.0) and not f.fixed
    step = sums[C.ENV_STEP.key]
    assert step.n == 60 and step.kmin == 0  # every step, those with no reset at k = 0
    model = session.cost_model()
    assert model["keys"][C.RESET_DONE.key]["fit"]["b_ms"] == pytest.approx(0.003, abs=1e-9)
    session.shutdown()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resettrace.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_fit_and_compare_cli_on_real_runs(tmp_path: Path) -> None:
    for n in (16, 64):
        r = _cli("bench", "collector", "--num-envs", str(n), "--steps", "120", "--warmup", "5",
                 "--nthread", "1", "--action-noise", "2", "--out", str(tmp_path / f"n{n}"))
        assert r.returncode == 0, r.stderr
        model = json.loads((tmp_path / f"n{n}" / "timing.json").read_text())["model"]
        fit = model["keys"]["dr_reset_set_state_ms"]["fit"]
        # the fit reproduces the mean cost (a alone can fall below 0: the lazy set_state of
        # a few rows has almost no fixed cost, and its intercept is noise around that)
        assert fit["n"] > 0 and fit["mean_ms"] > 0
        assert fit["a_ms"] + fit["b_ms"] * fit["k_mean"] == pytest.approx(fit["mean_ms"],
                                                                          rel=1e-6)
    out = tmp_path / "fit.json"
    r = _cli("fit", str(tmp_path / "n16"), str(tmp_path / "n64"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "cost model per call" in r.stdout and "c us/1k envs" in r.stdout
    result = json.loads(out.read_text())
    assert result["env_counts"] == [16, 64]
    joint = result["keys"]["dr_reset_set_state_ms"]["with_n"]
    assert joint is not None and joint["env_counts"] == [16, 64]
    cmp_ = _cli("compare", str(tmp_path / "n16"), str(tmp_path / "n64"))
    assert "cost model per call" in cmp_.stdout and "dr_reset_set_state_ms" in cmp_.stdout
    for bad, said in (([str(tmp_path / "none")], "no such run"),
                      ([str(tmp_path / "fit.json")], "not a resettrace run record")):
        r = _cli("fit", *bad)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr
