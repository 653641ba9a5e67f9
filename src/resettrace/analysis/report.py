"""``resettrace report RUN [--compare BASE] -o report.html``: one run, seen.

One self-contained HTML file (plotly.js inlined: it opens from disk with no network and no
server) of any run record: a collector ``timing.json``, a ``resettrace run`` job or process
record, ``write_run``'s, the pytest plugin's. Everything is read through the record's own
phase catalog (:meth:`~resettrace.record.RunRecord.catalog`: registered phases included).
The page holds:

* the title and facts of the run (:attr:`~resettrace.record.RunRecord.title`, env/s, the
  share of envs reset per env step, a job's processes, wall time, mode): only what the record
  knows;
* the phase tree, an icicle chart (:data:`VIEWS`) that opens on the **reset path**: rooted at
  ``reset_done`` when it ran, else at the outermost phase of the reset path that ran
  (``dr_reset``, ``set_state``, or a phase below them, registered ones included), else at the
  largest root. A box is a phase's mean ms per env step (where ``env_step`` ran; else per
  call of the root), with its share of its parent; what a phase spent outside the phases
  drawn below it is a grey box of its own, ``<phase> (rest)``, so every account closes. A
  phase whose parent never ran hangs from its nearest ancestor that did. One click (the
  ``env step`` button) shows the whole env step tree; in a run without ``env_step`` the
  button is ``all phases`` (every tree recorded, in total ms when there are several);
* per-phase latency histograms (the costliest keys, reset path first) and a table of the
  count, mean, p50 / p90 / p99, max and share of parent of every key that ran;
* phase time over the run (the median of each run of consecutive calls);
* reset count against reset_done and set_state time per call, with the fitted
  ``a + b*k`` lines of the run's cost model (the record's ``model`` section);
* with ``--compare BASE``: the compare table (``resettrace compare BASE RUN``) and the
  per-phase deltas with their intervals, coloured by verdict.

Keys that never took time (a phase that never ran, or one at 0.0 ms in every call, as most
of set_state's phases in a run without randomization; :func:`~resettrace.analysis.job_lines.ran`)
are left out of the tree, the tables, the charts and the compare section, and each says how
many it left out.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from resettrace import catalog as C
from resettrace.analysis.job_lines import ran
from resettrace.extras import require
from resettrace.record import RecordError, RunRecord, per_parent, read_record

__all__ = ["build_report", "write_report", "reset_root", "CHART_IDS", "VIEWS"]

#: the chart divs of every report (``compare-*`` only with a base run)
CHART_IDS = ("icicle", "histograms", "percentiles", "over-run", "cost-model")
#: the phase tree's views, in the order of its buttons (the first opens): the reset path,
#: then the whole env step (``all phases`` when the run has no ``env_step``)
VIEWS = ("reset path", "env step", "all phases")
#: histograms and over-the-run lines for this many of the costliest keys
_TOP = 9
#: calls drawn in the reset count scatter
_MAX_POINTS = 5000
_VERDICT_COLOURS = {"slower": "#d62728", "faster": "#2ca02c", "within noise": "#7f7f7f",
                    "new": "#ff7f0e", "gone": "#1f77b4"}
#: the tree's colours: a phase's by its place in the catalog (the same in every view, and
#: a phase's neighbours differ from it); the "(rest)" boxes'; the synthetic root's
_PHASE_COLOURS = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b",
                  "#b279a2", "#ff9da6", "#9d755d")
_REST_COLOUR = "#d9d9d9"
_ALL_COLOUR = "#c6dbef"
#: children may add up a hair above their parent (rounding, or a phase that ran outside
#: its parent): they are scaled into it, this much below it, so the chart's sums hold
_SLACK = 1e-9
#: a "(rest)" box below this share of its phase is rounding, not time
_MIN_REST = 1e-6
#: the synthetic root of ``all phases`` when the run recorded several trees
_ALL_ROOT = "(every phase recorded)"


def _t(text: object) -> str:
    """A string from the record as Plotly text: Plotly reads ``<b>``, ``<a href>``, ... in
    labels, titles, names and cells as markup; escaped, it shows the string as it is."""
    return html.escape(str(text), quote=False)


def _script_json(value: Any) -> str:
    """``value`` as JSON that can stand inside a ``<script>`` block: no ``<``, ``>`` or
    ``&`` (``</script>`` or ``<!--`` in a string would end or change the block) and no
    U+2028/U+2029 (line ends to older JavaScript); each is a ``\\uXXXX`` escape, the same
    string to ``JSON.parse`` and to JavaScript."""
    text = json.dumps(value)
    for ch in "<>&\u2028\u2029":
        text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def _shown_keys(stats: Mapping[str, Mapping[str, Any]], cat: Any) -> list[str]:
    """The timing keys that ran, in the record's phase order, then the others by name."""
    took = ran(stats)
    ordered = [k for k in cat.all_keys() if k in took and k.endswith("_ms")]
    known = set(ordered)
    return ordered + sorted(k for k in took if k.endswith("_ms") and k not in known)


