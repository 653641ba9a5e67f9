"""One registry of the environment variables (resettrace.settings): the docs' table and
``resettrace --help`` are generated from it, every variable the code reads is in it, and
its defaults and ranges are the code's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from resettrace import cli
from resettrace.config import NUMBERS, RUN_DEFAULTS, Config
from resettrace.settings import BEGIN, END, SETTINGS, markdown_table, write_docs

ROOT = Path(__file__).resolve().parents[1]
#: variables resettrace sets for its own processes (``resettrace run``, Ray's hook, a
#: worker's parent rank), not settings a user gives
INTERNAL = {"RESETTRACE_RUN_ID", "RESETTRACE_RUN_SUMMARY", "RESETTRACE_RUN_OWNER",
            "RESETTRACE_RAY_NEXT_HOOK", "RESETTRACE_PARENT_RANK"}
#: read as the more specific spelling of a listed one (its text says it wins)
SPECIFIC = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE",
            "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES"}


def test_the_docs_table_is_the_generated_one() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert text.split(BEGIN + "\n")[1].split(END)[0] == markdown_table()


def test_write_docs_rewrites_only_its_region(tmp_path: Path) -> None:
    f = tmp_path / "c.md"
    f.write_text(f"# head\n{BEGIN}\nold table\n{END}\ntail\n")
    assert write_docs(f) is True
    assert f.read_text() == f"# head\n{BEGIN}\n{markdown_table()}{END}\ntail\n"
    assert write_docs(f) is False  # (nothing to change)
    f.write_text("no region\n")
    with pytest.raises(ValueError, match="no .* region"):
        write_docs(f)


def test_every_variable_the_code_reads_is_listed() -> None:
    read = set()
    for path in (ROOT / "src" / "resettrace").rglob("*.py"):
        read |= set(re.findall(r"\"((?:RESETTRACE|OTEL)_[A-Z_]*[A-Z])\"", path.read_text()))
    listed = {s.var for s in SETTINGS}
    assert len(listed) == len(SETTINGS)  # each once
    assert read - listed - INTERNAL - SPECIFIC == set()
    assert "RESETTRACE_PURE_PYTHON" in listed and "RESETTRACE" in listed


def test_numeric_defaults_are_the_code_s() -> None:
    """The shown default of a number is the code's (a field of Config, or of a run), in
    the variable's unit; its range in the table is the one the value is checked against."""
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    checked = 0
    for s in SETTINGS:
        number = s.range
        if number is None:
            continue
        assert s.var in number.env
        row = next(r for r in markdown_table().splitlines() if r.startswith(f"| `{s.var}` |"))
        assert row.split(" | ")[1].endswith(")") and " - " in row.split(" | ")[1]
        if not re.fullmatch(r"`[0-9.]+`", s.default):
            continue  # ("the OTLP timeout")
        want = RUN_DEFAULTS.get(s.number or "", defaults.get(s.number or ""))
        scale = number.scale if s.number in NUMBERS else 1.0
        assert float(s.default.strip("`")) * scale == pytest.approx(want), s.var
        checked += 1
    assert checked >= 12


def test_help_lists_every_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for s in SETTINGS:
        assert re.search(rf"^  {re.escape(s.var)} +\S", out, re.M), s.var
    assert "file:resettrace-spans.jsonl" in out  # (never broken at a hyphen)
