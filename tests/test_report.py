"""``resettrace report``: the HTML file opened in a real headless browser (Debian's chromium,
driven by selenium through Debian's chromedriver; ``make test`` installs both)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resettrace.analysis.report import CHART_IDS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resettrace.cli", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # not a skip: the default install (make test) has the browser; without it, say so
    assert CHROMIUM and CHROMEDRIVER, (
        "the report test needs Debian's chromium and chromium-driver: `make test` installs "
        "them (apt-get install -y chromium chromium-driver, as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


_DOM = """
const out = {};
for (const div of document.querySelectorAll('div.chart')) {
  out[div.id] = {svg: div.querySelectorAll('.main-svg').length,
                 traces: (div.data || []).length, drawn: div._fullLayout !== undefined};
}
const top = document.querySelector('#icicle g.slice');
out.top_box = top ? top.textContent : null;
out.table_rows = document.querySelectorAll('#percentiles .cell-text').length;
out.cost_lines = document.querySelectorAll('#cost-model .scatterlayer .trace').length;
return JSON.stringify(out);
"""


def _external_sources(text: str) -> list[str]:
    """src/href of every tag that would load something (script contents are not tags)."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.extend(f"{tag} {v}" for k, v in attrs if k in ("src", "href") and v)

    Tags().feed(text)
    return found


def _open(browser: Any, path: Path) -> dict[str, Any]:
    browser.get(path.resolve().as_uri())
    browser.get_log("browser")  # what the page logged while loading: checked below
    return json.loads(browser.execute_script(_DOM))


def test_the_report_renders_every_chart_offline(tmp_path: Path, browser: Any) -> None:
    runs = {}
    for name, extra in (("base", []), ("new", ["--randomize", "--report"])):
        out = tmp_path / name
        r = _cli("bench", "collector", "--num-envs", "32", "--steps", "120", "--warmup", "5",
                 "--nthread", "1", "--action-noise", "2", "--out", str(out), *extra)
        assert r.returncode == 0, r.stderr
        runs[name] = out
    # bench collector --report wrote it next to timing.json and said so
    assert (runs["new"] / "report.html").is_file()
    assert str(runs["new"] / "report.html") in r.stdout
    report = tmp_path / "cmp" / "report.html"
    r = _cli("report", str(runs["new"]), "--compare", str(runs["base"]), "-o", str(report))
    assert r.returncode == 0 and str(report) in r.stdout, r.stderr
    assert _external_sources(report.read_text()) == []  # plotly.js is inlined: no network

    browser.get(report.resolve().as_uri())
    dom = json.loads(browser.execute_script(_DOM))
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    for chart in (*CHART_IDS, "compare-table", "compare-deltas"):
        assert dom[chart]["drawn"] and dom[chart]["svg"] > 0 and dom[chart]["traces"] > 0, chart
    assert dom["top_box"].startswith("env_step"), dom["top_box"]
    assert dom["table_rows"] > 30  # every phase's p50/p90/p99
    assert dom["cost_lines"] == 4  # reset_done and set_state: the calls and the fitted line
    browser.save_screenshot(str(tmp_path / "report.png"))  # for a person to look at

    alone = _open(browser, runs["new"] / "report.html")  # no --compare: no compare charts
    assert set(alone) >= set(CHART_IDS) and "compare-table" not in alone
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_report_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{}")
    for args, said in ((["report", str(tmp_path / "none")], "no such run"),
                       (["report", str(tmp_path / "bad.json")], "not a resettrace run record"),
                       (["bench", "collector", "--report", "--steps", "1"], "give --out")):
        r = _cli(*args)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