def _idle(stats: Mapping[str, Mapping[str, Any]], shown: Sequence[str]) -> int:
    """How many timing keys of ``stats`` are not in ``shown`` (they never took time)."""
    return sum(1 for k in stats if k.endswith("_ms")) - len(shown)


def _left_out(n: int, what: str = "") -> str:
    return f"; {_plural(n, 'key')} that never took time{what} left out" if n else ""


# -- the phase tree -----------------------------------------------------------------------------
def _timed_parents(stats: Mapping[str, Mapping[str, Any]], cat: Any) -> dict[str, str | None]:
    """Per phase key that took time, the key of its nearest ancestor that did (None: it is a
    root of the tree), in the catalog's order (parents first)."""
    timed = {k for k, s in ran(stats).items()
             if k in cat.by_key and float(s["total_ms"]) > 0}
    out: dict[str, str | None] = {}
    for key in cat.all_keys():
        if key not in timed:
            continue
        parent = cat.parent_key(key)
        while parent is not None and parent not in timed:
            parent = cat.parent_key(parent)
        out[key] = parent
    return out


def _key_of(cat: Any, phase: C.Phase) -> str | None:
    """The record's key of a built-in phase (None: not in the record)."""
    mine = cat.get(phase.span)
    return None if mine is None else mine.key


def reset_root(stats: Mapping[str, Mapping[str, Any]], cat: Any) -> tuple[str | None, bool]:
    """The key the tree opens on, and whether it is on the reset path: ``reset_done`` when
    it took time; else the outermost phase of the reset path that did (``reset_done``'s,
    ``dr_reset``'s or ``set_state``'s subtree in the record's catalog ``cat``; the costliest
    if several); else the costliest root (False); ``(None, False)`` with no phase at all."""
    parents = _timed_parents(stats, cat)
    if not parents:
        return None, False
    reset = _key_of(cat, C.RESET_DONE)
    if reset in parents:
        return reset, True
    path: set[str] = set()
    for builtin in (C.RESET_DONE, C.DR_RESET, C.SET_STATE):
        phase = cat.get(builtin.span)
        if phase is not None:
            path |= {phase.key, *(p.key for p in cat.descendants(phase))}
    outer = [k for k in parents if k in path and parents[k] not in path]
    roots = outer or [k for k, p in parents.items() if p is None]
    best = max(roots, key=lambda k: float(stats[k]["total_ms"]))
    return best, bool(outer)


@dataclass
class _View:
    """One view of the phase tree: an icicle trace's nodes and the view's title."""

    name: str
    title: str
    ids: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    hover: list[str] = field(default_factory=list)
    colours: list[str] = field(default_factory=list)

    def add(self, id_: str, label: str, parent: str, value: float, text: str, hover: str,
            colour: str) -> None:
        self.ids.append(id_)
        self.labels.append(label)
        self.parents.append(parent)
        self.values.append(value)
        self.text.append(text)
        self.hover.append(hover)
        self.colours.append(colour)


