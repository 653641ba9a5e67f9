"""``resettrace report``: the HTML file opened in a real headless browser (Debian's chromium,
driven by selenium through Debian's chromedriver; ``make test`` installs both)."""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resettrace.analysis.report import CHART_IDS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _env() -> dict[str, str]:
    """The test's environment without any resettrace or OpenTelemetry setting."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RESETTRACE", "OTEL_")) and k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resettrace.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=_env())


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


@pytest.fixture(scope="module")
def collector_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two demo-like collector runs: ``base`` (no randomization) and ``new`` (randomized,
    with ``--report``): both leave most set_state phases at 0.0 ms in every call."""
    runs = {}
    for name, extra in (("base", []), ("new", ["--randomize", "--report"])):
        out = tmp_path_factory.mktemp("runs") / name
        r = _cli("bench", "collector", "--num-envs", "32", "--steps", "120", "--warmup", "5",
                 "--nthread", "1", "--action-noise", "2", "--out", str(out), *extra)
        assert r.returncode == 0, r.stderr
        runs[name] = out
    # bench collector --report wrote it next to timing.json and said so
    assert (runs["new"] / "report.html").is_file()
    assert str(runs["new"] / "report.html") in r.stdout
    return runs


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

#: the phase tree as the page holds it: every view's root and ids, which one is shown, the
#: box drawn on top, the buttons, and what the tables and charts list
_TREE = """
const icicle = document.getElementById('icicle');
const shown = icicle.data.filter(t => t.visible !== false);
const top = document.querySelector('#icicle g.slice');
const pct = document.getElementById('percentiles');
const hist = document.getElementById('histograms');
const over = document.getElementById('over-run');
return JSON.stringify({
  views: icicle.data.map(t => ({root: (t.ids || [])[0], ids: t.ids, labels: t.labels,
                                visible: t.visible !== false})),
  shown_root: shown.length === 1 ? ((shown[0].ids || [])[0] ?? null) : null,
  top_box: top ? top.textContent : null,
  buttons: Array.from(document.querySelectorAll('#icicle .updatemenu-button'))
                .map(b => b.textContent),
  table: pct.data[0].cells.values[0],
  table_header: pct.data[0].header.values,
  table_per_parent: pct.data[0].cells.values[2],
  table_title: pct.layout.title.text,
  histograms: (hist.layout.annotations || []).map(a => a.text),
  over_run: over.data.map(t => t.name),
  title: document.title, h1: document.querySelector('h1').textContent,
  facts: (document.querySelector('p.facts') || {}).textContent || null,
});
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


def _severe(browser: Any) -> list[Any]:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def _tree(browser: Any) -> dict[str, Any]:
    return json.loads(browser.execute_script(_TREE))


def _click_view(browser: Any, name: str) -> dict[str, Any]:
    """Click the tree's view button called ``name`` (a real click in the browser)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    button = next(b for b in browser.find_elements(By.CSS_SELECTOR,
                                                   "#icicle .updatemenu-button")
                  if b.text.strip() == name)
    button.click()
    WebDriverWait(browser, 10).until(lambda d: _tree(d)["top_box"] is not None
                                     and _tree(d)["shown_root"] is not None)
    return _tree(browser)


def test_the_report_renders_every_chart_offline(tmp_path: Path, browser: Any,
                                                collector_runs: dict[str, Path]) -> None:
    report = tmp_path / "cmp" / "report.html"
    r = _cli("report", str(collector_runs["new"]), "--compare", str(collector_runs["base"]),
             "-o", str(report))
    assert r.returncode == 0 and str(report) in r.stdout, r.stderr
    assert _external_sources(report.read_text()) == []  # plotly.js is inlined: no network

    browser.get(report.resolve().as_uri())
    dom = json.loads(browser.execute_script(_DOM))
    errors = _severe(browser)
    assert not errors, errors
    for chart in (*CHART_IDS, "compare-table", "compare-deltas"):
        assert dom[chart]["drawn"] and dom[chart]["svg"] > 0 and dom[chart]["traces"] > 0, chart
    assert dom["top_box"].startswith("reset_done"), dom["top_box"]
    assert dom["table_rows"] > 30  # the p50/p90/p99 of every phase that ran
    assert dom["cost_lines"] == 4  # reset_done and set_state: the calls and the fitted line
    # the compare table leaves out keys that took no time on either side
    keys = browser.execute_script(
        "return document.getElementById('compare-table').data[0].cells.values[0]")
    assert "dr_reset_set_state_ms" in keys and "set_state_mask_ms" not in keys, keys
    assert "never took time" in browser.execute_script(
        "return document.getElementById('compare-table').layout.title.text")
    browser.save_screenshot(str(tmp_path / "report.png"))  # for a person to look at

    alone = _open(browser, collector_runs["new"] / "report.html")  # no --compare
    assert set(alone) >= set(CHART_IDS) and "compare-table" not in alone
    assert not _severe(browser)


