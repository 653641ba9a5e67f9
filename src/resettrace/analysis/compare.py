"""``resettrace compare BASE NEW``: two sets of collector runs side by side, per timing key,
with a verdict per key that tells a real change from machine noise.

A run is a run record (:mod:`resettrace.record`: ``resettrace bench collector``'s
``timing.json``, a ``resettrace run`` job or process record, ...); a folder stands for every
run record under it (several runs of one configuration; a job record beside its processes'
is left out: :func:`resettrace.record.read_records`). Keys are ordered, and
registered phases known, by the records' own phase catalogs.

The statistics, per key:

* **Units.** Per-call samples of one run are not independent (the machine drifts during a
  run, and calls in a row share caches), so each run's samples of a key are cut into
  ``blocks`` consecutive blocks (10 by default, fewer when a run has few samples) and each
  block's median is one unit. The units of every run of a side are pooled.
* **Effect.** ``delta_pct`` = 100 × (mean of NEW's units / mean of BASE's units − 1), with a
  99% bootstrap confidence interval (``scipy.stats.bootstrap``, percentile method, units
  resampled within each side; 99% because some thirty keys are judged at once).
* **Noise floor.** The larger of ``noise_pct`` (3% by default: the run-to-run spread of
  physics on a quiet machine) and how far the reference key (``physics_ms``, the engine's
  step, which a change to the reset path leaves alone) moved between the two sides (the far
  end of its interval): a machine that ran slower or faster for one side shifts every key
  alike, and that shift is not the change's. A run without the reference key (a Gymnasium
  run has no ``physics_ms``) leaves the fixed floor, said in one line (``notes``).
* **Verdict.** ``slower`` when the whole interval lies above ``+floor``, ``faster`` when it
  lies below ``−floor``, else ``within noise``. A key that only one side has is ``new`` or
  ``gone``; one that took no time on BASE and some on NEW is ``slower``.

The floor is what makes an A/A comparison (two runs of one configuration) come out
"within noise": the interval of one pair of runs does not hold the run-to-run drift, the floor
does. ``resettrace bench compare-aa RUN`` measures the false-positive rate on A/A pairs cut
from one long run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from resettrace import catalog as C
from resettrace.costmodel import FitSums
from resettrace.record import CONFIG_FIELDS as _CONFIG_FIELDS
from resettrace.record import RecordError, RunRecord, per_parent, read_records
from resettrace.tables import format_table

__all__ = ["Run", "load_runs", "compare_runs", "render_compare", "KeyVerdict",
           "CONFIG_FIELDS", "split_run", "aa_false_positive_rate"]

CONFIG_FIELDS = _CONFIG_FIELDS

#: reset fractions further apart than this (relative) make runs not comparable
RESET_FRACTION_TOLERANCE = 0.2


@dataclass(frozen=True)
class Run:
    """One run: its configuration, env/s, reset fraction, per-key samples, cost model
    sums and phase catalog (the record's own: registered phases included)."""

    source: str
    config: dict[str, Any]
    env_per_s: float
    reset_fraction: float
    samples: dict[str, list[float]]
    #: per key, the sums of its cost model a + b*k (the record's ``model``; empty for
    #: runs written before it existed)
    model: dict[str, FitSums] = field(default_factory=dict)
    catalog: Any = None
    #: per key, its calls in the run (the record's statistics; a key without them: its
    #: samples, every call while they were not thinned)
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, rec: RunRecord) -> Run:
        if not rec.samples:
            raise RecordError(f"{rec.source or 'run'}: no per-key samples to compare")
        counts = {}
        for k, s in (rec.stats or {}).items():
            n = s.get("count") if isinstance(s, Mapping) else None
            if isinstance(n, (int, float)) and not isinstance(n, bool) \
                    and math.isfinite(n) and n >= 0:
                counts[k] = int(n)
        return cls(source=rec.source, config=dict(rec.config or {}, mode=rec.mode),
                   env_per_s=float(rec.env_per_s or 0.0),
                   reset_fraction=float(rec.reset_fraction or 0.0),
                   samples={k: [float(x) for x in v] for k, v in rec.samples.items()},
                   model=_model_sums(rec.model), catalog=rec.catalog(), counts=counts)

    def calls(self, key: str) -> int:
        """The key's calls in the run (0: none)."""
        n = self.counts.get(key)
        return len(self.samples.get(key, ())) if n is None else n


