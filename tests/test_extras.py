"""The optional parts: each names its extra in one line when its packages are missing (a
module set to None in ``sys.modules`` is one Python cannot import), or installed at a
version the extra excludes, before any work; tracing itself never needs them."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

import resettrace
from resettrace import catalog as C
from resettrace import cli
from resettrace.costmodel import FitSums, model_section
from resettrace.extras import EXTRAS, MissingExtra, need, require


def _missing(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for m in modules:
        for name in [n for n in sys.modules if n == m or n.startswith(m + ".")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, m, None)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("argv", "extra", "module"), [
    (["bench", "overhead", "--rounds", "1"], "sim", "mujoco"),
    (["bench", "set-state-ab"], "sim", "numba"),
    (["compare", "a.json", "b.json"], "report", "scipy"),
    (["fit", "a.json"], "report", "scipy"),
    (["report", "a.json"], "report", "plotly"),
    (["bench", "collector", "--steps", "1", "--report"], "report", "plotly"),
])
def test_a_command_without_its_extra_names_it_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path, argv: list[str], extra: str, module: str) -> None:
    monkeypatch.chdir(tmp_path)
    _missing(monkeypatch, module)
    assert cli.main(argv) == 2
    err = _one_line(capsys)
    command = " ".join(["resettrace"] + argv[:2 if argv[0] == "bench" else 1])
    assert err == (f"resettrace: {command} needs resettrace's '{extra}' extra ({module} is "
                   f"not installed): pip install 'resettrace[{extra}]'")
    assert not list(tmp_path.iterdir())  # nothing done


@pytest.mark.parametrize(("stack", "extra", "module"), [
    ("mjlab", "mjlab", "mjlab"),
    ("gymnasium", "sim", "mujoco"),
])
def test_bench_stacks_names_the_extra_of_the_stack_it_was_given(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path, stack: str, extra: str, module: str) -> None:
    monkeypatch.chdir(tmp_path)
    _missing(monkeypatch, module)
    assert cli.main(["bench", "stacks", "--stack", stack, "--rounds", "3"]) == 2
    assert _one_line(capsys) == (
        f"resettrace: resettrace bench stacks --stack {stack} needs resettrace's '{extra}' "
        f"extra ({module} is not installed): pip install 'resettrace[{extra}]'")
    assert not list(tmp_path.iterdir())


def test_make_env_without_the_sim_extra_raises_before_anything_loads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _missing(monkeypatch, "motrixsim")
    with pytest.raises(MissingExtra, match=r"resettrace.make_env needs resettrace's 'sim' "
                                           r"extra \(motrixsim is not installed\)") as e:
        resettrace.make_env("g1_walk_flat", num_envs=2)
    assert isinstance(e.value, ImportError) and e.value.extra == "sim"
    with pytest.raises(MissingExtra, match="the mujoco backend needs"):
        resettrace.make_backend("mujoco", num_envs=2)
    with pytest.raises(ValueError, match="unknown backend 'nope'"):  # names first
        resettrace.make_backend("nope", num_envs=2)


def test_an_extra_installed_at_a_version_it_excludes_is_named_with_both(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """mjlab 1.6 pins mujoco 3.11: the tracer works beside it, the reference path says
    why it does not (this install's own requirement, read from its metadata)."""
    from resettrace import extras

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "3.11.0" if name == "mujoco" else real(name))
    extras._unmet.cache_clear()
    try:
        with pytest.raises(MissingExtra) as e:
            require("sim", "the mujoco backend")
        assert str(e.value) == ("the mujoco backend needs resettrace's 'sim' extra (mujoco "
                                "3.11.0 is installed, the extra needs mujoco>=4.0): "
                                "pip install 'resettrace[sim]'")
        _missing(monkeypatch, "motrixsim")  # (mjlab's venv: no MotrixSim either)
        with pytest.raises(MissingExtra, match=r"\(mujoco 3.11.0 is installed, the extra "
                                               r"needs mujoco>=4.0\)"):
            require("sim", "the mujoco backend")
    finally:
        monkeypatch.undo()
        extras._unmet.cache_clear()
    require("sim", "the mujoco backend")  # the real install fits


def test_need_keeps_a_broken_module_s_own_error(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    (tmp_path / "brokenmod.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as e:
        need("brokenmod", "report", "x")
    assert not isinstance(e.value, MissingExtra)
    assert e.value.name == "no_such_module_anywhere"


def test_every_extra_is_declared_in_the_install_s_metadata() -> None:
    declared = importlib.metadata.metadata("resettrace").get_all("Provides-Extra") or []
    assert set(EXTRAS) | {"all"} <= set(declared)


def test_a_run_record_written_without_scipy_keeps_the_sums_that_fit_reads(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Tracing never needs the report extra: without SciPy the record's model has its
    sums and no fit; ``resettrace fit`` (with it) fits the same numbers."""
    sums = FitSums()
    k = np.array([1.0, 2.0, 4.0, 8.0, 3.0])
    sums.add(k, 0.5 + 0.25 * k + np.array([0.01, -0.02, 0.0, 0.01, 0.0]))
    full = model_section({"set_state_ms": sums})
    with monkeypatch.context() as m:
        _missing(m, "scipy")
        light = model_section({"set_state_ms": sums})
    assert light["keys"]["set_state_ms"]["fit"] is None
    assert light["keys"]["set_state_ms"]["sums"] == full["keys"]["set_state_ms"]["sums"]
    fitted = FitSums.from_dict(light["keys"]["set_state_ms"]["sums"]).fit().as_dict()
    assert fitted == full["keys"]["set_state_ms"]["fit"]


def test_prometheus_metrics_without_the_extra_warn_naming_it_and_training_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from resettrace.config import Config
    from resettrace.tracing.session import Tracing

    _missing(monkeypatch, "prometheus_client")
    with caplog.at_level(logging.WARNING):
        session = Tracing(Config(mode="timing", metrics=("prometheus",)))
    try:
        rec = session.recorder(backend="plain", task="t", env_count=2)
        with rec.scope(C.SET_STATE, 1):
            pass
        assert session.aggregator.stats()[C.SET_STATE.key].count == 1
    finally:
        session.shutdown()
    said = [r.getMessage() for r in caplog.records if "prometheus" in r.getMessage()]
    assert said == ["resettrace: RESETTRACE_METRICS=prometheus needs resettrace's "
                    "'prometheus' extra (prometheus_client is not installed): "
                    "pip install 'resettrace[prometheus]'"]


def test_configure_with_a_mode_string_says_how_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"configure\(mode='timing'\)\?"):
        resettrace.configure("timing")  # type: ignore[arg-type]


def test_the_extras_are_named_alike_in_pyproject_and_the_docs() -> None:
    root = Path(__file__).resolve().parents[1]
    text = (root / "pyproject.toml").read_text()
    readme = (root / "README.md").read_text()
    for extra in [*EXTRAS, "all"]:
        assert f"\n{extra} = [" in text
        assert f"resettrace[{extra}]" in readme
    json.dumps(EXTRAS)  # (plain data)
