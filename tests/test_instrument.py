"""Zero-code instrumentation: ``instrument(spec)``, its import hook and undo, spec errors,
``RESETTRACE_INSTRUMENT`` and ``resettrace run -- COMMAND`` end to end.

User modules are written to ``tmp_path`` under names unique to the test and dropped
from ``sys.modules`` afterwards. Phases registered in this process are roots of their
own (``test_instrument.*``): a child of ``set_state`` would add a key to every later
set_state timing dict, so that case runs in a subprocess.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import resettrace as rt
from resettrace.catalog import ATTR_BACKEND, ATTR_ENV_COUNT, ATTR_RESET_COUNT, ATTR_TASK
from resettrace.instrumentation import InstrumentError, check_spec, instrument
from resettrace.tracing.session import default_attributes

ENV_SOURCE = """
    import numpy as np


    class Backend:
        def __init__(self, num_envs):
            self.num_envs = num_envs

        def set_state(self, env_ids, qpos=None):
            return len(env_ids)


    class Env:
        def __init__(self, num_envs=8):
            self.num_envs = num_envs
            self.backend = Backend(num_envs)
            self.done = np.zeros(num_envs, dtype=bool)

        def step(self, finished):
            self.done[:] = False
            self.done[list(finished)] = True
            return ("stepped", self.reset_done())

        def reset_done(self):
            return self.backend.set_state(np.flatnonzero(self.done))
"""

KINDS_SOURCE = """
    def reset_rows(env_ids):
        return sum(int(i) for i in env_ids)


    class Base:
        scale = 2

        @staticmethod
        def double(x):
            return 2 * x

        @classmethod
        def make(cls, n):
            return (cls.__name__, n)

        def method(self, x):
            return x + 1

        @property
        def prop(self):
            return 1


    class Sub(Base):
        pass


    class SubSub(Sub):
        pass


    class Outer:
        class Inner:
            def run(self):
                return "inner"
"""


def _spec(mod: str) -> dict[str, Any]:
    """The env module's three nested targets."""
    return {"instrument": {
        f"{mod}:Env.step": "env_step",
        f"{mod}:Env.reset_done": {"phase": "reset_done", "count": "self.done"},
        f"{mod}:Backend.set_state": {"phase": "set_state", "count": "env_ids",
                                     "env_count": "self.num_envs"},
    }}


@contextlib.contextmanager
def installed(spec: Mapping[str, Any] | str | os.PathLike[str]) -> Iterator[Callable[[], None]]:
    undo = instrument(spec)
    try:
        yield undo
    finally:
        undo()


def _counts(capture: Any) -> dict[str, int]:
    return {key: s["count"] for key, s in capture.stats().items()}


def _traced(fn: Any) -> bool:
    return getattr(fn, "__resettrace_phase__", None) is not None


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """``make(suffix, source, load=True)``: write ``ti_<test>_<suffix>.py`` to tmp_path
    (on sys.path); import it (``load``) or return its name. Dotted suffixes make packages."""
    monkeypatch.syspath_prepend(str(tmp_path))
    stem = "ti_" + re.sub(r"\W", "_", request.node.name)
    names: list[str] = []

    def make(suffix: str, source: str = "", *, load: bool = True) -> Any:
        name = f"{stem}_{suffix}"
        parts = name.split(".")
        folder = tmp_path.joinpath(*parts[:-1])
        for i in range(1, len(parts)):
            pkg = tmp_path.joinpath(*parts[:i])
            pkg.mkdir(exist_ok=True)
            (pkg / "__init__.py").touch()
            names.append(".".join(parts[:i]))
        (folder / f"{parts[-1]}.py").write_text(textwrap.dedent(source))
        names.append(name)
        importlib.invalidate_caches()
        return importlib.import_module(name) if load else name

    yield make
    for name in names:
        sys.modules.pop(name, None)


# -- modules already imported ----------------------------------------------------------------
def test_imported_module_is_patched_at_once_and_records_nested_calls(
        resettrace: Any, make_module: Callable[..., Any]) -> None:
    mod = make_module("env", ENV_SOURCE)
    originals = {name: mod.Env.__dict__[name] for name in ("step", "reset_done")}
    with installed(_spec(mod.__name__)):
        assert _traced(mod.Env.__dict__["step"]) and _traced(mod.Env.__dict__["reset_done"])
        assert _traced(mod.Backend.__dict__["set_state"])
        env = mod.Env(8)
        assert env.step([0, 1]) == ("stepped", 2)
        assert env.step([2, 3, 4]) == ("stepped", 3)
        assert env.step([]) == ("stepped", 0)
        assert mod.Env.step.__name__ == "step"  # functools.wraps
        # env_count: read once from the first set_state call onto the recorder
        assert rt.current_recorder().attributes[ATTR_ENV_COUNT] == 8
    counts = _counts(resettrace)
    assert counts["env_step_total_ms"] == 3
    assert counts["reset_done_ms"] == 3
    assert counts["dr_reset_set_state_ms"] == 3
    assert counts["set_state_internal_gap_ms"] == 3
    done = resettrace.stat("reset_done_count")
    assert done["count"] == 3 and done["total_ms"] == 5.0 and done["max_ms"] == 3.0
    # nothing was recorded that was not called
    assert "dr_reset_total_ms" not in counts and "physics_ms" not in counts
    for name, fn in originals.items():
        assert mod.Env.__dict__[name] is fn


def test_undo_restores_the_original_objects_and_stops_recording(
        resettrace: Any, make_module: Callable[..., Any]) -> None:
    mod = make_module("env", ENV_SOURCE)
    originals = {"step": mod.Env.__dict__["step"], "reset_done": mod.Env.__dict__["reset_done"],
                 "set_state": mod.Backend.__dict__["set_state"]}
    undo = instrument(_spec(mod.__name__))
    try:
        env = mod.Env(4)
        env.step([1])
    finally:
        undo()
    assert mod.Env.__dict__["step"] is originals["step"]
    assert mod.Env.__dict__["reset_done"] is originals["reset_done"]
    assert mod.Backend.__dict__["set_state"] is originals["set_state"]
    before = _counts(resettrace)
    assert before["env_step_total_ms"] == 1
    assert env.step([0, 2]) == ("stepped", 2)
    assert _counts(resettrace) == before
    undo()  # a second undo is a no-op
    assert mod.Env.__dict__["step"] is originals["step"]