def _per_parent(runs: Sequence[Run], cat: Any, key: str) -> float | None:
    """:func:`~resettrace.record.per_parent` over ``runs``: a key's calls per call of its
    parent phase (a phase called several times under one parent, the physics substeps of a
    step, has a sample per call, so a per-call delta is a per-parent one only while this
    stays the same)."""
    keys = [k for k in (key, cat.parent_key(key)) if k is not None]
    calls = {k: sum(r.calls(k) for r in runs) for k in keys}
    if not calls[key]:
        return None  # (a key this side never ran: no figure, not 0)
    return per_parent({k: {"count": n} for k, n in calls.items()}, cat, key)


def _model_sums(model: Mapping[str, Any] | None) -> dict[str, FitSums]:
    keys = (model or {}).get("keys") or {}
    try:
        return {k: FitSums.from_dict(v["sums"]) for k, v in keys.items()}
    except (KeyError, TypeError, ValueError):
        return {}


def load_runs(path: str | Path) -> list[Run]:
    """The runs at ``path``: a run record file (collector ``timing.json``, a ``resettrace
    run`` job or process record, ...), or every run record under a folder."""
    return [Run.of(r) for r in read_records([path])]


def _catalog(runs: Sequence[Run]) -> Any:
    return C.Catalog.union([r.catalog for r in runs if r.catalog is not None] or [C.CATALOG])


