"""What instrumenting a real stack needs: named instrumentations (shipped and from entry
points), targets limited to a phase or given a constant count, native submodules, laps
by span name and counts set inside a scope, a misplaced phase said once per parent."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import resettrace
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.instrumentation import InstrumentError, instrument
from resettrace.tracing.session import Tracing


@pytest.fixture
def session() -> Tracing:
    s = Tracing(Config(mode="timing"))
    with resettrace.use_tracing(s):
        yield s
    s.shutdown()


def test_a_lap_named_by_its_span_works_with_tracing_on(session: Tracing) -> None:
    """``lap="set_state.mask"`` raised ``TypeError: list indices must be integers`` with
    tracing on (a Phase worked; the name worked only with tracing off)."""
    rec = session.recorder()
    with rec.scope("set_state", 4, lap="set_state.mask") as outer:
        outer.lap("set_state.set_dof_pos")
    stats = session.stats()
    assert stats["set_state_mask_ms"].count == stats["set_state_set_dof_pos_ms"].count == 1
    with resettrace.NOOP_RECORDER.scope("set_state", 4, lap="set_state.mask"):
        pass


def test_a_scopes_count_is_set_while_it_is_open(session: Tracing) -> None:
    """The done mask is computed inside the code being timed: the count comes after the
    scope opened."""
    rec = session.recorder()
    with rec.scope(C.RESET_DONE) as scope:
        assert scope.count is None
        scope.count = 5
        assert scope.count == 5
    with rec.scope(C.RESET_DONE) as scope:
        scope.set_count(np.array([True, False, True]))  # a mask counts its True values
    with resettrace.NOOP_RECORDER.scope(C.RESET_DONE) as off:
        off.count = 3
    stats = session.stats()
    assert stats[C.RESET_DONE_COUNT].count == 2 and stats[C.RESET_DONE_COUNT].total_ms == 7.0


MODULE = """
    import numpy as np

    class Engine:
        def write(self, rows):          # runs on the step path and on the reset path
            return len(rows)

    class Env:
        def __init__(self):
            self.engine = Engine()
            self.done = np.zeros(8, bool)

        def step(self):
            self.engine.write([0] * 8)  # the step path: not a reset
            self.done[:] = False
            self.done[::3] = True
            self.reset_done()

        def reset_done(self):
            self.set_state(np.flatnonzero(self.done))

        def set_state(self, ids):
            self.engine.write(ids)      # the reset path

        def reset_one(self):
            return 0