def test_calls_record_into_the_current_recorder(resettrace: Any,
                                                make_module: Callable[..., Any]) -> None:
    mod = make_module("env", ENV_SOURCE)
    with installed(_spec(mod.__name__)):
        env = mod.Env(4)
        with rt.bind(rt.NOOP_RECORDER):  # tracing off for this block
            assert env.step([0]) == ("stepped", 1)
        assert _counts(resettrace) == {}
        worker = threading.Thread(target=env.step, args=([1, 2],))
        worker.start()
        worker.join()
        env.step([3])
    counts = _counts(resettrace)
    assert counts["env_step_total_ms"] == 2  # the thread's call and this one
    assert resettrace.stat("reset_done_count")["total_ms"] == 3.0


def test_spec_phases_are_registered_and_recorded(resettrace: Any,
                                                 make_module: Callable[..., Any]) -> None:
    mod = make_module("kinds", KINDS_SOURCE)
    spec = {
        "phases": [
            {"span": "test_instrument.rollout", "parent": "",
             "description": "a root phase of the instrument tests"},
            {"span": "test_instrument.rollout.plan", "parent": "test_instrument.rollout",
             "key": "test_instrument_plan_ms"},
        ],
        "instrument": {f"{mod.__name__}:Base.method": "test_instrument.rollout",
                       f"{mod.__name__}:reset_rows": "test_instrument.rollout.plan"},
    }
    with installed(spec):
        assert rt.CATALOG.get("test_instrument.rollout.plan").key == "test_instrument_plan_ms"
        assert mod.Base().method(1) == 2
        assert mod.reset_rows([1, 2]) == 3
        assert mod.reset_rows([]) == 0
    counts = _counts(resettrace)
    assert counts["test_instrument_rollout_ms"] == 1
    assert counts["test_instrument_plan_ms"] == 2


def test_a_toml_file_spec(resettrace: Any, make_module: Callable[..., Any],
                          tmp_path: Path) -> None:
    mod = make_module("env", ENV_SOURCE)
    path = tmp_path / "spec.toml"
    path.write_text(textwrap.dedent(f"""
        [attributes]
        task = "ti-toml"

        [instrument]
        "{mod.__name__}:Env.step" = "env_step"
        "{mod.__name__}:Env.reset_done" = {{ phase = "reset_done", count = "self.done" }}
    """))
    assert check_spec(path) == 2
    assert not _traced(mod.Env.__dict__["step"])  # check_spec patches nothing
    for spec in (path, str(path)):
        with installed(spec):
            assert resettrace.session.recorder().attributes[ATTR_TASK] == "ti-toml"
            mod.Env(4).step([0, 1, 3])
    assert resettrace.stat("env_step_total_ms")["count"] == 2
    assert resettrace.stat("reset_done_count")["total_ms"] == 6.0


def test_the_module_docstring_example_is_a_valid_spec() -> None:
    import resettrace.instrumentation as module

    doc = module.__doc__ or ""
    example = textwrap.dedent(doc[doc.index("    [attributes]"):doc.index("Each target")])
    spec = tomllib.loads(example)
    assert spec["instrument"]["mylab.backend:MyBackend.set_state"] == {
        "phase": "set_state", "count": "env_ids", "env_count": "self.num_envs"}
    assert spec["phases"] == [{"span": "dr_reset.terrain_sample", "parent": "dr_reset"}]
    del spec["phases"]  # not registered here: it would add a key to dr_reset's accounts
    assert check_spec(spec) == 3


# -- modules imported later ------------------------------------------------------------------
def test_module_imported_after_instrument_is_patched_on_import(
        resettrace: Any, make_module: Callable[..., Any]) -> None:
    name = make_module("env", ENV_SOURCE, load=False)
    assert name not in sys.modules
    with installed(_spec(name)):
        assert name not in sys.modules  # instrument() imports nothing
        mod = importlib.import_module(name)
        assert _traced(mod.Env.__dict__["step"])
        assert _traced(mod.Backend.__dict__["set_state"])
        mod.Env(6).step([0, 5])
        mod.Env(6).step([1])
    assert not _traced(mod.Env.__dict__["step"])
    assert not _traced(mod.Backend.__dict__["set_state"])
    counts = _counts(resettrace)
    assert counts["env_step_total_ms"] == 2 and counts["dr_reset_set_state_ms"] == 2
    assert resettrace.stat("reset_done_count")["total_ms"] == 3.0


def test_undo_before_import_leaves_the_module_unpatched(
        resettrace: Any, make_module: Callable[..., Any]) -> None:
    name = make_module("env", ENV_SOURCE, load=False)
    undo = instrument(_spec(name))
    undo()
    mod = importlib.import_module(name)
    assert not _traced(mod.Env.__dict__["step"])
    assert not _traced(mod.Env.__dict__["reset_done"])
    mod.Env(2).step([1])
    assert _counts(resettrace) == {}


def test_submodule_of_a_package_imported_later(resettrace: Any,
                                               make_module: Callable[..., Any]) -> None:
    name = make_module("pkg.backend", ENV_SOURCE, load=False)
    package = name.rpartition(".")[0]
    importlib.import_module(package)  # the package is loaded, its submodule not yet
    with installed({"instrument": {f"{name}:Env.step": "env_step"}}):
        assert name not in sys.modules
        mod = importlib.import_module(name)
        assert _traced(mod.Env.__dict__["step"])
        mod.Env(2).step([0])
    assert resettrace.stat("env_step_total_ms")["count"] == 1


def test_the_lookup_imports_nothing_and_a_package_importing_its_target_patches_it(
        resettrace: Any, make_module: Callable[..., Any], tmp_path: Path) -> None:
    """Checking that ``pkg.sub.env`` exists imports nothing; importing ``pkg.sub``, whose
    ``__init__`` imports ``env``, patches it."""
    name = make_module("pkg.sub.env", ENV_SOURCE, load=False)
    package, sub = name.split(".")[0], name.rpartition(".")[0]
    (tmp_path / package / "sub" / "__init__.py").write_text("from . import " + name.split(".")[-1])
    importlib.import_module(package)
    assert sub not in sys.modules
    with installed({"instrument": {f"{name}:Env.step": "env_step"}}):
        assert sub not in sys.modules and name not in sys.modules
        importlib.import_module(sub)
        mod = sys.modules[name]
        assert _traced(mod.Env.__dict__["step"])
        mod.Env(2).step([1])
    assert not _traced(mod.Env.__dict__["step"])
    assert resettrace.stat("env_step_total_ms")["count"] == 1