def _fill(view: _View, roots: Sequence[str], parents: Mapping[str, str | None],
          stats: Mapping[str, Mapping[str, Any]], cat: Any, per: float, unit: str) -> None:
    """Add the trees of ``roots`` to ``view`` (under a synthetic root when there are
    several): values are total ms / ``per``; each phase's time outside its children drawn
    below it is a "(rest)" box, so that every box is filled by its children."""
    kids: dict[str, list[str]] = {}
    for key, parent in parents.items():
        if parent is not None:
            kids.setdefault(parent, []).append(key)

    def raw(key: str) -> float:
        return float(stats[key]["total_ms"]) / per

    def node(key: str, parent: str, parent_label: str, value: float) -> None:
        s = stats[key]
        phase = cat.by_key[key]
        label = cat.label(key)
        calls = int(s["count"])
        mean = float(s["total_ms"]) / calls if calls else float("nan")
        share = f"{value / pv:.1%}" if (pv := _value_of(view, parent)) else ""
        text = f"{value:.3f} ms" + (f", {share}" if share else f" {unit}")
        hover = (f"<b>{html.escape(label)}</b><br>{value:.4f} ms {unit}"
                 + (f" ({share} of {html.escape(parent_label)})" if share else "")
                 + f"<br>{_plural(calls, 'call')}, {mean:.4f} ms per call")
        view.add(key, _t(label), parent, value, text, hover,
                 _PHASE_COLOURS[phase.index % len(_PHASE_COLOURS)])
        children = kids.get(key, [])
        values = [raw(k) for k in children]
        total = sum(values)
        if total > value * (1 - _SLACK):
            values = [v * value * (1 - _SLACK) / total for v in values]
        for k, v in zip(children, values, strict=True):
            node(k, key, label, v)
        rest = value - sum(values)
        if children and rest > _MIN_REST * value:
            rest_id = phase.gap_key or f"{key} (rest)"
            rest_label = f"{label} (rest)"
            view.add(rest_id, _t(rest_label), key, rest, f"{rest:.3f} ms, {rest / value:.1%}",
                     f"<b>{html.escape(rest_label)}</b><br>{rest:.4f} ms {unit} "
                     f"({rest / value:.1%} of {html.escape(label)}): time in "
                     f"{html.escape(label)} outside the phases drawn below it", _REST_COLOUR)

    if len(roots) == 1:
        node(roots[0], "", "", raw(roots[0]))
        return
    total = sum(raw(k) for k in roots)
    view.add(_ALL_ROOT, _ALL_ROOT, "", total, f"{total:.3f} ms {unit}",
             f"<b>every phase recorded</b><br>{total:.4f} ms {unit}", _ALL_COLOUR)
    for key in roots:
        node(key, _ALL_ROOT, "every phase recorded", raw(key))


def _value_of(view: _View, id_: str) -> float:
    """The value of node ``id_`` of ``view`` (0.0 for a root's parent, "")."""
    return view.values[view.ids.index(id_)] if id_ else 0.0


def _views(stats: Mapping[str, Mapping[str, Any]], cat: Any) -> list[_View]:
    """The phase tree's views: the reset path first, then (where it differs) the env step,
    else every phase recorded."""
    parents = _timed_parents(stats, cat)
    root, on_path = reset_root(stats, cat)
    if root is None:
        return []
    step = _key_of(cat, C.ENV_STEP)
    if step not in parents:
        step = None
    steps = 0 if step is None else int(stats[step]["count"])

    def per_call(key: str) -> tuple[float, str]:
        if steps:
            return float(steps), "per env step"
        return float(stats[key]["count"]), f"per {_t(cat.label(key))} call"

    per, unit = per_call(root)
    share = (f" ({float(stats[root]['total_ms']) / float(stats[step]['total_ms']):.1%} of the "
             "env step)") if step is not None and root != step else ""
    first = _View(VIEWS[0] if on_path else _t(cat.label(root)),
                  f"{'reset path' if on_path else 'phase tree'}: {_t(cat.label(root))}, mean ms "
                  f"{unit}{share}, {_plural(int(stats[root]['count']), 'call')}")
    _fill(first, [root], parents, stats, cat, per, unit)
    if step is not None:
        second = _View(VIEWS[1], f"env step: mean ms per env step, "
                                 f"{_plural(steps, 'env step')}")
        roots = [step]
    else:
        roots = [k for k, p in parents.items() if p is None]
        if len(roots) == 1:
            per, unit = per_call(roots[0])
        else:
            per, unit = 1.0, "in the whole run"
        second = _View(VIEWS[2], f"all phases: ms {unit}, {_plural(len(roots), 'tree')} "
                                 "recorded")
    if roots == [root]:
        return [first]
    _fill(second, roots, parents, stats, cat, per, unit)
    return [first, second]