"""


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"ti_stack_{os.getpid()}_{len(os.listdir(tmp_path))}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_within_records_a_shared_method_on_the_reset_path_only(session: Tracing,
                                                               stack: str) -> None:
    """A method both paths call (MotrixLab's write program, ReadPlan.read) counted 512
    calls for 192 resets: with ``within`` it counts the reset path's calls only."""
    undo = instrument({"instrument": {
        f"{stack}:Env.step": "env_step",
        f"{stack}:Env.reset_done": {"phase": "reset_done", "count": "self.done"},
        f"{stack}:Env.set_state": {"phase": "set_state", "count": "ids"},
        f"{stack}:Engine.write": {"phase": "set_state.data_reset", "within": "set_state"},
        f"{stack}:Env.reset_one": {"phase": "dr_reset", "count": 1}}})
    try:
        import importlib

        mod = importlib.import_module(stack)
        env = mod.Env()
        for _ in range(10):
            env.step()
            env.reset_one()
    finally:
        undo()
    stats = session.stats()
    assert stats["env_step_total_ms"].count == 10
    assert stats["set_state_data_reset_ms"].count == stats["dr_reset_set_state_ms"].count == 10
    assert stats[C.RESET_DONE_COUNT].total_ms == 30.0  # 3 of 8 envs a step
    assert stats["dr_reset_total_ms"].count == 10  # the constant count
    assert stats[C.RESET_DONE_COUNT].count == 10  # (dr_reset alone: no reset_done count)


def test_a_native_method_of_an_extension_submodule_is_a_target(session: Tracing) -> None:
    """``motrixsim.write`` is registered by ``motrixsim`` when it loads: it was refused with
    "no module named 'motrixsim.write'"."""
    code = textwrap.dedent("""
        import resettrace
        undo = resettrace.instrument({"instrument": {
            "motrixsim.write:WriteProgram.execute": {"phase": "set_state.data_reset",
                                                     "within": "set_state"}}})
        import motrixsim.write
        print(getattr(motrixsim.write.WriteProgram.execute, "__resettrace_phase__").span)
        undo()
        print(hasattr(motrixsim.write.WriteProgram.execute, "__resettrace_phase__"))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, RUST_LOG="error"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["set_state.data_reset", "False"]


def _dist(tmp_path: Path, name: str, version: str, target: str) -> Path:
    """A distribution on a path of its own, with one resettrace instrumentation entry
    point (as a third party's package installs it)."""
    site = tmp_path / "site"
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[resettrace.instrumentations]\nmystack = {target}\n")
    (site / "mystack_inst.py").write_text(textwrap.dedent(f"""
        from resettrace.stacks import Instrumentation
        import json

        INSTRUMENTATION = Instrumentation(
            name="mystack", distribution={name!r}, supported=">=1.0,<2",
            spec=lambda: {{"instrument": {{"json:dumps": "env_step"}}}},
            install=lambda: (lambda: print("bridge undone")))
    """))
    return site


@pytest.mark.parametrize("version,warned", [("1.4.2", False), ("2.0.1", True)])
def test_an_instrumentation_from_an_entry_point_by_name(tmp_path: Path, version: str,
                                                        warned: bool) -> None:
    site = _dist(tmp_path, "mystack-core", version, "mystack_inst:INSTRUMENTATION")
    code = textwrap.dedent("""
        import json, resettrace
        resettrace.configure(mode="timing")
        undo = resettrace.instrument("mystack")
        json.dumps(1); json.dumps(2)
        print(resettrace.stats()["env_step_total_ms"].count)
        undo()
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=str(site)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "bridge", "undone"]
    assert ("was written for mystack-core >=1.0,<2; 2.0.1 is installed" in r.stderr) == warned


def test_an_instrumentation_of_a_stack_that_is_not_installed_is_one_line(
        tmp_path: Path) -> None:
    site = _dist(tmp_path, "mystack-core", "1.0", "mystack_inst:INSTRUMENTATION")
    (site / "mystack_inst.py").write_text((site / "mystack_inst.py").read_text().replace(
        "'mystack-core'", "'not-installed-stack'"))
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "run", "--instrument",
                        "mystack", "--", sys.executable, "-c", "print('ran')"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(site)))
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "not-installed-stack, which is not installed" in lines[0]


def test_an_unknown_name_lists_the_known_instrumentations() -> None:
    with pytest.raises(InstrumentError, match="known: gymnasium, mjlab, motrixlab, sb3"):
        instrument("motrixlabb")
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "run", "--instrument",
                        "motrixlabb", "--", sys.executable, "-c", "print('ran')"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr


def test_each_misplaced_phase_and_parent_is_said_once(session: Tracing,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Only the first misplaced phase was ever said: a second one, elsewhere, went
    unnoticed."""
    a = resettrace.register_phase("dr_reset.ti_misplaced_a", parent="dr_reset")
    b = resettrace.register_phase("dr_reset.ti_misplaced_b", parent="dr_reset")
    rec = session.recorder()
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        for _ in range(3):
            for parent, phase in (("reset_done", a), ("env_step", b), ("set_state", a)):
                with rec.scope(parent):
                    with rec.scope(phase):
                        pass
        session.stats()
    said = [r.getMessage() for r in caplog.records if "registered parent" in r.getMessage()]
    assert len(said) == 3, said
    for phase, parent in ((a, "reset_done"), (b, "env_step"), (a, "set_state")):
        assert any(f"{phase.span!r} was recorded under {parent!r}" in m for m in said)


def test_parents_opens_the_missing_levels_of_one_call(session: Tracing, stack: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A Gymnasium sub-env's reset is reset_done, its reset call, dr_reset and set_state in
    one call: ``parents = true`` opens the levels that are not open, with its count."""
    undo = instrument({"instrument": {
        f"{stack}:Env.step": "env_step",
        f"{stack}:Env.reset_one": {"phase": "set_state", "count": 1, "parents": True}}})
    try:
        import importlib

        mod = importlib.import_module(stack)
        env = mod.Env()
        rec = session.recorder()
        with caplog.at_level(logging.WARNING, logger="resettrace"):
            env.reset_one()                      # at the root: every level below env_step
            with rec.scope("env_step"):
                env.reset_one()                  # under env_step: the same four
                with rec.scope("reset_done", 5):
                    with rec.scope("reset_done.reset_call"):
                        with rec.scope("dr_reset", 5):
                            env.reset_one()      # dr_reset open: set_state only
            stats = session.stats()
    finally:
        undo()
    assert stats["dr_reset_set_state_ms"].count == 3
    assert stats["dr_reset_total_ms"].count == stats["reset_done_ms"].count == 3
    assert stats[C.RESET_DONE_COUNT].total_ms == 1 + 1 + 5
    assert "env_step_total_ms" not in stats or stats["env_step_total_ms"].count == 1
    assert not [r for r in caplog.records if "registered parent" in r.getMessage()]
    with pytest.raises(InstrumentError, match="parents must be true or false"):
        instrument({"instrument": {f"{stack}:Env.reset_one": {"phase": "set_state",
                                                               "parents": "yes"}}})


def test_recording_and_the_innermost_open_phase(session: Tracing) -> None:
    from resettrace.tracing.api import recording
    from resettrace.tracing.recorder import NO_COUNT

    rec = session.recorder()
    with resettrace.use_tracing(Tracing(Config(mode="off"))):
        assert recording() is None
    assert rec.innermost() is None
    with rec.scope("reset_done", 4):
        with rec.scope("reset_done.reset_call"):
            assert recording() is not None
            assert recording().innermost() == (  # type: ignore[union-attr]
                C.RESET_DONE_RESET_CALL, NO_COUNT)
        assert rec.innermost() == (C.RESET_DONE, 4)


def test_code_run_when_a_module_is_imported(stack: str, caplog: pytest.LogCaptureFixture
                                            ) -> None:
    """What an instrumentation's own code (MotrixLab's profiler bridge) patches a module
    the training code imports later with; a callback that fails never breaks the import."""
    from resettrace.instrumentation import when_imported

    seen: list[str] = []
    when_imported(stack, lambda m: seen.append(m.__name__))
    when_imported(stack, lambda m: 1 / 0)
    dropped = when_imported(stack, lambda m: seen.append("dropped"))
    dropped()
    import importlib

    with caplog.at_level(logging.WARNING, logger="resettrace"):
        importlib.import_module(stack)
    assert seen == [stack]
    assert any("ZeroDivisionError" in r.getMessage() for r in caplog.records)
    when_imported(stack, lambda m: seen.append("now"))  # already imported: at once
    assert seen == [stack, "now"]