# -- kinds of targets ------------------------------------------------------------------------
def test_staticmethod_classmethod_function_and_nested_class(
        resettrace: Any, make_module: Callable[..., Any]) -> None:
    mod = make_module("kinds", KINDS_SOURCE)
    m = mod.__name__
    own = {name: mod.Base.__dict__[name] for name in ("double", "make")}
    reset_rows, run = mod.reset_rows, mod.Outer.Inner.__dict__["run"]
    spec = {"instrument": {
        f"{m}:Base.double": "env_step",
        f"{m}:Base.make": {"phase": "env_step.physics", "count": "n"},
        f"{m}:reset_rows": {"phase": "reset_done", "count": "env_ids"},
        f"{m}:Outer.Inner.run": "env_step.update_state",
    }}
    with installed(spec):
        assert isinstance(mod.Base.__dict__["double"], staticmethod)
        assert isinstance(mod.Base.__dict__["make"], classmethod)
        assert mod.Base.double(3) == 6 and mod.Base().double(4) == 8
        assert mod.Base.make(5) == ("Base", 5) and mod.Sub.make(1) == ("Sub", 1)
        assert mod.Sub().make(2) == ("Sub", 2)
        assert mod.reset_rows(np.array([3, 1, 2])) == 6  # an int array counts its length
        assert mod.reset_rows([4]) == 4
        assert mod.Outer.Inner().run() == "inner"
        assert _traced(mod.reset_rows)
    counts = _counts(resettrace)
    assert counts["env_step_total_ms"] == 2
    assert counts["physics_ms"] == 3
    assert counts["reset_done_ms"] == 2
    assert counts["update_state_ms"] == 1
    done = resettrace.stat("reset_done_count")
    assert done["count"] == 2 and done["total_ms"] == 4.0
    for name, raw in own.items():
        assert mod.Base.__dict__[name] is raw
    assert mod.reset_rows is reset_rows
    assert mod.Outer.Inner.__dict__["run"] is run


def test_inherited_methods_are_wrapped_on_the_subclass_only(
        resettrace: Any, make_module: Callable[..., Any]) -> None:
    mod = make_module("kinds", KINDS_SOURCE)
    m = mod.__name__
    base = {name: mod.Base.__dict__[name] for name in ("method", "double", "make")}
    spec = {"instrument": {f"{m}:Sub.method": "env_step", f"{m}:Sub.double": "reset_done",
                           f"{m}:Sub.make": "env_step.physics"}}
    with installed(spec):
        assert {"method", "double", "make"} <= set(mod.Sub.__dict__)
        assert isinstance(mod.Sub.__dict__["double"], staticmethod)
        assert isinstance(mod.Sub.__dict__["make"], classmethod)
        assert {name: mod.Base.__dict__[name] for name in base} == base
        assert mod.Base().method(1) == 2 and mod.Base.double(1) == 2  # not recorded
        assert mod.Sub().method(1) == 2 and mod.SubSub().method(2) == 3
        assert mod.Sub.double(2) == 4 and mod.Sub().double(3) == 6
        assert mod.Sub.make(1) == ("Sub", 1) and mod.Sub().make(2) == ("Sub", 2)
        assert mod.SubSub.make(3) == ("SubSub", 3)  # cls is the class it is called on
    counts = _counts(resettrace)
    assert counts["env_step_total_ms"] == 2
    assert counts["reset_done_ms"] == 2
    assert counts["physics_ms"] == 3
    # undo drops the wrappers: the base class's methods show through again
    assert not {"method", "double", "make"} & set(mod.Sub.__dict__)
    assert mod.Sub.method is mod.Base.method and mod.Sub.double is mod.Base.double
    assert {name: mod.Base.__dict__[name] for name in base} == base
    assert mod.SubSub.make(4) == ("SubSub", 4)


def test_an_exception_propagates_and_the_call_is_recorded(
        resettrace: Any, make_module: Callable[..., Any]) -> None:
    mod = make_module("fails", """
        def reset(env_ids):
            raise RuntimeError("engine said no")
    """)
    with installed({"instrument": {f"{mod.__name__}:reset": "reset_done"}}):
        with pytest.raises(RuntimeError, match="engine said no"):
            mod.reset([1, 2])
    assert resettrace.stat("reset_done_ms")["count"] == 1


def test_an_unreadable_count_never_breaks_the_call(resettrace: Any,
                                                   make_module: Callable[..., Any]) -> None:
    mod = make_module("env", ENV_SOURCE)
    m = mod.__name__
    spec = {"instrument": {
        f"{m}:Env.reset_done": {"phase": "reset_done", "count": "self.missing"},
        f"{m}:Backend.set_state": {"phase": "set_state", "count": "qpos",
                                   "env_count": "self.nope"},
    }}
    with installed(spec):
        env = mod.Env(4)
        assert env.step([0, 2]) == ("stepped", 2)  # qpos is None: len(None) fails
        assert env.step([1]) == ("stepped", 1)
        assert ATTR_ENV_COUNT not in rt.current_recorder().attributes
    counts = _counts(resettrace)
    assert counts["reset_done_ms"] == 2
    assert counts["dr_reset_set_state_ms"] == 2
    assert "reset_done_count" not in counts  # recorded without a count


def test_trace_spans_carry_counts_and_spec_attributes(
        trace_session: Any, make_module: Callable[..., Any]) -> None:
    mod = make_module("env", ENV_SOURCE)
    spec = {**_spec(mod.__name__), "attributes": {"backend": "ti-trace", "ti.custom": 7}}
    with rt.use_tracing(trace_session), installed(spec):
        env = mod.Env(8)
        env.step([1, 4, 6])
        assert env.backend.set_state(np.arange(5)) == 5  # a root of its own: its own count
    assert trace_session.force_flush()
    spans = trace_session.exporters[0].get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert sorted(by_name) == ["env_step", "reset_done", "set_state"]
    assert by_name["reset_done"][0].attributes[ATTR_RESET_COUNT] == 3
    assert sorted(s.attributes[ATTR_RESET_COUNT] for s in by_name["set_state"]) == [3, 5]
    for span in spans:
        assert span.attributes[ATTR_BACKEND] == "ti-trace"
        assert span.attributes["ti.custom"] == 7
        assert span.attributes[ATTR_ENV_COUNT] == 8


