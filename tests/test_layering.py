"""The layout's rule (docs/layout.md), read from every module's imports: the tracer never
imports the reference path (``resettrace.sim``) or the benchmarks (``resettrace.bench``) but
where a public call or a ``bench`` command loads them, the reference path never imports the
benchmarks, and no tracer module imports an extra's package at its top (``import
resettrace`` and tracing stay light: ``pip install resettrace`` has none of them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from resettrace.extras import EXTRAS

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "resettrace"
#: tracer modules that may load the reference path or a benchmark inside a function
LOADERS = {"resettrace/__init__.py": "make_env and make_backend",
           "resettrace/cli/__init__.py": "the bench commands' parser",
           "resettrace/cli/bench.py": "the bench commands",
           "resettrace/cli/collector.py": "bench collector",
           "resettrace/cli/common.py": "the bench commands"}
HEAVY = {m for mods in EXTRAS.values() for m in mods}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """Every module the file imports: ``(name, at the top)``; at the top means outside
    any function and outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            here = top
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                here = False
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                here = False
            if isinstance(child, ast.Import):
                out.extend((a.name, here) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                out.append((child.module, here))
                if child.module == "resettrace":  # from resettrace import sim
                    out.extend((f"resettrace.{a.name}", here) for a in child.names)
            visit(child, here)

    visit(tree, True)
    return out


def _part(name: str) -> str:
    parts = name.split(".")
    return parts[1] if parts[0] == "resettrace" and len(parts) > 1 else ""


MODULES = sorted(p.relative_to(SRC).as_posix() for p in PKG.rglob("*.py"))


def test_the_modules_are_found() -> None:
    assert "resettrace/sim/backends/mujoco.py" in MODULES
    assert "resettrace/tracing/recorder.py" in MODULES and len(MODULES) > 60


@pytest.mark.parametrize("module", MODULES)
def test_each_module_keeps_to_its_side_of_the_layout(module: str) -> None:
    side = module.split("/")[1]  # sim, bench, or a tracer module / package
    broken = []
    for name, top in _imports(SRC / module):
        target = _part(name)
        if side == "sim" and target == "bench":
            broken.append(f"{name}: the reference path never imports the benchmarks")
        if side not in ("sim", "bench") and target in ("sim", "bench"):
            if top or module not in LOADERS:
                broken.append(f"{name}: the tracer never imports the reference path or "
                              f"the benchmarks (only {', '.join(LOADERS)} load them, "
                              "inside a function)")
        if side not in ("sim", "bench") and top and name.partition(".")[0] in HEAVY:
            broken.append(f"{name}: an extra's package, imported at the top of a tracer "
                          "module")
    assert not broken, broken


def test_the_rule_catches_what_it_forbids(tmp_path: Path) -> None:
    """The checker itself: imports at the top and in functions, from-imports, and
    TYPE_CHECKING blocks, as written."""
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nimport scipy.stats\n"
                 "from resettrace import sim, catalog\n"
                 "if TYPE_CHECKING:\n    from resettrace.bench import overhead\n"
                 "def f():\n    import mujoco\n    from resettrace.sim.envs import np_env\n")
    got = _imports(f)
    assert ("scipy.stats", True) in got and ("resettrace.sim", True) in got
    assert ("resettrace.bench", False) in got and ("mujoco", False) in got
    assert ("resettrace.sim.envs", False) in got and ("resettrace.catalog", True) in got


def _private_imports(path: Path) -> list[str]:
    """``from resettrace.X import _name`` where ``_name`` is not a module: another
    module's private name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level \
                and node.module.split(".")[0] == "resettrace":
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__"):
                    where = SRC.joinpath(*node.module.split("."), name)
                    if not (where.with_suffix(".py").exists() or where.is_dir()
                            or where.parent.joinpath(name + ".c").exists()):
                        out.append(f"{node.module}.{name}")
    return out


@pytest.mark.parametrize("module", MODULES)
def test_no_module_imports_another_s_private_name(module: str) -> None:
    assert _private_imports(SRC / module) == []


def test_the_private_rule_catches_what_it_forbids(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from resettrace.tracing.recorder import _ERRORS, Recorder\n"
                 "from resettrace.tracing import _fast\nfrom resettrace import _run\n")
    assert _private_imports(f) == ["resettrace.tracing.recorder._ERRORS"]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports when it runs: at its top or inside a
    function (not under ``if TYPE_CHECKING:``); ``from a.b import c`` names ``a.b.c`` when
    that is a module, else ``a.b`` (the compiled part, ``_fast``, is a module of its own
    that imports none of the package's)."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        hidden = {id(n) for node in ast.walk(tree)
                  if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                  for n in ast.walk(node)}
        out = graph[name] = set()
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    where = root.joinpath(*sub.split("."))
                    if where.with_suffix(".c").exists() or any(
                            where.parent.glob(f"{a.name}.*.so")):
                        continue  # the compiled part: a module of its own, no Python
                    out.add(sub if sub in files else node.module)
        out &= files.keys() - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected set of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm (the package is a few levels deep)
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            ring = []
            while True:
                w = stack.pop()
                ring.append(w)
                if w == v:
                    break
            if len(ring) > 1:
                found.append(sorted(ring))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_even_through_a_function() -> None:
    """Modules import downwards only: no circle of imports, counting those made inside a
    function (a lazy import is still a tie: what it reaches needs the importer back)."""
    graph = _import_graph(SRC)
    assert "resettrace.tracing.recorder" in graph["resettrace.tracing.aggregate"]
    assert _circles(graph) == []


def test_the_circle_rule_catches_a_circle_through_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "resettrace"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from resettrace.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from resettrace.c import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nimport resettrace.a\n"
                              "if TYPE_CHECKING:\n    from resettrace.d import y\n")
    (pkg / "d.py").write_text("import resettrace.c\n")
    assert _circles(_import_graph(tmp_path)) == [
        ["resettrace.a", "resettrace.c", "resettrace.sub.b"]]


def _layout_entries() -> dict[str, str]:
    """docs/layout.md's tree, by top-level entry of ``src/resettrace/`` (``config.py``,
    ``tracing/``): each entry's text, its continuation lines and sub-entries included."""
    doc = (SRC.parent / "docs" / "layout.md").read_text()
    tree = doc.split("```", 2)[1]
    lines = tree.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("src/resettrace/"))
    entries: dict[str, str] = {}
    name = None
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break  # the tree's next top-level folder (collector_config/, tests/)
        if line[2] != " ":
            name = line.split()[0]
            entries[name] = ""
        if name is not None:
            entries[name] += line + "\n"
    return entries


def test_the_layout_names_every_module() -> None:
    """docs/layout.md's tree names every module and package of the source where it lives:
    a top-level module as an entry ``name.py``, a package as an entry ``name/``, and each
    module of a package by its name inside that package's entry. A module added, moved or
    renamed shows there."""
    entries = _layout_entries()
    missing = []
    for m in MODULES:
        parts = Path(m).parts[1:]  # (below resettrace/)
        stem = Path(m).stem
        if len(parts) == 1:
            if parts[0] not in entries:
                missing.append(m)
            continue
        entry = entries.get(parts[0] + "/")
        words = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", entry or ""))
        if entry is None or (stem not in ("__init__", "__main__") and stem not in words):
            missing.append(m)
        missing += [f"{m}: its folder {d}/" for d in parts[1:-1] if f"{d}/" not in entry]
    assert missing == []
    assert "tracing/" in entries and "config.py" in entries  # (the checker reads the tree)