def _icicle(stats: Mapping[str, Mapping[str, Any]], cat: Any) -> Any:
    import plotly.graph_objects as go

    views = _views(stats, cat)
    fig = go.Figure()
    for i, v in enumerate(views):
        fig.add_trace(go.Icicle(
            ids=v.ids, labels=v.labels, parents=v.parents, values=v.values, text=v.text,
            hovertext=v.hover, name=v.name, visible=i == 0, branchvalues="total",
            sort=False, tiling={"orientation": "v"}, marker={"colors": v.colours},
            texttemplate="%{label}<br>%{text}", hovertemplate="%{hovertext}<extra></extra>",
            pathbar={"visible": True, "side": "bottom"}))
    hint = "; click a box to zoom into it"
    layout: dict[str, Any] = {
        "title": {"text": (views[0].title + hint) if views else
                  "phase tree: no phase of the run's catalog took time"},
        "height": 640, "margin": {"t": 90, "l": 10, "r": 10, "b": 30},
        "uniformtext": {"minsize": 10, "mode": "hide"}}
    if len(views) > 1:  # the buttons sit between the title and the tree
        layout["updatemenus"] = [{
            "type": "buttons", "direction": "right", "showactive": True, "active": 0,
            "x": 0, "xanchor": "left", "y": 1.0, "yanchor": "bottom", "pad": {"b": 6},
            "buttons": [{"label": v.name, "method": "update",
                         "args": [{"visible": [j == i for j in range(len(views))]},
                                  {"title.text": v.title + hint}]}
                        for i, v in enumerate(views)]}]
    fig.update_layout(layout)
    return fig


# -- the other charts ----------------------------------------------------------------------------
def _top_keys(stats: Mapping[str, Mapping[str, Any]], samples: Mapping[str, Sequence[float]],
              shown: Sequence[str], first: Sequence[str], cat: Any) -> list[str]:
    """The costliest keys that ran and have samples: those of ``first`` (the reset path),
    then the others; never the env step or physics (they dwarf the rest)."""
    skip = {_key_of(cat, C.ENV_STEP), _key_of(cat, C.PHYSICS)}
    keys = [k for k in shown if k in samples and k not in skip]
    head = set(first)

    def cost(k: str) -> tuple[bool, float]:
        return k not in head, -float(stats[k]["total_ms"])

    return sorted(keys, key=cost)[:_TOP]