# -- attributes ------------------------------------------------------------------------------
def test_attributes_go_on_new_recorders_until_undo(resettrace: Any) -> None:
    session = resettrace.session
    assert ATTR_BACKEND not in session.recorder().attributes
    undo = instrument({"attributes": {"backend": "x", "task": "ti-task", "env_count": 12,
                                      "test_instrument.flag": True}})
    try:
        attrs = session.recorder().attributes
        assert attrs[ATTR_BACKEND] == "x" and attrs[ATTR_TASK] == "ti-task"
        assert attrs[ATTR_ENV_COUNT] == 12 and attrs["test_instrument.flag"] is True
        # a recorder's own arguments win
        assert session.recorder(backend="mine").attributes[ATTR_BACKEND] == "mine"
        assert rt.recorder(tracing=session).attributes[ATTR_BACKEND] == "x"
    finally:
        undo()
    attrs = session.recorder().attributes
    assert not {ATTR_BACKEND, ATTR_TASK, ATTR_ENV_COUNT, "test_instrument.flag"} & set(attrs)
    assert not {ATTR_BACKEND, ATTR_TASK, "test_instrument.flag"} & set(default_attributes())


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("spec", "expected"), [
    ({"instrument": {"ti_no_such_module_xyz:f": "env_step"}},
     "no module named 'ti_no_such_module_xyz'"),
    ({"instrument": {"ti_no_such_package_xyz.sub:f": "env_step"}},
     "no module named 'ti_no_such_package_xyz.sub'"),
    ({"instrument": {"json.dumps": "env_step"}}, "must be 'module:Qualified.name'"),
    ({"instrument": {"json:": "env_step"}}, "must be 'module:Qualified.name'"),
    ({"instrument": {":dumps": "env_step"}}, "must be 'module:Qualified.name'"),
    ({"instrument": {"json:du mps": "env_step"}}, "must be 'module:Qualified.name'"),
    ({"instrument": {"json:dumps": "env_stp"}}, "unknown phase 'env_stp'"),
    ({"instrument": {"json:dumps": {"phase": "reset_dne"}}}, "reset_done"),
    ({"instrument": {"json:dumps": {"count": "obj"}}}, "a phase name or a table"),
    ({"instrument": {"json:dumps": 3}}, "a phase name or a table"),
    ({"instrument": {"json:dumps": {"phase": "env_step", "cnt": "obj"}}},
     "unknown field(s) cnt"),
    ({"instrument": {"json:dumps": {"phase": "env_step", "count": -3}}},
     "count must be an argument name"),
    ({"instrument": {"json:dumps": {"phase": "env_step", "count": ["obj"]}}},
     "count must be an argument name"),
    ({"instrument": {"json:dumps": {"phase": "env_step", "within": 3}}},
     "within must be a phase name"),
    ({"instrument": {"json:dumps": {"phase": "env_step", "within": "set_stat"}}},
     "unknown phase 'set_stat'"),
    ({"instrument": {"json:dumps": {"phase": "env_step", "env_count": ["obj"]}}},
     "env_count must be an argument name"),
    ({"instrument": ["json:dumps"]}, "[instrument] must be a table"),
    ({"instrumnet": {"json:dumps": "env_step"}},
     "unknown instrument spec section(s): instrumnet"),
    ({"phases": [{"span": "test_instrument.bad", "parent": "", "kye": "x"}]},
     "unknown field(s) kye"),
    ({"phases": [{"span": "test_instrument.orphan"}]}, "missing parent"),
    ({"phases": [{"span": "test_instrument.lost", "parent": "no_such_parent"}]},
     "unknown phase 'no_such_parent'"),
    ({"phases": [{"span": "test_instrument.dup", "parent": "", "key": "env_step_total_ms"}]},
     "already the timing key"),
    ({"phases": {"span": "x"}}, "[[phases]] must be a list of tables"),
    ({"attributes": {"backend": ["a"]}}, "[attributes] 'backend'"),
    ({"attributes": "x"}, "[attributes] must be a table"),
    ({"attributes": {"task": "walk\udcff"}},
     "[attributes] 'task': span attribute 'resettrace.task.name': its value 'walk\\udcff' "
     "has a lone surrogate"),
    ({"attributes": {"mylab.run\x00": "a"}},
     "span attribute key 'mylab.run\\x00' has a control character"),
    ({"phases": [{"span": "test_instrument.bad\udcff", "parent": ""}]},
     "phases[0]: a phase's span name"),
])
def test_spec_errors_name_the_problem(spec: dict[str, Any], expected: str) -> None:
    with pytest.raises(InstrumentError) as info:
        instrument(spec)
    assert expected in str(info.value)
    assert isinstance(info.value, ValueError)
    if "no module named" not in expected:  # check_spec imports and finds nothing
        with pytest.raises(InstrumentError):
            check_spec(spec)


def test_unknown_phase_lists_close_names() -> None:
    with pytest.raises(InstrumentError) as info:
        instrument({"instrument": {"json:dumps": "set_stat"}})
    message = str(info.value)
    assert "'json:dumps'" in message and "unknown phase 'set_stat'" in message
    assert "closest registered: set_state" in message
    assert not _traced(json.dumps)


def test_missing_attribute_of_an_imported_module(make_module: Callable[..., Any]) -> None:
    mod = make_module("env", ENV_SOURCE)
    m = mod.__name__
    for target, expected in ((f"{m}:Env.stepp", f"{m}.Env' has no attribute 'stepp'"),
                             (f"{m}:Nope.step", f"'{m}' has no attribute 'Nope'"),
                             (f"{m}:np", "is not a function or method (module)"),
                             (f"{m}:Env", "is a class, not a function or method")):
        with pytest.raises(InstrumentError) as info:
            instrument({"instrument": {target: "env_step"}})
        assert f"instrument target {target!r}" in str(info.value)
        assert expected in str(info.value)
    assert mod.Env.__name__ == "Env" and isinstance(mod.Env, type)


def test_a_property_or_a_bad_count_argument_is_refused(make_module: Callable[..., Any]
                                                       ) -> None:
    mod = make_module("kinds", KINDS_SOURCE)
    with pytest.raises(InstrumentError, match=r"is not a function or method \(property\)"):
        instrument({"instrument": {f"{mod.__name__}:Base.prop": "env_step"}})
    with pytest.raises(InstrumentError, match=r"has no argument 'ids' \(arguments: env_ids\)"):
        instrument({"instrument": {f"{mod.__name__}:reset_rows": {"phase": "reset_done",
                                                                  "count": "ids"}}})
    assert not _traced(mod.reset_rows)
    assert isinstance(mod.Base.__dict__["prop"], property)