def _units(samples: Sequence[float], blocks: int) -> np.ndarray:
    """Medians of ``blocks`` consecutive blocks (at least 5 samples each)."""
    x = np.asarray(samples, dtype=np.float64)
    b = max(1, min(blocks, len(x) // 5))
    return np.array([np.median(part) for part in np.array_split(x, b)]) if len(x) else x


@dataclass(frozen=True)
class KeyVerdict:
    key: str
    base_p50: float
    new_p50: float
    base_mean: float
    new_mean: float
    delta_ms: float
    delta_pct: float
    ci_low_pct: float
    ci_high_pct: float
    verdict: str


def _interval(base: np.ndarray, new: np.ndarray, confidence: float, resamples: int,
              seed: int) -> tuple[float, float, float]:
    from resettrace.extras import need

    stats = need("scipy.stats", "report", "resettrace compare")

    def ratio(b: np.ndarray, n: np.ndarray, axis: int = -1) -> np.ndarray:
        return 100.0 * (np.mean(n, axis=axis) / np.mean(b, axis=axis) - 1.0)

    point = float(ratio(base, new))
    if len(base) < 2 or len(new) < 2 or np.ptp(np.concatenate([base, new])) == 0:
        return point, point, point
    res = stats.bootstrap((base, new), ratio, vectorized=True, paired=False,
                          confidence_level=confidence, n_resamples=resamples,
                          method="percentile", random_state=np.random.default_rng(seed))
    low, high = res.confidence_interval
    return point, float(low), float(high)


def compare_key(key: str, base: Sequence[Sequence[float]], new: Sequence[Sequence[float]], *,
                blocks: int = 10, noise_pct: float = 3.0, confidence: float = 0.99,
                resamples: int = 2000, seed: int = 0) -> KeyVerdict:
    """The verdict on one key; ``base`` and ``new`` hold each run's samples of it."""
    b_all = np.concatenate([np.asarray(s, float) for s in base]) if base else np.array([])
    n_all = np.concatenate([np.asarray(s, float) for s in new]) if new else np.array([])
    nan = float("nan")
    if not len(b_all) or not len(n_all):
        def stat(f: Any, a: np.ndarray) -> float:
            return float(f(a)) if len(a) else nan

        return KeyVerdict(key, stat(np.median, b_all), stat(np.median, n_all),
                          stat(np.mean, b_all), stat(np.mean, n_all), nan, nan, nan, nan,
                          "new" if len(n_all) else "gone")
    b_units = np.concatenate([_units(s, blocks) for s in base])
    n_units = np.concatenate([_units(s, blocks) for s in new])
    b50, n50 = float(np.median(b_all)), float(np.median(n_all))
    if np.mean(b_units) <= 0:  # a phase that took no time before (randomization off, say)
        verdict = "slower" if np.mean(n_units) > 0 else "within noise"
        return KeyVerdict(key, b50, n50, float(np.mean(b_all)), float(np.mean(n_all)),
                          n50 - b50, math.inf if verdict == "slower" else 0.0,
                          math.inf if verdict == "slower" else 0.0,
                          math.inf if verdict == "slower" else 0.0, verdict)
    point, low, high = _interval(b_units, n_units, confidence, resamples, seed)
    verdict = "slower" if low > noise_pct else "faster" if high < -noise_pct else \
        "within noise"
    return KeyVerdict(key, b50, n50, float(np.mean(b_all)), float(np.mean(n_all)), n50 - b50,
                      point, low, high, verdict)


def config_differences(base: Sequence[Run], new: Sequence[Run]) -> list[str]:
    """What makes the two sides not comparable (first: stated before any figure)."""
    out = []
    for name in CONFIG_FIELDS:
        b = {json.dumps(r.config.get(name)) for r in base}
        n = {json.dumps(r.config.get(name)) for r in new}
        if b != n:
            out.append(f"{name}: {', '.join(sorted(b))} -> {', '.join(sorted(n))}")
    rb = float(np.mean([r.reset_fraction for r in base]))
    rn = float(np.mean([r.reset_fraction for r in new]))
    if max(rb, rn) > 0 and abs(rb - rn) > RESET_FRACTION_TOLERANCE * max(rb, rn):
        out.append(f"reset ratio: {100 * rb:.2f}% -> {100 * rn:.2f}% of envs per step")
    return out


def _share(stats: Mapping[str, float], key: str, of: float) -> float | None:
    return 100.0 * stats.get(key, 0.0) / of if of > 0 else None


def _shares(runs: Sequence[Run]) -> dict[str, float | None]:
    """reset_done's share of the env step and of the non-physics overhead (total times:
    reset_done runs only on steps with resets); None (not known) without env steps, and
    the overhead's without a physics step."""
    total = {k: float(sum(sum(r.samples.get(k, [])) for r in runs))
             for k in (C.ENV_STEP.key, C.PHYSICS.key, C.RESET_DONE.key)}
    step = total[C.ENV_STEP.key]
    physics = all(C.PHYSICS.key in r.samples for r in runs)
    overhead = step - total[C.PHYSICS.key] if physics else 0.0
    return {"reset_done_of_env_step_pct": _share(total, C.RESET_DONE.key, step),
            "reset_done_of_overhead_pct": _share(total, C.RESET_DONE.key, overhead)}


def _reference_note(reference: str, noise_pct: float, base: Sequence[Run],
                    new: Sequence[Run], shift: float | None) -> str | None:
    """The line that says the reference key could not set the noise floor, and why."""
    fixed = f"the noise floor is the fixed {noise_pct:g}% (the machine's drift between the " \
        "sides is not measured)"
    runs = [*base, *new]
    lacking = [r.source or "a run" for r in runs if reference not in r.samples]
    if len(lacking) == len(runs):
        return f"reference key {reference} is in neither side's runs: {fixed}"
    if lacking:
        more = f" and {len(lacking) - 3} more" if len(lacking) > 3 else ""
        return f"reference key {reference} is not in {', '.join(lacking[:3])}{more}: {fixed}"
    if shift is None:
        return f"reference key {reference} took no time to compare: {fixed}"
    return None


def compare_runs(base: Sequence[Run], new: Sequence[Run], *, blocks: int = 10,
                 noise_pct: float = 3.0, confidence: float = 0.99, resamples: int = 2000,
                 seed: int = 0, reference: str | None = C.PHYSICS.key) -> dict[str, Any]:
    """The comparison as a JSON-able dict (``render_compare`` prints it).

    ``reference``: a key the compared change does not touch (the engine's physics step):
    the noise floor is the larger of ``noise_pct`` and the reference's own shift (the far
    end of its interval), so that a machine that ran faster or slower for one side moves
    no verdict. ``None``: the fixed floor only."""
    cat = _catalog([*base, *new])
    keys = [k for k in cat.all_keys()
            if k.endswith("_ms") and any(k in r.samples for r in (*base, *new))]
    keys += sorted({k for r in (*base, *new) for k in r.samples if k.endswith("_ms")}
                   - set(keys))  # times only (reset counts say the workload: see above)
    def verdict(k: str, floor: float) -> KeyVerdict:
        return compare_key(k, [r.samples[k] for r in base if k in r.samples],
                           [r.samples[k] for r in new if k in r.samples], blocks=blocks,
                           noise_pct=floor, confidence=confidence, resamples=resamples,
                           seed=seed)

    # the machine's own drift between the two sides, seen on a key the change leaves alone
    floor, machine = noise_pct, None
    if reference and reference in keys:
        ref = verdict(reference, noise_pct)
        if math.isfinite(ref.ci_low_pct) and math.isfinite(ref.ci_high_pct):
            machine = max(abs(ref.ci_low_pct), abs(ref.ci_high_pct))
            floor = max(noise_pct, machine)
    notes = []
    if reference:  # never dropped without a word (a Gymnasium run has no physics_ms)
        note = _reference_note(reference, noise_pct, base, new, machine)
        if note:
            notes.append(note)
    verdicts = [verdict(k, floor) for k in keys]
    per = {k: (_per_parent(base, cat, k), _per_parent(new, cat, k)) for k in keys}
    # a phase called again and again under its parent (substeps, a manager's resets) whose
    # number of calls changed (a phase that runs in some parent calls only, reset_done in
    # a step, has a share that moves from run to run: the table shows both sides)
    moved = [k for k, (b, n) in per.items() if b is not None and n is not None
             and max(b, n) >= 1.0 and abs(n - b) > 0.005 * max(b, n)]
    if moved:
        notes.append("calls per parent call differ for " + ", ".join(
            f"{k} ({per[k][0]:.3f} -> {per[k][1]:.3f})" for k in moved) + ": their deltas "
            "are per call, not per call of the parent")
    shares = {"base": _shares(base), "new": _shares(new)}
    stepless = [side for side in ("base", "new")
                if shares[side]["reset_done_of_env_step_pct"] is None]
    if stepless:
        notes.append("reset % not known for " + " and ".join(stepless) + ": runs without "
                     "env steps (no env_step recorded) have no reset share")
    return {
        "base": [r.source for r in base], "new": [r.source for r in new],
        "not_comparable": config_differences(base, new),
        "notes": notes,
        "settings": {"blocks": blocks, "noise_pct": noise_pct, "confidence": confidence,
                     "resamples": resamples, "reference": reference,
                     "reference_shift_pct": machine, "noise_floor_pct": floor},
        "env_per_s": {"base": float(np.mean([r.env_per_s for r in base])),
                      "new": float(np.mean([r.env_per_s for r in new]))},
        "shares": shares,
        # JSON has no inf or nan: a delta with no base (a phase that appears) is null
        "keys": [{k: None if isinstance(x, float) and not math.isfinite(x) else x
                  for k, x in asdict(v).items()}
                 | {"base_per_parent": per[v.key][0], "new_per_parent": per[v.key][1]}
                 for v in verdicts],
        "model": compare_models(base, new, cat),
    }


def _side_fit(runs: Sequence[Run], key: str) -> dict[str, Any] | None:
    sums = FitSums()
    for r in runs:
        if key in r.model:
            sums.merge(r.model[key])
    return sums.fit().as_dict() if sums.n else None


def compare_models(base: Sequence[Run], new: Sequence[Run], catalog: Any = None
                   ) -> list[dict[str, Any]]:
    """Per key that took time, the cost model ``a + b * k`` of each side (its runs' sums
    merged): where a change moved fixed cost (a) or per-row cost (b)."""
    cat = _catalog([*base, *new]) if catalog is None else catalog
    keys = [k for k in cat.all_keys() if any(k in r.model for r in (*base, *new))]
    out = []
    for k in keys:
        b, n = _side_fit(base, k), _side_fit(new, k)
        if all(f is None or not f["mean_ms"] for f in (b, n)):
            continue  # a phase this backend does not have
        out.append({"key": k, "base": b, "new": n})
    return out


def regressions(result: Mapping[str, Any], pct: float) -> list[dict[str, Any]]:
    """Keys slower beyond noise by more than ``pct`` percent."""
    return [k for k in result["keys"] if k["verdict"] == "slower"
            and (k["delta_pct"] is None or k["delta_pct"] > pct)]  # None: it took no time


def render_compare(result: Mapping[str, Any]) -> str:
    parts: list[str] = []
    if result["not_comparable"]:
        parts.append("NOT COMPARABLE: the runs differ in\n"
                     + "\n".join(f"  {d}" for d in result["not_comparable"]))
    e = result["env_per_s"]
    if e["base"] and e["new"]:
        delta = 100 * (e["new"] / e["base"] - 1)
        parts.append(f"env/s: {e['base']:,.0f} -> {e['new']:,.0f} ({delta:+.1f}%)")
    else:  # a run whose recorders never said their env count: no throughput, not 0 env/s
        parts.append("env/s: not known (" + " and ".join(
            side for side in ("base", "new") if not e[side]) + ": the run's env count was "
            "not given; give it with env_count in the spec or the recorder)")
    parts.extend(result.get("notes") or ())
    sb, sn = result["shares"]["base"], result["shares"]["new"]

    def pct(x: Any) -> str:  # JSON's null (nan before) is "not known", never "nan%"
        return "not known" if x is None or not math.isfinite(x) else f"{x:.1f}%"

    step, over = "reset_done_of_env_step_pct", "reset_done_of_overhead_pct"
    if any(s[step] is not None and math.isfinite(s[step]) for s in (sb, sn)):
        line = f"reset_done share of the env step: {pct(sb[step])} -> {pct(sn[step])}"
        if any(s[over] is not None and math.isfinite(s[over]) for s in (sb, sn)):
            line += f"; of the non-physics overhead: {pct(sb[over])} -> {pct(sn[over])}"
        parts.append(line)
    s = result["settings"]
    def num(x: Any) -> float:
        return float("nan") if x is None else float(x)

    def per(k: Mapping[str, Any]) -> str:  # calls per parent call, each side's when apart
        b, n = k.get("base_per_parent"), k.get("new_per_parent")
        if b is None and n is None:
            return "-"
        shown = ["-" if x is None else f"{x:.3f}" for x in (b, n)]
        return shown[0] if shown[0] == shown[1] else f"{shown[0]} -> {shown[1]}"

    idle = [k for k in result["keys"] if not k["base_mean"] and not k["new_mean"]]
    rows = [[k["key"], per(k), num(k["base_p50"]), num(k["new_p50"]), num(k["base_mean"]),
             num(k["new_mean"]), num(k["delta_ms"]), num(k["delta_pct"]),
             "-" if k["ci_low_pct"] is None or k["ci_high_pct"] is None
             else f"[{k['ci_low_pct']:+.1f}, {k['ci_high_pct']:+.1f}]", k["verdict"]]
            for k in result["keys"] if k not in idle]
    parts.append(format_table(
        f"per key (ms; delta = NEW/BASE - 1 of block medians, {100 * s['confidence']:.0f}% "
        f"bootstrap interval; slower/faster only beyond the +-{s['noise_floor_pct']:.1f}% "
        "noise floor" + (f": {s['reference']} moved up to {s['reference_shift_pct']:.1f}%"
                         if s.get("reference_shift_pct") is not None
                         and s["noise_floor_pct"] > s["noise_pct"] else "") + ")",
        ["key", "per parent", "base p50", "new p50", "base mean", "new mean", "delta ms",
         "delta %", "interval %", "verdict"], rows)
        + (f"\n({len(idle)} keys that took no time on either side not shown)" if idle
           else ""))
    if result.get("model"):
        parts.append(render_model_rows(result["model"]))
    return "\n\n".join(parts)


def _ab(f: Mapping[str, Any] | None) -> tuple[str, str]:
    """``a`` in ms and ``b`` in us per env, each with its 95% half-width."""
    if f is None:
        return "-", "-"
    a = f"{f['a_ms']:.4f}" + (f" +-{f['a_ci'][1] - f['a_ms']:.4f}" if f["a_ci"] else "")
    if f["b_ms"] is None:
        return a, "k constant"
    b = f"{1e3 * f['b_ms']:.2f} +-{1e3 * (f['b_ci'][1] - f['b_ms']):.2f}"
    return a, b + (" (fixed)" if f["fixed"] else "")


def render_model_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    table = []
    for row in rows:
        (ba, bb), (na, nb) = _ab(row["base"]), _ab(row["new"])
        table.append([row["key"], ba, na, bb, nb])
    return format_table(
        "cost model per call: ms = a + b*k (k = envs reset; a in ms, b in us per env, 95% "
        "intervals; fixed: the per-env part is not significant or under 5% of the cost)",
        ["key", "base a", "new a", "base b", "new b"], table)


def split_run(run: Run, parts: int) -> list[Run]:
    """``run`` cut into ``parts`` consecutive runs (for A/A pairs from one long run)."""
    pieces = {k: np.array_split(np.asarray(v, dtype=np.float64), parts)
              for k, v in run.samples.items()}
    return [Run(source=f"{run.source}#{i + 1}/{parts}", config=run.config,
                env_per_s=run.env_per_s, reset_fraction=run.reset_fraction,
                samples={k: p[i].tolist() for k, p in pieces.items()}, catalog=run.catalog)
            for i in range(parts)]  # (calls: each piece's samples)


def aa_false_positive_rate(run: Run, pairs: int = 10, **options: Any) -> dict[str, Any]:
    """Cut ``run`` into ``2 * pairs`` consecutive pieces, compare piece 2i with 2i+1: the
    share of key verdicts that are not "within noise" is the false-positive rate."""
    pieces = split_run(run, 2 * pairs)
    flagged = total = 0
    per_key: dict[str, int] = {}
    for i in range(pairs):
        result = compare_runs([pieces[2 * i]], [pieces[2 * i + 1]], **options)
        for k in result["keys"]:
            if k["verdict"] in ("new", "gone"):
                continue
            total += 1
            if k["verdict"] != "within noise":
                flagged += 1
                per_key[k["key"]] = per_key.get(k["key"], 0) + 1
    return {"pairs": pairs, "verdicts": total, "false_positives": flagged,
            "rate": flagged / total if total else float("nan"), "flagged_keys": per_key}