def _histograms(stats: Mapping[str, Mapping[str, Any]], samples: Mapping[str, Sequence[float]],
                keys: Sequence[str], ran_count: int, cat: Any) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    cols = 3
    rows = max(1, math.ceil(len(keys) / cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[_t(cat.label(k)) for k in keys])
    for i, key in enumerate(keys):
        r, c = i // cols + 1, i % cols + 1
        v = np.asarray(samples[key], dtype=np.float64)
        hi = float(np.percentile(v, 99.5)) if v.size else 1.0
        fig.add_trace(go.Histogram(x=v[v <= hi], nbinsx=60, name=_t(cat.label(key)),
                                   showlegend=False, marker_color="#4c78a8"), row=r, col=c)
        for q, dash in (("p50_ms", "solid"), ("p90_ms", "dash"), ("p99_ms", "dot")):
            x = stats[key].get(q)
            if x is not None:
                fig.add_vline(x=x, line_dash=dash, line_color="#d62728", row=r, col=c)
        fig.update_xaxes(title_text="ms", row=r, col=c)
    fig.update_layout(title=f"latency per call of the {len(keys)} costliest of the "
                            f"{ran_count} keys that ran, reset path first (lines: p50 solid, "
                            "p90 dashed, p99 dotted; x cut at p99.5)",
                      height=260 * rows + 80, bargap=0.02)
    return fig


def _percentiles(stats: Mapping[str, Mapping[str, Any]], keys: Sequence[str], idle: int,
                 cat: Any) -> Any:
    import plotly.graph_objects as go

    cols = ["count", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms"]

    def cell(key: str, col: str) -> str:
        x = stats[key].get(col)
        if x is None or (isinstance(x, float) and not math.isfinite(x)):
            return "-"
        return f"{x:,}" if col == "count" else f"{x:.4f}"

    def cell_col(col: str) -> list[str]:
        return [cell(k, col) for k in keys]

    share = [("-" if stats[k].get("share_of_parent") is None
              else f"{100 * float(stats[k]['share_of_parent']):.1f}") for k in keys]
    per = [("-" if (n := per_parent(stats, cat, k)) is None else f"{n:.3f}") for k in keys]
    cells = [[_t(cat.label(k)) for k in keys], cell_col("count"), per,
             *[cell_col(c) for c in cols[1:]], share]
    return go.Figure(go.Table(header={"values": ["phase", "count", "per parent", *cols[1:],
                                                 "% of parent"],
                                      "align": "left"},
                              cells={"values": cells, "align": "left"}),
                     layout={"title": f"per phase that ran: p50 / p90 / p99 (ms)"
                                      f"{_left_out(idle)}",
                             "height": 21 * len(keys) + 110, "margin": {"t": 50, "b": 10}})


def _over_run(samples: Mapping[str, Sequence[float]], keys: Sequence[str],
              stats: Mapping[str, Mapping[str, Any]], cat: Any) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    physics = _key_of(cat, C.PHYSICS)
    drawn = [physics] if physics in ran(stats) else []
    for key in [*drawn, *keys]:
        v = np.asarray(samples.get(key, []), dtype=np.float64)
        if not v.size:
            continue
        block = max(1, v.size // 200)
        m = v.size // block
        med = np.median(v[:m * block].reshape(m, block), axis=1)
        fig.add_trace(go.Scatter(x=np.arange(m) * block, y=med, mode="lines",
                                 name=_t(cat.label(key)), yaxis="y2" if key == physics else "y"))
    layout: dict[str, Any] = {
        "title": "phase time over the run (median of each block of consecutive calls"
                 + ("; physics on the right axis)" if drawn else ")"),
        "xaxis_title": "call", "yaxis_title": "ms", "legend": {"orientation": "h", "y": -0.2},
        "height": 520}
    if drawn:
        layout["yaxis2"] = {"title": "physics ms", "overlaying": "y", "side": "right"}
    fig.update_layout(layout)
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
    for phase, colour in ((C.RESET_DONE, "#4c78a8"), (C.SET_STATE, "#f58518")):
        key = _key_of(cat, phase)
        if key is None:
            continue
        y = np.asarray(samples.get(key, []), dtype=np.float64)
        if k.size and y.size == k.size:  # one sample of each per reset_done call, in order
            fig.add_trace(go.Scatter(x=k[pick], y=y[pick], mode="markers",
                                     name=f"{_t(cat.label(key))} calls"
                                     + (f" ({pick.size} of {k.size})" if pick.size < k.size
                                        else ""),
                                     marker={"size": 4, "opacity": 0.35, "color": colour}))
        fit = (model.get("keys") or {}).get(key, {}).get("fit")
        if fit and fit.get("b_ms") is not None and fit.get("k_max") is not None:
            xs = np.array([fit["k_min"], fit["k_max"]])
            label = (f"{_t(cat.label(key))}: {fit['a_ms']:.4f} ms + "
                     f"{1e3 * fit['b_ms']:.2f} us x k"
                     + (f" (R2 {fit['r2']:.2f})" if fit.get("r2") is not None else ""))
            fig.add_trace(go.Scatter(x=xs, y=fit["a_ms"] + fit["b_ms"] * xs, mode="lines",
                                     name=label, line={"color": colour, "width": 3}))
    title = ("envs reset per call against reset_done and set_state time, with the fitted "
             "a + b*k")
    if not fig.data:  # a run that recorded no reset counts: say so, draw no empty axes
        fig.update_layout(
            title=title, height=200, xaxis={"visible": False}, yaxis={"visible": False},
            plot_bgcolor="rgba(0,0,0,0)",
            annotations=[{"text": "this run has no reset counts: reset_done (with the envs "
                                  "it reset) and set_state did not run",
                          "showarrow": False, "xref": "paper", "yref": "paper",
                          "x": 0.5, "y": 0.5}])
        return fig
    fig.update_layout(title=title, xaxis_title="k (envs reset)", yaxis_title="ms", height=480)
    return fig


def _compare_figures(result: Mapping[str, Any], cat: Any) -> tuple[Any, Any]:
    import plotly.graph_objects as go

    def took(x: Any) -> bool:
        return x is not None and x != 0

    listed = [k for k in result["keys"] if took(k["base_mean"]) or took(k["new_mean"])]
    idle = len(result["keys"]) - len(listed)
    keys = [k for k in listed if k["verdict"] not in ("new", "gone")]

    def f(x: Any, spec: str = ".4f") -> str:
        return "-" if x is None else format(x, spec)

    rows = [[_t(k["key"]) for k in listed],
            [f(k["base_p50"]) for k in listed], [f(k["new_p50"]) for k in listed],
            [f(k["delta_ms"]) for k in listed],
            [f(k["delta_pct"], "+.1f") for k in listed],
            ["-" if k["ci_low_pct"] is None
             else f"[{k['ci_low_pct']:+.1f}, {k['ci_high_pct']:+.1f}]" for k in listed],
            [_t(k["verdict"]) for k in listed]]
    colours = [[_VERDICT_COLOURS.get(k["verdict"], "#000") for k in listed]]
    e = result["env_per_s"]
    speed = f"env/s {e['base']:,.0f} -> {e['new']:,.0f}; " if e["base"] or e["new"] else ""
    table = go.Figure(go.Table(
        header={"values": ["key", "base p50", "new p50", "delta ms", "delta %", "interval %",
                           "verdict"], "align": "left"},
        cells={"values": rows, "align": "left",
               "font": {"color": [["#000"] * len(rows[0])] * 6 + colours}}),
        layout={"title": f"compare: {speed}noise floor "
                         f"+-{result['settings']['noise_floor_pct']:.1f}%"
                         + _left_out(idle, " on either side")
                         + ("; NOT COMPARABLE: " + _t("; ".join(result["not_comparable"]))
                            if result["not_comparable"] else ""),
                "height": 21 * len(rows[0]) + 120, "margin": {"t": 60, "b": 10}})
    deltas = go.Figure(go.Bar(
        y=[_t(cat.label(k["key"])) for k in keys], x=[k["delta_pct"] or 0.0 for k in keys],
        orientation="h",
        error_x={"type": "data", "symmetric": False,
                 "array": [(k["ci_high_pct"] or 0) - (k["delta_pct"] or 0) for k in keys],
                 "arrayminus": [(k["delta_pct"] or 0) - (k["ci_low_pct"] or 0) for k in keys]},
        marker_color=[_VERDICT_COLOURS.get(k["verdict"], "#000") for k in keys],
        text=["took no time before" if k["delta_pct"] is None else "" for k in keys],
        textposition="outside", hovertext=[_t(k["verdict"]) for k in keys]),
        layout={"title": "delta per phase, % (bar: NEW/BASE - 1, whiskers: the interval; red "
                         "slower, green faster, grey within noise)",
                "height": 22 * len(keys) + 140, "yaxis": {"autorange": "reversed"},
                "xaxis_title": "%"})
    return table, deltas


# -- the page ----------------------------------------------------------------------------------
def _facts(rec: RunRecord) -> list[str]:
    """What the record knows about the run, one short phrase each."""
    facts = []
    if rec.env_per_s:
        facts.append(f"env/s {rec.env_per_s:,.0f}")
    if rec.reset_fraction is not None:
        facts.append(f"{100 * float(rec.reset_fraction):.2f}% of envs reset per env step")
    if rec.kind == "job" and rec.members:
        facts.append(f"a job of {_plural(len(rec.members), 'process', 'processes')}")
    if rec.wall_s:
        facts.append(f"{rec.wall_s:,.1f} s wall time")
    facts.append(f"mode {rec.mode}")
    sim = rec.sim or {}
    if sim.get("sim_s_per_step"):
        facts.append(f"{sim['sim_s_per_step']:g} s simulated per env step"
                     + (f" ({sim['substeps']} substeps)" if sim.get("substeps") else ""))
    stop = rec.interrupted or {}
    if stop:
        facts.append("interrupted" + (f" by {stop['signal']}" if stop.get("signal") else "")
                     + (f" after {stop['steps_done']} steps" if stop.get("steps_done") else ""))
    return facts


def build_report(run: RunRecord | Mapping[str, Any], *, source: str = "",
                 compare: Mapping[str, Any] | None = None) -> str:
    """The report of one run record (or its JSON) as an HTML string."""
    require("report", "resettrace's report")
    import plotly.offline

    rec = run if isinstance(run, RunRecord) else RunRecord.from_json(run, source)
    source = source or rec.source
    cat = rec.catalog()
    stats = rec.stats
    samples = rec.samples
    shown = _shown_keys(stats, cat)
    if not shown:
        raise RecordError(f"{source or 'run'}: no phase took time in this run record")
    idle = _idle(stats, shown)
    icicle = _icicle(stats, cat)
    first = icicle.data[0].ids if icicle.data else ()
    top = _top_keys(stats, samples, shown, first, cat)
    figures = {"icicle": icicle,
               "histograms": _histograms(stats, samples, top, len(shown), cat),
               "percentiles": _percentiles(stats, shown, idle, cat),
               "over-run": _over_run(samples, top, stats, cat),
               "cost-model": _cost_model(samples, rec.model or {}, cat)}
    if compare is not None:
        figures["compare-table"], figures["compare-deltas"] = _compare_figures(compare, cat)
    title = f"resettrace report: {rec.title}"
    divs = []
    for name, fig in figures.items():
        spec = json.loads(fig.to_json())
        divs.append(f'<section><div id="{name}" class="chart"></div><script>'
                    f'Plotly.newPlot("{name}", {_script_json(spec["data"])}, '
                    f'{_script_json(spec["layout"])}, {{"responsive": true}});</script>'
                    '</section>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:16px}section{margin-bottom:24px}"
            "</style>"
            f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
            f"<h1>{html.escape(title)}</h1>"
            f"<p class=\"facts\">{html.escape('; '.join(_facts(rec)))}</p>"
            + (f"<p>source: {html.escape(source)}</p>" if source else "")
            + "".join(divs) + "</body></html>\n")


def _run_of_folder(folder: Path) -> Any:
    """The one run of a folder of records: its job record (a ``resettrace run
    --stats-json`` folder: the job and its processes), else its only record."""
    from resettrace.record import RecordError, read_records

    records = read_records([folder], keep_jobs=True)
    jobs = [r for r in records if r.kind == "job"]
    if len(jobs) == 1:
        return jobs[0]
    if len(records) == 1:
        return records[0]
    raise RecordError(f"{folder}: {len(records)} runs in this folder and no one job of them: "
                      "name the run to report")


def write_report(run_path: str | Path, out: str | Path, *,
                 compare_base: str | Path | None = None) -> Path:
    """Write the report of the run at ``run_path`` (a run record, or the folder of its
    ``timing.json``); the path written (``out``, or a name beside it: see the module
    docstring)."""
    from resettrace.analysis.compare import Run, compare_runs, load_runs

    require("report", "resettrace's report")  # before anything is read or written
    path = Path(run_path)
    if path.is_dir() and not (path / "timing.json").is_file():
        rec = _run_of_folder(path)  # a resettrace run's folder: its job
        path = Path(rec.source)
    else:
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