DEFERRED_SOURCE = """
    def rollout(n):
        yield n


    async def fetch():
        return 1


    async def stream():
        yield 1


    class Env:
        @staticmethod
        def frames():
            yield 1
"""


@pytest.mark.parametrize(("target", "kind"), [("rollout", "a generator function"),
                                              ("fetch", "a coroutine function"),
                                              ("stream", "an async generator function"),
                                              ("Env.frames", "a generator function")])
def test_a_generator_or_async_target_is_a_spec_error(make_module: Callable[..., Any],
                                                     target: str, kind: str) -> None:
    mod = make_module("deferred", DEFERRED_SOURCE)
    original = mod.Env.__dict__["frames"] if "." in target else getattr(mod, target)
    with pytest.raises(InstrumentError) as info:
        instrument({"instrument": {f"{mod.__name__}:{target}": "env_step"}})
    message = str(info.value)
    assert message.startswith(f"instrument target '{mod.__name__}:{target}': traced() cannot "
                              f"record {mod.__name__}.{target}: it is {kind}")
    assert "trace the code that consumes it, or a synchronous helper" in message
    assert (mod.Env.__dict__["frames"] if "." in target else getattr(mod, target)) is original


def test_missing_attribute_of_a_later_module_raises_on_import(
        make_module: Callable[..., Any]) -> None:
    name = make_module("env", ENV_SOURCE, load=False)
    with installed({"instrument": {f"{name}:Env.stepp": "env_step",
                                   f"{name}:Env.step": "env_step"}}):  # unknown yet
        with pytest.raises(InstrumentError, match=r"has no attribute 'stepp'"):
            importlib.import_module(name)
        assert name not in sys.modules  # the failed import left nothing behind
        # the targets still wait: importing it again fails again, never silently unpatched
        with pytest.raises(InstrumentError, match=r"has no attribute 'stepp'"):
            importlib.import_module(name)
    assert not _traced(importlib.import_module(name).Env.step)  # undone: a plain import


LAZY_SOURCE = """
    def __getattr__(name):
        raise ImportError(f"{name} needs an optional package")
"""


def test_a_lookup_that_raises_or_a_target_that_cannot_be_replaced(
        make_module: Callable[..., Any]) -> None:
    """A module ``__getattr__`` that raises (or any lookup raising other than
    AttributeError), and a method of a built-in type: an InstrumentError naming the
    target, at once or when the module is imported, never the lookup's traceback."""
    mod = make_module("lazy", LAZY_SOURCE)
    with pytest.raises(InstrumentError) as info:
        instrument({"instrument": {f"{mod.__name__}:Env.step": "env_step"}})
    assert str(info.value) == (f"instrument target '{mod.__name__}:Env.step': looking up 'Env' "
                               f"on '{mod.__name__}' raised ImportError: Env needs an optional "
                               "package")
    later = make_module("lazy_later", LAZY_SOURCE, load=False)
    with installed({"instrument": {f"{later}:reset": "reset_done"}}):
        with pytest.raises(InstrumentError, match=r"looking up 'reset' .* raised ImportError"):
            importlib.import_module(later)
    with pytest.raises(InstrumentError, match=r"'collections:OrderedDict.popitem' cannot be "
                                              r"replaced: .*immutable type"):
        instrument({"instrument": {"collections:OrderedDict.popitem": "env_step"}})


def test_a_bad_toml_file_and_an_unreadable_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[instrument]\n"a:b" = \n')
    with pytest.raises(InstrumentError, match=r"bad.toml' is not valid TOML"):
        instrument(bad)
    latin = tmp_path / "latin.toml"  # TOML is UTF-8, whatever the locale
    latin.write_bytes(NON_UTF8_SPEC)
    for call in (instrument, check_spec):
        with pytest.raises(InstrumentError, match=r"latin.toml' is not valid TOML: not UTF-8 "
                                                  r"text \(byte 0xe9 on line 2\)"):
            call(latin)
    with pytest.raises(InstrumentError, match=r"cannot read the instrument spec .*nowhere"):
        instrument(tmp_path / "nowhere.toml")
    with pytest.raises(InstrumentError, match=r"cannot read the instrument spec"):
        instrument(tmp_path)  # a folder


def test_an_already_traced_target_is_refused(make_module: Callable[..., Any]) -> None:
    mod = make_module("decorated", """
        import resettrace

        @resettrace.traced("reset_done")
        def reset(env_ids):
            return env_ids

        def plain():
            return 1
    """)
    with pytest.raises(InstrumentError, match=r"'.*:reset' is already traced"):
        instrument({"instrument": {f"{mod.__name__}:reset": "reset_done"}})
    plain = mod.plain
    with installed({"instrument": {f"{mod.__name__}:plain": "env_step"}}):
        wrapper = mod.plain
        with pytest.raises(InstrumentError, match=r"'.*:plain' is already traced"):
            instrument({"instrument": {f"{mod.__name__}:plain": "reset_done"}})
        assert mod.plain is wrapper  # the first instrument() is untouched
    assert mod.plain is plain


def test_a_failing_instrument_leaves_nothing_installed(
        resettrace: Any, make_module: Callable[..., Any]) -> None:
    mod = make_module("env", ENV_SOURCE)
    later = make_module("later", ENV_SOURCE, load=False)
    step, set_state = mod.Env.__dict__["step"], mod.Backend.__dict__["set_state"]
    spec = {"attributes": {"backend": "ti-rollback"}, "instrument": {
        f"{mod.__name__}:Env.step": "env_step",
        f"{later}:Env.step": "env_step",
        f"{mod.__name__}:Backend.set_state": "set_state",
        f"{mod.__name__}:Env.nope": "reset_done",
    }}
    with pytest.raises(InstrumentError, match="has no attribute 'nope'"):
        instrument(spec)
    assert mod.Env.__dict__["step"] is step
    assert mod.Backend.__dict__["set_state"] is set_state
    assert ATTR_BACKEND not in default_attributes()
    assert ATTR_BACKEND not in resettrace.session.recorder().attributes
    lmod = importlib.import_module(later)  # not left waiting for its import either
    assert not _traced(lmod.Env.__dict__["step"])
    mod.Env(2).step([0])
    lmod.Env(2).step([0])
    assert _counts(resettrace) == {}
    # and the same targets install fine once the bad one is gone
    del spec["instrument"][f"{mod.__name__}:Env.nope"]
    with installed(spec):
        assert _traced(mod.Env.__dict__["step"]) and _traced(lmod.Env.__dict__["step"])


