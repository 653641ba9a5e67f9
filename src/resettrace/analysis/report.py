"""``resettrace report RUN [--compare BASE] -o report.html``: one run, seen.

One self-contained HTML file (plotly.js inlined: it opens from disk with no network and no
server) with, for a collector ``timing.json``:

* an icicle (flame-style) chart of the phase tree by mean time per env step (the top box is
  ``env_step``; a phase's width is its share of its parent);
* per-phase latency histograms and a p50 / p90 / p99 table of every key;
* phase time over the run (the median of each run of consecutive calls);
* reset count against reset_done and set_state time per call, with the fitted
  ``a + b*k`` lines of the run's cost model (``timing.json``'s ``model`` section);
* with ``--compare BASE``: the compare table (``resettrace compare BASE RUN``) and the
  per-phase deltas with their intervals, coloured by verdict.

The file is written by the rules of :mod:`resettrace.outputs`: never through a symbolic
link, and over an existing file only when it is empty or a resettrace report (its first
bytes: the doctype, ``<html lang="en">`` and a ``<title>resettrace report: ...``); any
other file is left as it is and the report goes to ``NAME.1.html`` beside it.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from resettrace import catalog as C
from resettrace.record import RecordError, RunRecord, read_record

__all__ = ["build_report", "write_report", "CHART_IDS"]

#: the chart divs of every report (``compare-*`` only with a base run)
CHART_IDS = ("icicle", "histograms", "percentiles", "over-run", "cost-model")
#: histograms and over-the-run lines for this many of the costliest reset-path keys
_TOP = 9
#: calls drawn in the reset count scatter
_MAX_POINTS = 5000
_VERDICT_COLOURS = {"slower": "#d62728", "faster": "#2ca02c", "within noise": "#7f7f7f",
                    "new": "#ff7f0e", "gone": "#1f77b4"}


def _icicle(stats: Mapping[str, Mapping[str, Any]], cat: Any) -> Any:
    import plotly.graph_objects as go

    steps = stats.get(C.ENV_STEP.key, {}).get("count") or 1
    value = {k: s["total_ms"] / steps for k, s in stats.items()
             if k.endswith("_ms") and s.get("total_ms") is not None}
    ids, parents, values = [], [], []
    for key in cat.all_keys():
        if key not in value or value[key] <= 0:
            continue
        parent = cat.parent_key(key)
        if key != C.ENV_STEP.key and (parent is None or parent not in ids):
            continue  # outside the env step tree
        ids.append(key)
        parents.append("" if key == C.ENV_STEP.key else parent)
        values.append(value[key])
    # children may add up a hair above their parent (rounding): scale them into it
    for i, key in enumerate(ids):
        kids = [j for j, p in enumerate(parents) if p == key]
        total = sum(values[j] for j in kids)
        if total > values[i] > 0:
            for j in kids:
                values[j] *= values[i] / total
    return go.Figure(go.Icicle(
        ids=ids, labels=[cat.label(k) for k in ids], parents=parents, values=values,
        branchvalues="total", tiling={"orientation": "v"}, sort=False,
        hovertemplate="%{label}<br>%{value:.4f} ms per env step<br>"
                      "%{percentParent:.1%} of its parent<extra></extra>",
        texttemplate="%{label}<br>%{value:.3f} ms"),
        layout={"title": "phase tree: mean ms per env step (click a box to zoom into it)",
                "height": 620,
                "margin": {"t": 50, "l": 10, "r": 10, "b": 10}})


def _top_keys(stats: Mapping[str, Mapping[str, Any]], samples: Mapping[str, Sequence[float]],
              cat: Any) -> list[str]:
    skip = {C.ENV_STEP.key, C.PHYSICS.key}
    keys = [k for k in cat.all_keys() if k in samples and k.endswith("_ms")
            and k not in skip and stats.get(k, {}).get("total_ms")]
    return sorted(keys, key=lambda k: -stats[k]["total_ms"])[:_TOP]


def _histograms(stats: Mapping[str, Mapping[str, Any]], samples: Mapping[str, Sequence[float]],
                keys: Sequence[str], cat: Any) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    cols = 3
    rows = max(1, math.ceil(len(keys) / cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[cat.label(k) for k in keys])
    for i, key in enumerate(keys):
        r, c = i // cols + 1, i % cols + 1
        v = np.asarray(samples[key], dtype=np.float64)
        hi = float(np.percentile(v, 99.5)) if v.size else 1.0
        fig.add_trace(go.Histogram(x=v[v <= hi], nbinsx=60, name=cat.label(key),
                                   showlegend=False, marker_color="#4c78a8"), row=r, col=c)
        for q, dash in (("p50_ms", "solid"), ("p90_ms", "dash"), ("p99_ms", "dot")):
            x = stats[key].get(q)
            if x is not None:
                fig.add_vline(x=x, line_dash=dash, line_color="#d62728", row=r, col=c)
        fig.update_xaxes(title_text="ms", row=r, col=c)
    fig.update_layout(title="latency per call (lines: p50 solid, p90 dashed, p99 dotted; "
                            "x cut at p99.5)", height=260 * rows + 80, bargap=0.02)
    return fig


def _percentiles(stats: Mapping[str, Mapping[str, Any]], cat: Any) -> Any:
    import plotly.graph_objects as go

    keys = [k for k in cat.all_keys() if k in stats and k.endswith("_ms")]
    cols = ["count", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms"]
    cells = [[cat.label(k) for k in keys]] + [
        [("-" if stats[k].get(c) is None else
          f"{stats[k][c]:,}" if c == "count" else f"{stats[k][c]:.4f}") for k in keys]
        for c in cols]
    return go.Figure(go.Table(header={"values": ["phase", *cols], "align": "left"},
                              cells={"values": cells, "align": "left"}),
                     layout={"title": "per phase: p50 / p90 / p99 (ms)",
                             "height": 28 * len(keys) + 120, "margin": {"t": 50, "b": 10}})


def _over_run(samples: Mapping[str, Sequence[float]], keys: Sequence[str], cat: Any) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for key in [C.PHYSICS.key, *keys]:
        v = np.asarray(samples.get(key, []), dtype=np.float64)
        if not v.size:
            continue
        block = max(1, v.size // 200)
        m = v.size // block
        med = np.median(v[:m * block].reshape(m, block), axis=1)
        fig.add_trace(go.Scatter(x=np.arange(m) * block, y=med, mode="lines",
                                 name=cat.label(key),
                                 yaxis="y2" if key == C.PHYSICS.key else "y"))
    fig.update_layout(title="phase time over the run (median of each block of consecutive "
                            "calls; physics on the right axis)",
                      xaxis_title="call", yaxis_title="ms",
                      yaxis2={"title": "physics ms", "overlaying": "y", "side": "right"},
                      legend={"orientation": "h", "y": -0.2}, height=520)
    return fig


def _cost_model(samples: Mapping[str, Sequence[float]], model: Mapping[str, Any], cat: Any
                ) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    k = np.asarray(samples.get(C.RESET_DONE_COUNT, []), dtype=np.float64)
    # SVG markers (no WebGL: a headless or GPU-less browser draws them too), at most
    # _MAX_POINTS calls drawn, an even subset
    pick = np.unique(np.linspace(0, k.size - 1, min(k.size, _MAX_POINTS)).astype(np.intp)) \
        if k.size else np.zeros(0, np.intp)
    for key, colour in ((C.RESET_DONE.key, "#4c78a8"), (C.SET_STATE.key, "#f58518")):
        y = np.asarray(samples.get(key, []), dtype=np.float64)
        if k.size and y.size == k.size:  # one sample of each per reset_done call, in order
            fig.add_trace(go.Scatter(x=k[pick], y=y[pick], mode="markers",
                                     name=f"{cat.label(key)} calls"
                                     + (f" ({pick.size} of {k.size})" if pick.size < k.size
                                        else ""),
                                     marker={"size": 4, "opacity": 0.35, "color": colour}))
        fit = (model.get("keys") or {}).get(key, {}).get("fit")
        if fit and fit.get("b_ms") is not None and fit.get("k_max") is not None:
            xs = np.array([fit["k_min"], fit["k_max"]])
            label = (f"{cat.label(key)}: {fit['a_ms']:.4f} ms + "
                     f"{1e3 * fit['b_ms']:.2f} us x k"
                     + (f" (R2 {fit['r2']:.2f})" if fit.get("r2") is not None else ""))
            fig.add_trace(go.Scatter(x=xs, y=fit["a_ms"] + fit["b_ms"] * xs, mode="lines",
                                     name=label, line={"color": colour, "width": 3}))
    fig.update_layout(title="envs reset per call against reset_done and set_state time, "
                            "with the fitted a + b*k", xaxis_title="k (envs reset)",
                      yaxis_title="ms", height=480)
    return fig


def _compare_figures(result: Mapping[str, Any], cat: Any) -> tuple[Any, Any]:
    import plotly.graph_objects as go

    keys = [k for k in result["keys"] if k["verdict"] not in ("new", "gone")
            and (k["base_mean"] or k["new_mean"])]

    def f(x: Any, spec: str = ".4f") -> str:
        return "-" if x is None else format(x, spec)

    rows = [[k["key"] for k in result["keys"]],
            [f(k["base_p50"]) for k in result["keys"]], [f(k["new_p50"]) for k in result["keys"]],
            [f(k["delta_ms"]) for k in result["keys"]],
            [f(k["delta_pct"], "+.1f") for k in result["keys"]],
            ["-" if k["ci_low_pct"] is None
             else f"[{k['ci_low_pct']:+.1f}, {k['ci_high_pct']:+.1f}]" for k in result["keys"]],
            [k["verdict"] for k in result["keys"]]]
    colours = [[_VERDICT_COLOURS.get(k["verdict"], "#000") for k in result["keys"]]]
    e = result["env_per_s"]
    table = go.Figure(go.Table(
        header={"values": ["key", "base p50", "new p50", "delta ms", "delta %", "interval %",
                           "verdict"], "align": "left"},
        cells={"values": rows, "align": "left",
               "font": {"color": [["#000"] * len(rows[0])] * 6 + colours}}),
        layout={"title": f"compare: env/s {e['base']:,.0f} -> {e['new']:,.0f}; noise floor "
                         f"+-{result['settings']['noise_floor_pct']:.1f}%"
                         + ("; NOT COMPARABLE: " + "; ".join(result["not_comparable"])
                            if result["not_comparable"] else ""),
                "height": 26 * len(rows[0]) + 130, "margin": {"t": 60, "b": 10}})
    deltas = go.Figure(go.Bar(
        y=[cat.label(k["key"]) for k in keys], x=[k["delta_pct"] or 0.0 for k in keys],
        orientation="h",
        error_x={"type": "data", "symmetric": False,
                 "array": [(k["ci_high_pct"] or 0) - (k["delta_pct"] or 0) for k in keys],
                 "arrayminus": [(k["delta_pct"] or 0) - (k["ci_low_pct"] or 0) for k in keys]},
        marker_color=[_VERDICT_COLOURS.get(k["verdict"], "#000") for k in keys],
        text=["took no time before" if k["delta_pct"] is None else "" for k in keys],
        textposition="outside", hovertext=[k["verdict"] for k in keys]),
        layout={"title": "delta per phase, % (bar: NEW/BASE - 1, whiskers: the interval; red "
                         "slower, green faster, grey within noise)",
                "height": 22 * len(keys) + 140, "yaxis": {"autorange": "reversed"},
                "xaxis_title": "%"})
    return table, deltas


def build_report(run: RunRecord | Mapping[str, Any], *, source: str = "",
                 compare: Mapping[str, Any] | None = None) -> str:
    """The report of one run record (or its JSON) as an HTML string."""
    import plotly.offline

    rec = run if isinstance(run, RunRecord) else RunRecord.from_json(run, source)
    source = source or rec.source
    cat = rec.catalog()
    stats = rec.stats
    samples = rec.samples
    if not any(k.endswith("_ms") and s.get("count") for k, s in stats.items()):
        raise RecordError(f"{source or 'run'}: no timed phase in this run record")
    top = _top_keys(stats, samples, cat)
    figures = {"icicle": _icicle(stats, cat), "histograms": _histograms(stats, samples, top, cat),
               "percentiles": _percentiles(stats, cat), "over-run": _over_run(samples, top, cat),
               "cost-model": _cost_model(samples, rec.model or {}, cat)}
    if compare is not None:
        figures["compare-table"], figures["compare-deltas"] = _compare_figures(compare, cat)
    title = f"resettrace report: {rec.title}"
    facts = [f"mode {rec.mode}"]
    if rec.env_per_s:
        facts.insert(0, f"env/s {rec.env_per_s:,.0f}")
    if rec.reset_fraction is not None:
        facts.insert(1, f"{100 * float(rec.reset_fraction):.2f}% of envs reset per step")
    sim = rec.sim or {}
    if sim.get("sim_s_per_step"):
        facts.append(f"{sim['sim_s_per_step']:g} s simulated per env step "
                     f"({sim.get('substeps')} substeps)")
    divs = []
    for name, fig in figures.items():
        spec = json.loads(fig.to_json())
        divs.append(f'<section><div id="{name}" class="chart"></div><script>'
                    f'Plotly.newPlot("{name}", {json.dumps(spec["data"])}, '
                    f'{json.dumps(spec["layout"])}, {{"responsive": true}});</script></section>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:16px}section{margin-bottom:24px}"
            "</style>"
            f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
            f"<h1>{html.escape(title)}</h1><p>{html.escape('; '.join(facts))}</p>"
            + (f"<p>source: {html.escape(source)}</p>" if source else "")
            + "".join(divs) + "</body></html>\n")


def write_report(run_path: str | Path, out: str | Path, *,
                 compare_base: str | Path | None = None) -> Path:
    """Write the report of the run at ``run_path`` (a run record, or the folder of its
    ``timing.json``); the path written (``out``, or a name beside it: see the module
    docstring)."""
    from resettrace.analysis.compare import Run, compare_runs, load_runs

    path = Path(run_path)
    if path.is_dir():
        path = path / "timing.json"
    if not path.is_file():
        raise FileNotFoundError(f"no such run: {path}")
    rec = read_record(path)
    compared = None
    if compare_base is not None:
        compared = compare_runs(load_runs(compare_base), [Run.of(rec)])
    text = build_report(rec, source=str(path), compare=compared)
    from resettrace import outputs

    target = Path(out)
    try:
        return outputs.write_output(target, outputs.REPORT_HTML, text.encode())
    except outputs.OutputRefused as e:
        raise ValueError(str(e)) from None
    except OSError as e:
        raise ValueError(f"cannot write {target}: {e.strerror or e}") from None