def test_the_report_opens_on_the_reset_path(browser: Any,
                                            collector_runs: dict[str, Path]) -> None:
    run = collector_runs["new"]
    stats = json.loads((run / "timing.json").read_text())["stats"]
    idle = {k for k, s in stats.items() if k.endswith("_ms") and s["total_ms"] == 0.0}
    assert "set_state_mask_ms" in idle  # the demo's run: phases that never took time

    browser.get((run / "report.html").resolve().as_uri())
    tree = _tree(browser)
    assert not _severe(browser)
    # the default view: the reset path, rooted at reset_done, with its gaps as boxes
    assert tree["views"][0]["visible"] and tree["shown_root"] == "reset_done_ms", tree
    assert tree["top_box"].startswith("reset_done"), tree["top_box"]
    reset_ids = tree["views"][0]["ids"]
    assert "dr_reset_set_state_ms" in reset_ids and "set_state_internal_gap_ms" in reset_ids
    assert "physics_ms" not in reset_ids and not idle & set(reset_ids)
    assert tree["buttons"] == ["reset path", "env step"], tree["buttons"]
    # one click away: the whole env step
    tree = _click_view(browser, "env step")
    assert tree["shown_root"] == "env_step_total_ms" and tree["top_box"].startswith("env_step")
    assert {"physics_ms", "reset_done_ms", "env_step_other_ms"} <= set(tree["views"][1]["ids"])
    tree = _click_view(browser, "reset path")
    assert tree["shown_root"] == "reset_done_ms"
    # the tables and charts list only keys that ran, and say how many they left out
    shown = set(tree["table"])
    assert "set_state.mask" not in shown and "set_state.reset_rand" in shown, shown
    assert f"{len(idle)} keys that never took time left out" in tree["table_title"]
    assert not {"set_state.mask", "set_state.data_slice"} & set(tree["histograms"])
    assert not {"set_state.mask", "set_state.data_slice"} & set(tree["over_run"])
    assert "?" not in tree["title"] and "g1_walk_flat on mujoco" in tree["h1"]
    assert not _severe(browser)


#: a user's own stack, none of resettrace's classes: a reset with a plan that samples terrain,
#: and an observation outside any env step
USER_MODULE = """
    import time


    def terrain(ids):
        time.sleep(0.0004)


    def plan(ids):
        terrain(ids)
        time.sleep(0.0002)


    def reset(ids):
        plan(ids)
        time.sleep(0.0001)


    def observe():
        time.sleep(0.0001)


    def main():
        for i in range(30):
            observe()
            if i % 2 == 0:
                reset(list(range(i % 5 + 1)))
"""

USER_SPEC = """
    [attributes]
    task = "my-terrain-walk"

    [[phases]]
    span = "dr_reset.plan.terrain"
    parent = "dr_reset.plan"

    [[phases]]
    span = "env_step.observe"
    parent = "env_step"

    [instrument]
    "rt_user_stack:reset" = { phase = "dr_reset", count = "ids" }
    "rt_user_stack:plan" = "dr_reset.plan"
    "rt_user_stack:terrain" = "dr_reset.plan.terrain"
    "rt_user_stack:observe" = "env_step.observe"
"""