# -- RESETTRACE_INSTRUMENT and ``resettrace run`` --------------------------------------------
#: a spec saved in Latin-1: its comment's "é" is byte 0xe9
NON_UTF8_SPEC = '[instrument]\n# r\u00e9glage\n"ti_run_env:Env.step" = "env_step"\n'.encode(
    "latin-1")

RUN_MODULE = """
    import numpy as np


    class Backend:
        num_envs = 6

        def set_state(self, env_ids):
            self.mask(env_ids)
            return len(env_ids)

        def mask(self, env_ids):
            return env_ids


    class Env:
        def __init__(self):
            self.backend = Backend()
            self.done = np.zeros(6, dtype=bool)

        def step(self, k):
            self.done[:] = False
            self.done[:k] = True
            self.reset_done()

        def reset_done(self):
            self.backend.set_state(np.flatnonzero(self.done))
"""

RUN_SCRIPT = """
    from ti_run_env import Env

    env = Env()
    for k in (1, 2, 3, 4):
        env.step(k)
    print("trained", 4)
"""

RUN_SPEC = """
    [attributes]
    backend = "ti-run"

    [[phases]]
    span = "set_state.ti_run_mask"
    parent = "set_state"

    [instrument]
    "ti_run_env:Env.step" = "env_step"
    "ti_run_env:Env.reset_done" = { phase = "reset_done", count = "self.done" }
    "ti_run_env:Backend.mask" = "set_state.ti_run_mask"

    [instrument."ti_run_env:Backend.set_state"]
    phase = "set_state"
    count = "env_ids"
    env_count = "self.num_envs"
"""


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without any resettrace or OpenTelemetry setting."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RESETTRACE", "OTEL_")) and k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def _resettrace_run(args: list[str], cwd: Path, **extra: str
                    ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resettrace.cli", "run", *args], cwd=cwd,
                          env=_env(**extra), capture_output=True, text=True, timeout=120)


def _write(folder: Path, files: Mapping[str, str | bytes]) -> None:
    for name, text in files.items():
        if isinstance(text, bytes):
            (folder / name).write_bytes(text)
        else:
            (folder / name).write_text(textwrap.dedent(text))


def _json_counts(path: Path) -> dict[str, int]:
    return {key: s["count"] for key, s in json.loads(path.read_text())["stats"].items()}


