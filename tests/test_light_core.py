"""``pip install resettrace`` brings the tracer alone: installed into a fresh venv (from a
wheel of this tree, its dependencies from the index), it traces a plain Python env end to
end, exports its spans and writes its run record without importing a simulator, numba,
SciPy or plotly, and a command that needs an extra names it in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("RESETTRACE_PURE_PYTHON", "") not in ("", "0"),
    reason="an install test: make test runs it once, with the compiled recorder")

ROOT = Path(__file__).resolve().parents[1]
#: distributions (and modules) only the extras bring
HEAVY = {"mujoco": "mujoco", "motrixsim": "motrixsim", "numba": "numba", "llvmlite": "llvmlite",
         "scipy": "scipy", "plotly": "plotly", "prometheus-client": "prometheus_client",
         "torch": "torch", "gymnasium": "gymnasium"}

USER_ENV = textwrap.dedent("""
    import json, sys
    import numpy as np
    import resettrace
    from resettrace import catalog as C

    class PlainEnv:  # a user's env: no simulator, its reset path traced by hand
        def __init__(self, n):
            self.n = n
            self.rec = resettrace.recorder(backend="plain", task="walk", env_count=n)
            self.qpos = np.zeros((n, 3))

        def reset_done(self, done):
            with self.rec.scope(C.RESET_DONE, done):
                with self.rec.scope(C.RESET_DONE_RESET_CALL):
                    with self.rec.scope(C.DR_RESET, done):
                        with self.rec.scope(C.SET_STATE, done):
                            self.qpos[done] = 0.0

        def step(self, rng):
            with self.rec.scope(C.ENV_STEP):
                with self.rec.scope(C.PHYSICS):
                    self.qpos += rng.normal(size=self.qpos.shape)
                done = np.abs(self.qpos[:, 0]) > 2.0
                if done.any():
                    self.reset_done(done)
            return int(done.sum())

    resettrace.configure(mode="trace", exporters=(f"file:{sys.argv[1]}",))
    env, rng, resets = PlainEnv(64), np.random.default_rng(0), 0
    for _ in range(200):
        resets += env.step(rng)
    stats = resettrace.stats()
    resettrace.get_tracing().shutdown()
    resettrace.write_run(sys.argv[2])
    heavy = sorted({m.partition(".")[0] for m in sys.modules} & set(sys.argv[3].split(",")))
    print(json.dumps({"resets": resets, "reset_done_count": stats["reset_done_count"].total_ms,
                      "steps": stats[C.ENV_STEP.key].count, "heavy": heavy}))
""")


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding resettrace without extras (a wheel of this tree, built from a
    copy of it: the checkout stays as it is)."""
    base = tmp_path_factory.mktemp("core")
    src = base / "src"
    shutil.copytree(ROOT / "src", src / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--disable-pip-version-check", "-q", "-w", str(base / "wheels"), str(src)])
    assert built.returncode == 0, built.stderr
    wheel = next((base / "wheels").glob("resettrace-*.whl"))
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_NO_")}
    inst = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                 "--disable-pip-version-check", str(wheel)], env=env)
    assert inst.returncode == 0, inst.stderr
    return venv


def test_the_core_install_holds_no_extra_and_its_requirements_are_met(core_venv: Path) -> None:
    listed = _run([str(core_venv / "bin" / "python"), "-m", "pip", "list", "--format", "json",
                   "--disable-pip-version-check"])
    names = {d["name"].lower() for d in json.loads(listed.stdout)}
    assert "resettrace" in names and "numpy" in names and "opentelemetry-sdk" in names
    assert not names & set(HEAVY), names & set(HEAVY)
    check = _run([str(core_venv / "bin" / "python"), "-m", "pip", "check",
                  "--disable-pip-version-check"])
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_core_traces_a_plain_env_end_to_end_without_a_heavy_import(
        core_venv: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(USER_ENV)
    spans, record = tmp_path / "spans.jsonl", tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETTRACE")}
    done = _run([str(core_venv / "bin" / "python"), str(script), str(spans), str(record),
                 ",".join(HEAVY.values())], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    assert out["steps"] == 200 and out["resets"] > 0
    assert out["reset_done_count"] == out["resets"]  # every env reset, counted
    lines = spans.read_text().splitlines()
    names = {json.loads(line)["name"] for line in lines}
    assert {"env_step", "env_step.physics", "reset_done"} <= names
    assert json.loads(record.read_text())["stats"]  # (the run record, with its statistics)

    # what needs an extra says so in one line; what does not, works
    cli = str(core_venv / "bin" / "resettrace")
    rep = _run([cli, "report", str(record), "-o", str(tmp_path / "r.html")], cwd=tmp_path)
    assert rep.returncode == 2 and not (tmp_path / "r.html").exists()
    assert rep.stderr.strip() == ("resettrace: resettrace report needs resettrace's 'report' "
                                  "extra (scipy is not installed): "
                                  "pip install 'resettrace[report]'")
    bench = _run([cli, "bench", "overhead"], cwd=tmp_path)
    assert bench.returncode == 2 and "\n" not in bench.stderr.strip()
    assert "pip install 'resettrace[sim]'" in bench.stderr
    merged = _run([cli, "merge", str(record), "-o", str(tmp_path / "job.json")], cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    api = _run([str(core_venv / "bin" / "python"), "-c",
                "import resettrace; resettrace.make_env('g1_walk_flat', num_envs=2)"])
    assert api.returncode == 1
    assert api.stderr.strip().splitlines()[-1] == (
        "resettrace.extras.MissingExtra: resettrace.make_env needs resettrace's 'sim' extra "
        "(mujoco is not installed): pip install 'resettrace[sim]'")


def test_the_core_resolves_beside_mjlab_1_6_and_its_mujoco_3_11(
        core_venv: Path, tmp_path: Path) -> None:
    """mjlab 1.6.0 pins ``mujoco~=3.11.0``: with the simulators in an extra, pip resolves
    both (the plan only: mjlab's torch and Warp are gigabytes; the real install and its
    ``pip check`` are in docs/benchmarks.md)."""
    wheel = next((core_venv.parent / "wheels").glob("resettrace-*.whl"))
    plan = tmp_path / "plan.json"
    got = _run([str(core_venv / "bin" / "python"), "-m", "pip", "install", "-q", "--dry-run",
                "--disable-pip-version-check", "--ignore-installed", "--report", str(plan),
                str(wheel), "mjlab==1.6.0"])
    assert got.returncode == 0, got.stderr  # (it was ResolutionImpossible)
    versions = {i["metadata"]["name"].lower(): i["metadata"]["version"]
                for i in json.loads(plan.read_text())["install"]}
    assert versions["mjlab"] == "1.6.0" and versions["resettrace"] == "0.1.0"
    assert versions["mujoco"].startswith("3.11.")