def test_the_report_of_a_zero_code_job(tmp_path: Path, browser: Any) -> None:
    """A ``resettrace run --stats-json`` job of a user's own stack (no collector config, no
    env_step, registered phases): the report reads as well as a collector run's."""
    (tmp_path / "rt_user_stack.py").write_text(textwrap.dedent(USER_MODULE))
    (tmp_path / "train.py").write_text("import rt_user_stack\n\nrt_user_stack.main()\n")
    (tmp_path / "spec.toml").write_text(textwrap.dedent(USER_SPEC))
    r = _cli("run", "--no-summary", "--instrument", "spec.toml", "--stats-json", "job.json",
             "--", sys.executable, "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["kind"] == "job" and "env_step_total_ms" not in job["stats"]
    assert job["stats"]["dr_reset_plan_terrain_ms"]["count"] == 15
    r = _cli("report", "job.json", "-o", "report.html", cwd=tmp_path)
    assert r.returncode == 0, r.stderr

    dom = _open(browser, tmp_path / "report.html")
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert not errors, errors
    for chart in ("icicle", "histograms", "percentiles", "over-run"):
        assert dom[chart]["drawn"] and dom[chart]["svg"] > 0 and dom[chart]["traces"] > 0, chart
    tree = _tree(browser)
    # the reset path: the user's dr_reset, with the registered phase under its plan
    assert tree["shown_root"] == "dr_reset_total_ms" and tree["top_box"].startswith("dr_reset")
    reset = tree["views"][0]
    assert {"dr_reset_plan_ms", "dr_reset_plan_terrain_ms"} <= set(reset["ids"])
    assert "dr_reset.plan.terrain" in reset["labels"]
    # no env step here: the other view is every phase recorded
    assert tree["buttons"] == ["reset path", "all phases"], tree["buttons"]
    tree = _click_view(browser, "all phases")
    assert {"dr_reset_total_ms", "env_step_observe_ms"} <= set(tree["views"][1]["ids"])
    assert {"dr_reset.plan.terrain", "env_step.observe"} <= set(tree["table"])
    # calls per call of the parent: each dr_reset has one plan, the root none
    assert tree["table_header"][:3] == ["phase", "count", "per parent"]
    per = dict(zip(tree["table"], tree["table_per_parent"], strict=True))
    assert per["dr_reset"] == "-" and per["dr_reset.plan"] == "1.000", per
    for text in (tree["title"], tree["h1"], tree["facts"]):
        assert "?" not in text, text
    assert "1 process" in tree["facts"] and "train.py" in tree["h1"], tree
    assert not _severe(browser)


def test_report_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{}")
    for args, said in ((["report", str(tmp_path / "none")], "no such run"),
                       (["report", str(tmp_path / "bad.json")], "not a resettrace run record"),
                       (["bench", "collector", "--report", "--steps", "1"], "give --out")):
        r = _cli(*args)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr


#: names that would run script if a page took them as markup or ended its script block
HOSTILE = ("</script><script>window.__pwned=1;alert(1)</script>",
           "<img src=x onerror=\"window.__pwned=2;alert(2)\">",
           "<!--<script>window.__pwned=3</script>\u2028&amp;")

HOSTILE_MODULE = """
    import time


    def inner(ids):
        time.sleep(0.0003)


    def reset(ids):
        inner(ids)
        time.sleep(0.0001)


    def main():
        for i in range(30):
            reset(list(range(i % 5 + 1)))
"""


def _hostile_spec(name: str) -> str:
    phase = json.dumps(f"dr_reset.{name}")
    return textwrap.dedent(f"""
        [[phases]]
        span = {phase}
        parent = "dr_reset"

        [instrument]
        "rt_hostile:reset" = {{ phase = "dr_reset", count = "ids" }}
        "rt_hostile:inner" = {phase}
    """)


def _load_unattended(browser: Any, path: Path) -> list[str]:
    """Open ``path``; the text of every alert it raised (dismissed), in order."""
    from selenium.common.exceptions import NoAlertPresentException, UnexpectedAlertPresentException

    alerts: list[str] = []
    try:
        browser.get(path.resolve().as_uri())
    except UnexpectedAlertPresentException as e:
        alerts.append(str(e.alert_text))
    for _ in range(10):
        try:
            alert = browser.switch_to.alert
            alerts.append(alert.text)
            alert.dismiss()
        except NoAlertPresentException:
            break
    return alerts


@pytest.mark.parametrize("name", HOSTILE, ids=["script", "img", "comment"])
def test_the_report_shows_hostile_names_as_text(tmp_path: Path, browser: Any,
                                                name: str) -> None:
    """A phase name, a config value (the task and backend: attributes of the run) and a
    command line from the record are text in the page: no script of theirs runs, every
    chart draws, and the page shows them as they are."""
    (tmp_path / "rt_hostile.py").write_text(textwrap.dedent(HOSTILE_MODULE))
    (tmp_path / "train.py").write_text("import rt_hostile\n\nrt_hostile.main()\n")
    (tmp_path / "spec.toml").write_text(_hostile_spec(name))
    r = _cli("run", "--no-summary", "--instrument", "spec.toml", "--stats-json", "job.json",
             "--", sys.executable, "train.py", name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = json.loads((tmp_path / "job.json").read_text())
    assert f"dr_reset.{name}" in [p["span"] for p in job["phases"]]
    # a base run to compare with, differing in its config values (what the page lists as
    # not comparable)
    for side, task in (("base", "walk"), ("new", name)):
        (tmp_path / f"{side}.json").write_text(json.dumps(
            dict(job, config={"task": task, "backend": name, "num_envs": 5})))
    r = _cli("report", "new.json", "--compare", "base.json", "-o", "report.html", cwd=tmp_path)
    assert r.returncode == 0, r.stderr

    alerts = _load_unattended(browser, tmp_path / "report.html")
    assert alerts == [], alerts
    assert browser.execute_script("return window.__pwned === undefined")
    dom = json.loads(browser.execute_script(_DOM))
    for chart in ("icicle", "histograms", "percentiles", "over-run", "compare-table",
                  "compare-deltas"):
        assert dom[chart]["drawn"] and dom[chart]["svg"] > 0 and dom[chart]["traces"] > 0, chart
    tree = _tree(browser)
    # Plotly reads markup in its text: the page hands it the name escaped, and it draws
    # the name as it is (the box of the phase, the table's cell)
    assert html.escape(f"dr_reset.{name}", quote=False) in tree["table"], tree
    assert name in tree["h1"], tree
    texts = browser.execute_script(
        "return Array.from(document.querySelectorAll('#icicle g.slice, #percentiles "
        ".cell-text')).map(e => e.textContent)")
    assert any(t.startswith(f"dr_reset.{name}") for t in texts), texts
    assert not browser.execute_script("return document.querySelectorAll('img').length")
    assert not _severe(browser)