def test_run_an_unmodified_script(tmp_path: Path) -> None:
    _write(tmp_path, {"ti_run_env.py": RUN_MODULE, "train.py": RUN_SCRIPT,
                      "spec.toml": RUN_SPEC})
    out = tmp_path / "stats.json"
    r = _resettrace_run(["--instrument", "spec.toml", "--stats-json", str(out), "--",
                         sys.executable, "train.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "trained 4"
    data = json.loads(out.read_text())
    assert data["mode"] == "timing"
    counts = _json_counts(out)
    for key in ("env_step_total_ms", "reset_done_ms", "dr_reset_set_state_ms",
                "set_state_ti_run_mask_ms", "set_state_internal_gap_ms",
                "reset_done_count"):
        assert counts[key] == 4, key
    assert data["stats"]["reset_done_count"]["total_ms"] == 10.0
    assert counts["set_state_mask_ms"] == 4  # the built-in set_state keys are zero-filled
    assert data["stats"]["set_state_mask_ms"]["total_ms"] == 0.0
    assert "Traceback" not in r.stderr
    assert data["kind"] == "job" and len(data["members"]) == 1  # the job: one process
    assert "1 process (" in r.stderr and "the job, per key" in r.stderr
    for key in ("env_step_total_ms", "set_state_ti_run_mask_ms", "reset_done_count"):
        assert re.search(rf"^{key}\s+4\s", r.stderr, re.M), key
    assert not re.search(r"^set_state_mask_ms\s", r.stderr, re.M)  # never took time
    assert "keys that never took time not shown" in r.stderr


def test_run_spec_from_the_variable_with_the_console_script(tmp_path: Path) -> None:
    """``RESETTRACE_INSTRUMENT`` instead of ``--instrument``: the command's process installs
    it, not the ``resettrace`` process, which could not find the script's modules."""
    job = tmp_path / "job"
    job.mkdir()
    _write(job, {"ti_run_env.py": RUN_MODULE, "train.py": RUN_SCRIPT})
    _write(tmp_path, {"spec.toml": RUN_SPEC})
    out = tmp_path / "stats.json"
    r = subprocess.run([str(Path(sys.executable).parent / "resettrace"), "run", "--stats-json",
                        str(out), "--", "python", "job/train.py"], cwd=tmp_path,
                       env=_env(RESETTRACE_INSTRUMENT="spec.toml"), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "trained 4"
    counts = _json_counts(out)
    assert counts["env_step_total_ms"] == 4 and counts["set_state_ti_run_mask_ms"] == 4


def test_run_target_whose_module_is_never_imported(tmp_path: Path) -> None:
    _write(tmp_path, {"ti_run_env.py": RUN_MODULE, "ti_run_unused.py": "def f():\n    pass\n",
                      "train.py": RUN_SCRIPT,
                      "spec.toml": RUN_SPEC.replace(
                          "[instrument]\n", '[instrument]\n"ti_run_unused:f" = "env_step"\n')})
    out = tmp_path / "stats.json"
    r = _resettrace_run(["--instrument", "spec.toml", "--no-summary", "--stats-json",
                         str(out), "--", sys.executable, "train.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "trained 4"
    assert "never imported, so never traced: ti_run_unused:f" in r.stderr
    assert "resettrace stats" not in r.stderr  # --no-summary
    counts = _json_counts(out)
    assert counts["env_step_total_ms"] == 4  # the unused target's calls would add to it


def test_run_merges_the_records_of_every_process_of_the_command(tmp_path: Path) -> None:
    """The main process and a spawned worker each write their record (beside the job's);
    the job's record holds both, each with its own rank."""
    _write(tmp_path, {"ti_run_work.py": "def work(n):\n    return n\n",
                      "spec.toml": '[instrument]\n"ti_run_work:work" = "env_step"\n',
                      "main.py": """
        import multiprocessing as mp

        import ti_run_work


        def child():
            for i in range(5):
                ti_run_work.work(i)


        if __name__ == "__main__":
            ti_run_work.work(0)
            ti_run_work.work(1)
            p = mp.get_context("spawn").Process(target=child)
            p.start()
            p.join()
            print("child exit", p.exitcode)
    """})
    out = tmp_path / "stats.json"
    r = _resettrace_run(["--instrument", "spec.toml", "--stats-json", str(out), "--",
                         sys.executable, "main.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child exit 0"
    job = json.loads(out.read_text())
    assert job["stats"]["env_step_total_ms"]["count"] == 7  # 2 + 5
    assert sorted((m["rank"], m["stats"]["env_step_total_ms"]["count"])
                  for m in job["members"]) == [(0, 2), (1, 5)]
    per_process = sorted(_json_counts(p)["env_step_total_ms"]
                         for p in tmp_path.glob("stats.*.json"))
    assert per_process == [2, 5]
    assert "2 processes (" in r.stderr
    assert "no instrumented call ran" not in r.stderr
    assert "never imported" not in r.stderr
    # with {pid} in the path every process writes its own, and no job file
    r = _resettrace_run(["--instrument", "spec.toml", "--stats-json",
                         str(tmp_path / "own-{pid}.json"), "--no-summary", "--",
                         sys.executable, "main.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    written = sorted(_json_counts(p).get("env_step_total_ms", 0)
                     for p in tmp_path.glob("own-*.json"))
    assert written == [2, 5]


@pytest.mark.parametrize(("files", "args", "expected"), [
    ({"spec.toml": '[instrument]\n"ti_run_env:Env.step" = "env_stepp"\n'},
     ["--instrument", "spec.toml"], "unknown phase 'env_stepp'"),
    ({"spec.toml": '[instrument]\n"ti_run_env:Env.step" = \n'},
     ["--instrument", "spec.toml"], "is not valid TOML"),
    ({}, ["--instrument", "missing.toml"], "cannot read the instrument spec"),
    ({"spec.toml": '[instrument]\n"ti_run_nowhere:f" = "env_step"\n'},  # found by the child
     ["--instrument", "spec.toml"], "no module named 'ti_run_nowhere'"),
    ({"spec.toml": '[instrument]\n"ti_run_nowhere:f" = "env_step"\n'},
     [], "no module named 'ti_run_nowhere'"),  # the spec from RESETTRACE_INSTRUMENT
    ({"spec.toml": NON_UTF8_SPEC}, ["--instrument", "spec.toml"],
     "'spec.toml' is not valid TOML: not UTF-8 text (byte 0xe9 on line 2)"),
    ({"spec.toml": NON_UTF8_SPEC}, [], "not UTF-8 text (byte 0xe9 on line 2)"),
    ({"spec.toml": '[instrument]\n"ti_run_env:Env.step" = \n'}, [], "is not valid TOML"),
    ({"spec.toml": '[instrument]\n"os:getcwdz" = "env_step"\n'},  # imported at start-up
     [], "'os' has no attribute 'getcwdz'"),
])
def test_run_bad_spec_is_one_line_and_exit_2(tmp_path: Path, files: dict[str, str | bytes],
                                             args: list[str], expected: str) -> None:
    _write(tmp_path, {"ti_run_env.py": RUN_MODULE, "train.py": RUN_SCRIPT, **files})
    extra = {} if args else {"RESETTRACE_INSTRUMENT": "spec.toml"}
    r = _resettrace_run([*args, "--", sys.executable, "train.py"], tmp_path, **extra)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("resettrace run:") and expected in lines[0]
    assert "Traceback" not in r.stderr
    assert r.stdout == ""  # the script never ran


LATER_MODULE = RUN_MODULE + """

    def rollout(n):
        yield n


    def __getattr__(name):
        if name == "Lazy":
            raise ImportError("Lazy needs an optional package")
        raise AttributeError(name)
"""


@pytest.mark.parametrize(("target", "value", "expected"), [
    ("Env.stepp", '"env_step"', "not found: 'ti_run_env.Env' has no attribute 'stepp'"),
    ("Nope.step", '"env_step"', "not found: 'ti_run_env' has no attribute 'Nope'"),
    ("Backend.num_envs", '"env_step"', "is not a function or method (int)"),
    ("Backend.set_state", '{ phase = "set_state", count = "ids" }',
     "count 'ids': 'Backend.set_state' has no argument 'ids' (arguments: self, env_ids)"),
    ("Backend.set_state", '{ phase = "set_state", env_count = "this.n" }',
     "env_count 'this.n': 'Backend.set_state' has no argument 'this'"),
    ("rollout", '"env_step"', "it is a generator function"),
    ("Lazy.step", '"env_step"',
     "looking up 'Lazy' on 'ti_run_env' raised ImportError: Lazy needs an optional package"),
])
@pytest.mark.parametrize("how", ["--instrument", "RESETTRACE_INSTRUMENT"])
def test_run_a_target_that_fails_when_its_module_is_imported_is_one_line_and_exit_2(
        tmp_path: Path, target: str, value: str, expected: str, how: str) -> None:
    """The module is imported after start-up, by the user's code: the spec error is one
    line and exit code 2 (it was a traceback inside the user's import, exit 1, then "no
    instrumented call ran"), and no exit summary follows it."""
    script = "print('started', flush=True)\n" + textwrap.dedent(RUN_SCRIPT)
    _write(tmp_path, {"ti_run_env.py": LATER_MODULE, "train.py": script,
                      "spec.toml": f'[instrument]\n"ti_run_env:{target}" = {value}\n'})
    args = ["--instrument", "spec.toml"] if how == "--instrument" else []
    extra = {} if args else {"RESETTRACE_INSTRUMENT": "spec.toml"}
    r = _resettrace_run([*args, "--", sys.executable, "train.py"], tmp_path, **extra)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"resettrace run: instrument target 'ti_run_env:{target}'")
    assert expected in lines[0]
    assert r.stdout == "started\n"  # the user's code ran up to the import, and no further


def test_resettrace_instrument_without_run_fails_in_one_line_too(tmp_path: Path) -> None:
    """The variable alone is what ``resettrace run`` sets up: a spec it names that cannot
    be installed, at ``import resettrace`` or at a later import, is one line and exit 2."""
    _write(tmp_path, {"ti_run_env.py": RUN_MODULE, "latin.toml": NON_UTF8_SPEC,
                      "missing.toml": '[instrument]\n"ti_run_env:Env.stepp" = "env_step"\n'})
    code = "import resettrace\nprint('imported', flush=True)\nimport ti_run_env\nprint('no')\n"
    for spec, stdout, expected in (
            ("latin.toml", "", "resettrace (RESETTRACE_INSTRUMENT=latin.toml): instrument spec "
                               "'latin.toml' is not valid TOML: not UTF-8 text (byte 0xe9 on "
                               "line 2)"),
            ("missing.toml", "imported\n", "resettrace (RESETTRACE_INSTRUMENT=missing.toml): "
                                           "instrument target 'ti_run_env:Env.stepp' not "
                                           "found: 'ti_run_env.Env' has no attribute "
                                           "'stepp'")):
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120,
                           env=_env(RESETTRACE="timing", RESETTRACE_INSTRUMENT=spec))
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines() == [expected]
        assert r.stdout == stdout


def test_run_a_target_module_that_raises_keeps_its_traceback_and_says_so(
        tmp_path: Path) -> None:
    """The module's own error is the user's: its traceback as ever, exit 1; at exit the
    target is reported as never traced because its import raised, not as never imported."""
    _write(tmp_path, {"ti_run_boom.py": "raise RuntimeError('boom at import')\n",
                      "spec.toml": '[instrument]\n"ti_run_boom:f" = "env_step"\n'})
    r = _resettrace_run(["--instrument", "spec.toml", "--", sys.executable, "-c",
                         "import ti_run_boom"], tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith("Traceback") and "RuntimeError: boom at import" in r.stderr
    assert "never traced: importing their module 'ti_run_boom' raised RuntimeError: " \
           "ti_run_boom:f" in r.stderr
    assert "never imported" not in r.stderr


@pytest.mark.parametrize("args", [[], ["--"], ["--no-summary", "--"]])
def test_run_without_a_command(tmp_path: Path, args: list[str]) -> None:
    r = _resettrace_run(args, tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("resettrace run: no command given")
    assert len(r.stderr.splitlines()) == 1


def test_run_a_command_that_does_not_exist(tmp_path: Path) -> None:
    r = _resettrace_run(["--", "ti-no-such-command-xyz", "--flag"], tmp_path)
    assert r.returncode == 127
    lines = r.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("resettrace run: cannot run 'ti-no-such-command-xyz'")


def test_run_with_tracing_off(tmp_path: Path) -> None:
    _write(tmp_path, {"ti_run_env.py": RUN_MODULE, "train.py": RUN_SCRIPT,
                      "spec.toml": RUN_SPEC})
    out = tmp_path / "stats.json"
    r = _resettrace_run(["--stats-json", str(out), "--", "python", "train.py"], tmp_path,
                        RESETTRACE="off", RESETTRACE_INSTRUMENT="spec.toml")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "trained 4"  # the wrapped code still runs
    assert "resettrace run: tracing is off (RESETTRACE=off): nothing recorded" in r.stderr
    assert not out.exists()  # no process recorded anything: no record


def test_resettrace_instrument_variable_without_run(tmp_path: Path) -> None:
    _write(tmp_path, {"ti_env_a.py": "def f():\n    return 'a'\n",
                      "ti_env_b.py": "def g(env_ids):\n    return len(env_ids)\n",
                      "spec.toml": """
        [instrument]
        "ti_env_a:f" = "env_step"
        "ti_env_b:g" = { phase = "reset_done", count = "env_ids" }
    """})
    code = textwrap.dedent("""
        import json
        import ti_env_a  # imported before resettrace: patched when it installs the spec
        import resettrace
        import ti_env_b  # imported after: patched by the import hook
        assert ti_env_a.f() == "a" and ti_env_b.g([1, 2, 3]) == 3 and ti_env_b.g([]) == 0
        s = resettrace.stats()
        print(json.dumps({k: [v.count, v.total_ms] for k, v in s.items()}))
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120,
                       env=_env(RESETTRACE="timing", RESETTRACE_INSTRUMENT="spec.toml"))
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["env_step_total_ms"][0] == 1
    assert stats["reset_done_ms"][0] == 2
    assert stats["reset_done_count"] == [2, 3.0]
    assert r.stderr == ""


def test_run_in_trace_mode_from_another_folder_exports_every_span(tmp_path: Path) -> None:
    """The export child (and any helper of resettrace's own) is not a user process: it
    must not install the spec, whose modules it cannot find from its folder."""
    proj = tmp_path / "proj"
    proj.mkdir()
    _write(proj, {"ti_run_env.py": RUN_MODULE, "train.py": RUN_SCRIPT, "spec.toml": RUN_SPEC})
    spans = tmp_path / "spans.jsonl"
    r = _resettrace_run(["--no-summary", "--instrument", str(proj / "spec.toml"), "--",
                         sys.executable, str(proj / "train.py")], tmp_path,
                        RESETTRACE="trace", RESETTRACE_EXPORTER=f"file:{spans}")
    assert r.returncode == 0, r.stderr
    assert "died" not in r.stderr and "not delivered" not in r.stderr
    names = [json.loads(line)["name"] for line in spans.read_text().splitlines()]
    assert names.count("env_step") == 4 and names.count("set_state") == 4


def test_a_subprocess_from_another_folder_does_not_fail_over_the_spec(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    script = ("import subprocess, sys\n"
              "import ti_run_env\n"
              "r = subprocess.run([sys.executable, '-c', 'print(40 + 2)'], cwd='/',\n"
              "                   capture_output=True, text=True)\n"
              "print(r.returncode, r.stdout.strip(), r.stderr.strip())\n")
    _write(proj, {"ti_run_env.py": RUN_MODULE, "main.py": script, "spec.toml": RUN_SPEC})
    r = _resettrace_run(["--no-summary", "--instrument", "spec.toml", "--", sys.executable,
                         "main.py"], proj)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0 42"


def test_a_target_module_that_imports_resettrace_itself_gets_a_clear_error(
        tmp_path: Path) -> None:
    _write(tmp_path, {"ti_self.py": "import resettrace\n\nclass Env:\n    def step(self):"
                                    "\n        return 1\n",
                      "spec.toml": '[instrument]\n"ti_self:Env.step" = "env_step"\n'})
    r = subprocess.run([sys.executable, "-c", "import ti_self"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env=_env(RESETTRACE="timing", RESETTRACE_INSTRUMENT="spec.toml"))
    assert r.returncode != 0 and "still being imported" in r.stderr
    ok = _resettrace_run(["--no-summary", "--instrument", "spec.toml", "--", sys.executable,
                          "-c", "import ti_self; assert ti_self.Env().step() == 1"], tmp_path)
    assert ok.returncode == 0, ok.stderr
