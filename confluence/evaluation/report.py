"""A report a person would rather look at than read: one self-contained HTML page (every image embedded as a
`data:` URI, no file beside it) with, per task, what it asks, how many rows were scored, the model beside the
trivial and GBDT baselines with a verdict, the plots people look at (predicted vs actual, calibration, confusion
matrix; when `evaluate(keep_rows=True)` kept the rows), every metric (headline first), and the training curves.

Plots are drawn with matplotlib's object API (`confluence.toolkit.figures`: no pyplot state) into PNG bytes in
memory.
"""

from __future__ import annotations

import base64
import csv
import html
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from confluence.evaluation.blend import choice_words
from confluence.evaluation.metrics import HEADLINE
from confluence.evaluation.metrics import oriented_gain as oriented_vs_gbdt  # the model's gain over LightGBM
from confluence.stypes import SemanticType
from confluence.targets import kind
from confluence.toolkit.figures import figure_png, new_figure

if TYPE_CHECKING:
    from confluence.evaluation.evaluate import EvalRows
    from confluence.store import Store

# entries of a task's results that are not a predictor's metrics (`--blend gbdt` adds "blend_vs_gbdt",
# "validation", "ship", "shipped" and "shipped_vs_gbdt"; `--importance`, `--certify` and `--explain` the last three)
_META_KEYS = ("info", "model_vs_gbdt", "rows", "blend_vs_gbdt", "validation", "ship", "shipped", "shipped_vs_gbdt",
              "importance", "certificate", "explanations")
_TRIVIAL = ("majority", "mean", "median", "median_offset")  # the constant predictors (baselines.run_baselines)
_NOT_PREDICTORS = ("model", "baseline", *_META_KEYS)
_MAX_CLASSES = 10  # confusion matrix: the most frequent true classes, the rest pooled as "other"
_SCORER_LABELS = {"gbdt": "GBDT"}
_SHIP_LABELS = {"model": "the model", "LightGBM": "LightGBM", "blend": "the blend", "trivial": "the trivial baseline"}
_METRIC_LABELS = {"auroc": "AUROC", "accuracy": "accuracy", "mae": "MAE", "mae_days": "MAE (days)"}


# ------------------------------------------------------------------------------------------------ formatting


def _fmt(v: Any) -> str:
    """A number to 4 significant digits, NaN / None (JSON's null) as an en dash."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def _num(v: Any) -> float:
    """A metric value as a float (NaN for None, strings, missing)."""
    return float(v) if isinstance(v, int | float | np.number) else math.nan


def png_data_uri(png: bytes) -> str:
    """PNG bytes as a `data:` URI, so the page needs no file beside it."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _img(png: bytes, alt: str) -> str:
    return f'<img src="{png_data_uri(png)}" alt="{html.escape(alt)}">'


# ---------------------------------------------------------------------------------------- task descriptions


def describe_task(store: Store, task: str) -> str:
    """What a task asks, from the store's metadata: e.g. "predict the numerical column dep_delay of a flights
    row: departure delay in minutes" (the column's or derived task's free-text description after the colon)."""
    info = store.task(task)
    col = store.columns[info.target_column_idx]
    stype = SemanticType(int(info.target_stype)).label
    free = col.text.split(": ", 1)[1].strip() if ": " in col.text else ""
    if info.is_derived:
        when = " at an observation time" if info.observation_time == "observation_time_column" else ""
        what = f"predict {col.name} ({stype}) of a {info.anchor_table} row{when}"
    else:
        what = f"predict the {stype} column {col.name} of a {info.anchor_table} row"
    return f"{what}: {free}" if free else what


def task_descriptions(store: Store) -> dict[str, str]:
    """`describe_task` for every task of a store."""
    return {t.name: describe_task(store, t.name) for t in store.tasks}


# ------------------------------------------------------------------------------------------------- verdicts


def _stype(task: str, r: Mapping[str, Any], stypes: Mapping[str, int] | None) -> SemanticType | None:
    """A task's target type: from `stypes` when given, else from the results' own `info.stype` (JSON results)."""
    if stypes and task in stypes:
        return SemanticType(int(stypes[task]))
    label = (r.get("info") or {}).get("stype")
    return SemanticType.parse(label) if label else None


def verdict(r: Mapping[str, Any], stype: SemanticType) -> list[tuple[str, str]]:
    """(text, css class) parts: does the model beat the best trivial baseline, and is it worse than the GBDT?
    With a blend (`--blend gbdt`), is the blend worse than the GBDT, and, where the floor shipped the trivial
    baseline instead, is that?

    Against the GBDT the paired bootstrap interval decides where present: "better" when the whole interval favours
    the model, "not worse" when it reaches zero (`a_not_worse`), "worse" otherwise; without an interval the point
    values are compared and the verdict says so."""
    metric, higher = HEADLINE[stype]
    model = _num((r.get("model") or {}).get(metric))
    parts: list[tuple[str, str]] = []
    trivial = _num((r.get("baseline") or {}).get(metric))
    if math.isfinite(model) and math.isfinite(trivial):
        better = model > trivial if higher else model < trivial
        parts.append(("beats trivial", "good") if better else ("not better than trivial", "bad"))
    if "gbdt" not in r:
        return parts
    g = _num((r.get("gbdt") or {}).get(metric))
    parts += _vs_gbdt(r.get("model_vs_gbdt"), higher, model, g, "")
    if "blend" in r:
        parts += _vs_gbdt(r.get("blend_vs_gbdt"), higher, _num((r.get("blend") or {}).get(metric)), g, "blend ")
    if r.get("ship") == "trivial" and "shipped" in r:
        parts += _vs_gbdt(r.get("shipped_vs_gbdt"), higher, _num(r["shipped"].get(metric)), g,
                          "shipped (trivial) ")
    return parts


def _vs_gbdt(c: Mapping[str, Any] | None, higher: bool, value: float, g: float, prefix: str) -> list[tuple[str, str]]:
    """`verdict`'s part for one scorer against the GBDT: `c` its paired comparison (`model_vs_gbdt`,
    `blend_vs_gbdt`), `value` and `g` its and the GBDT's headline metric (compared when there is no interval)."""
    o = oriented_vs_gbdt(c, higher)
    if o is not None and math.isfinite(o[1]):
        if o[1] > 0:
            return [(f"{prefix}better than GBDT", "good")]
        if _num((c or {}).get("a_not_worse")) == 1.0:
            return [(f"{prefix}not worse than GBDT", "good")]
        return [(f"{prefix}worse than GBDT", "bad")]
    if math.isfinite(value) and math.isfinite(g):
        ok = value >= g if higher else value <= g
        return [(f"{prefix}≥ GBDT (no interval)" if ok else f"{prefix}< GBDT (no interval)", "meh")]
    return []


def n_scored(r: Mapping[str, Any]) -> int | None:
    """Rows the headline metric was computed on (non-null targets), else rows evaluated."""
    info = r.get("info") or {}
    for v in (info.get("n_eval_non_null"), (r.get("model") or {}).get("n"), info.get("n_eval")):
        if isinstance(v, int | float | np.number) and math.isfinite(v):
            return int(v)
    return None


# ----------------------------------------------------------------------------------------------------- tables


def _gain_cell(r: Mapping[str, Any], higher: bool, key: str = "model_vs_gbdt") -> str:
    """`gain [low, high]` oriented so positive = model (or blend: `key` "blend_vs_gbdt") better; green when the
    whole interval is positive, red when it is wholly negative."""
    o = oriented_vs_gbdt(r.get(key), higher)
    if o is None:
        return "–"
    gain, lo, hi = o
    text = f"{gain:+.3g} [{lo:+.3g}, {hi:+.3g}]" if math.isfinite(lo) else f"{gain:+.3g}"
    cls = "good" if lo > 0 else "bad" if hi < 0 else ""
    return f'<span class="{cls}">{html.escape(text)}</span>' if cls else html.escape(text)


def metrics_table_html(results: Mapping[str, Mapping[str, Any]], stypes: Mapping[str, int] | None = None,
                       descriptions: Mapping[str, str] | None = None) -> str:
    """Per task: what it asks, n, the headline metric of the model, the best trivial baseline, the GBDT (and any
    other non-trivial scorer, e.g. a planted database's ceiling; the blend last), the oriented model-vs-GBDT gain
    (and the blend's), a verdict and, with a blend, what to ship (chosen on validation)."""
    others = sorted({k for r in results.values() for k in r if k not in _NOT_PREDICTORS and k not in _TRIVIAL},
                    key=lambda k: (k == "blend", k))
    paired = any("model_vs_gbdt" in r for r in results.values())
    blended = any("blend_vs_gbdt" in r for r in results.values())
    shipped = any("ship" in r for r in results.values())
    head = ["task", "n", "metric", "model", "best trivial", *(_SCORER_LABELS.get(o, o) for o in others)]
    head += ["model better by (+) vs GBDT, 95% CI"] if paired else []
    head += ["blend better by (+) vs GBDT, 95% CI"] if blended else []
    head += ["verdict"] + (["ship (chosen on validation)"] if shipped else [])
    out = ['<table class="headline"><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for task, r in results.items():
        desc = (descriptions or {}).get(task)
        task_cell = f"<b>{html.escape(task)}</b>" + (f'<div class="desc">{html.escape(desc)}</div>' if desc else "")
        stype = _stype(task, r, stypes)
        n = n_scored(r)
        if stype is None or ("model" not in r and "baseline" not in r):
            note = (r.get("info") or {}).get("note", "not evaluated")
            out.append(f'<tr><td>{task_cell}</td><td>{n or 0}</td><td colspan="{len(head) - 2}">'
                       f"{html.escape(str(note))}</td></tr>")
            continue
        metric, higher = HEADLINE[stype]
        vals = {"model": _num((r.get("model") or {}).get(metric)),
                "best trivial": _num((r.get("baseline") or {}).get(metric))}
        vals.update({o: _num((r.get(o) or {}).get(metric)) for o in others})
        finite = {k: v for k, v in vals.items() if math.isfinite(v)}
        best = (max if higher else min)(finite, key=finite.get) if finite else None
        trivial_name = (r.get("baseline") or {}).get("name")
        cells = [task_cell, f"{n:,}" if n is not None else "–",
                 f"{_METRIC_LABELS.get(metric, metric)} {'↑' if higher else '↓'}"]
        for k in ["model", "best trivial", *others]:
            text = _fmt(vals[k]) + (f' <span class="dim">({html.escape(trivial_name)})</span>'
                                    if k == "best trivial" and trivial_name else "")
            cells.append(f'<span class="best">{text}</span>' if k == best else text)
        if paired:
            cells.append(_gain_cell(r, higher))
        if blended:
            cells.append(_gain_cell(r, higher, "blend_vs_gbdt"))
        cells.append("<br>".join(f'<span class="{c}">{html.escape(t)}</span>' for t, c in verdict(r, stype)) or "–")
        if shipped:
            cells.append(_ship_cell(r))
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _ship_cell(r: Mapping[str, Any]) -> str:
    """What to ship for one task, with the blend's weight, the validation scores the choice rests on and the
    guard (`blend.choice_words`; the note when the guard shipped LightGBM)."""
    ship = r.get("ship")
    if not ship:
        return "–"
    v = r.get("validation") or {}
    scores = ", ".join(f"{k} {_fmt(v.get(k))}" for k in ("model", "LightGBM", "blend"))
    detail = (f"w = {_fmt(v.get('weight'))} (model share); validation {html.escape(str(v.get('metric', '')))} on "
              f"{_fmt(v.get('n_val'))} rows: {scores}{html.escape(choice_words(v, _fmt))}")
    note = f'<div class="dim">{html.escape(str(v["note"]))}</div>' if v.get("note") else ""
    label = _SHIP_LABELS.get(ship, ship) + (f" ({v['trivial_name']})" if ship == "trivial" else "")
    return (f"<b>{html.escape(label)}</b>"
            f'<div class="dim">{detail}</div>{note}')


def task_metrics_html(r: Mapping[str, Any], stype: SemanticType | None) -> str:
    """Every metric of every scorer of one task (rows: scorers; columns: metrics, the headline first, `n` last).
    The best trivial baseline is marked on its own row rather than repeated as `baseline`."""
    headline = HEADLINE[stype][0] if stype is not None else None
    scorers = {k: v for k, v in r.items() if isinstance(v, Mapping) and k not in _META_KEYS}
    trivial_name = (r.get("baseline") or {}).get("name")
    if trivial_name in scorers:
        scorers.pop("baseline", None)
    names = sorted({m for v in scorers.values() for m in v if m != "name"},
                   key=lambda m: (m != headline, m == "n", m))
    rows = ["<tr><th></th>" + "".join(f"<th>{html.escape(n)}</th>" for n in names) + "</tr>"]
    for who, v in scorers.items():
        label = html.escape(who) + (' <span class="dim">(best trivial)</span>' if who == trivial_name else "")
        cells = "".join(f"<td>{_fmt(v.get(n))}</td>" for n in names)
        rows.append(f"<tr><td>{label}</td>{cells}</tr>")
    return f'<table class="all">{"".join(rows)}</table>'


def all_metrics_html(results: Mapping[str, Mapping[str, Any]], stypes: Mapping[str, int] | None = None) -> str:
    """`task_metrics_html` of every task under its name."""
    return "\n".join(f"<h3>{html.escape(t)}</h3>{task_metrics_html(r, _stype(t, r, stypes))}"
                     for t, r in results.items())


# ------------------------------------------------------------------------------------------------------ plots


def _view(*arrays: np.ndarray) -> tuple[float, float]:
    """Axis limits holding the central 99% of the values (heavy tails would squash the rest into a corner)."""
    v = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = (float(x) for x in np.quantile(v, [0.005, 0.995]))
    pad = (hi - lo) * 0.05 or 1.0
    return lo - pad, hi + pad


def plot_predicted_vs_actual(truth: np.ndarray, preds: Mapping[str, np.ndarray], *, timestamps: bool = False,
                             unit: str = "") -> bytes:
    """Scatter of prediction against truth, one panel per scorer (model, GBDT), with the y = x line; timestamps
    as dates. The view holds the central 99% of the values; the title counts the points beyond it."""
    n = len(preds)
    fig, axes = new_figure(3.2 * n + 0.3, 3.3, 1, n, sharex=True, sharey=True)
    y = np.asarray(truth, np.float64)
    lo, hi = _view(y, *preds.values())
    for ax, (who, p) in zip(axes[0], preds.items(), strict=True):
        p = np.asarray(p, np.float64)
        outside = int(np.sum((y < lo) | (y > hi) | (p < lo) | (p > hi)))
        if timestamps:
            to_dt = lambda a: (np.asarray(a) / 1e6).astype("datetime64[s]")  # noqa: E731
            ax.scatter(to_dt(y), to_dt(p), s=5, alpha=0.35, lw=0, color="#1f5fa8")
            ax.plot(to_dt([lo, hi]), to_dt([lo, hi]), color="#b3261e", lw=1)
            ax.set_xlim(to_dt(lo), to_dt(hi))
            ax.set_ylim(to_dt(lo), to_dt(hi))
            ax.tick_params(axis="x", labelrotation=30)
        else:
            ax.scatter(y, p, s=5, alpha=0.35, lw=0, color="#1f5fa8")
            ax.plot([lo, hi], [lo, hi], color="#b3261e", lw=1, label="prediction = actual")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
        ax.set_title(f"{who}" + (f" ({outside} of {y.size} rows beyond the view)" if outside else ""), fontsize=8)
        ax.set_xlabel(f"actual{unit}")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel(f"predicted{unit}")
    return figure_png(fig)


def plot_calibration(truth: np.ndarray, probs: Mapping[str, np.ndarray], n_bins: int = 10) -> bytes:
    """Reliability curve (share of true targets against mean predicted P(true), in bins holding equal numbers of
    rows) per scorer, and the histogram of the model's predicted probabilities below."""
    from sklearn.calibration import calibration_curve

    y = np.asarray(truth).astype(bool)
    fig, axes = new_figure(5.0, 4.2, 2, 1, height_ratios=[3, 1], sharex=True)
    ax, hist = axes[0, 0], axes[1, 0]
    top = 0.0
    for (who, p), color in zip(probs.items(), ("#1f5fa8", "#e08a00", "#555555"), strict=False):
        p = np.clip(np.asarray(p, np.float64), 0.0, 1.0)
        if y.any() and not y.all():
            frac, mean_p = calibration_curve(y, p, n_bins=n_bins, strategy="quantile")
            ax.plot(mean_p, frac, "o-", ms=3, lw=1.2, color=color, label=who)
            top = max(top, float(frac.max()), float(mean_p.max()))
        if who == "model":
            hist.hist(p, bins=40, color=color, alpha=0.8)
    top = min(1.0, top * 1.1 + 0.02) if top else 1.0
    ax.plot([0, top], [0, top], color="#b3261e", lw=1, ls="--", label="perfectly calibrated")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_ylabel("share actually true")
    ax.set_title(f"calibration ({y.size} rows, {int(y.sum())} true)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    hist.set_xlabel("predicted P(true)")
    hist.set_ylabel("rows", fontsize=8)
    hist.grid(alpha=0.3)
    return figure_png(fig)


def _short(name: str, width: int = 20) -> str:
    """A class name cut to `width` characters (with an ellipsis), so long names stay distinct and legible."""
    return name if len(name) <= width else name[: width - 1] + "…"


def plot_confusion(truth: np.ndarray, probs: np.ndarray, categories: list[str] | None,
                   max_classes: int = _MAX_CLASSES) -> bytes:
    """Confusion matrix of the model's most likely class: rows actual, columns predicted, colour the share of the
    row, numbers the counts. With more than `max_classes` classes, the most frequent true classes are kept and
    the rest pooled as "other"."""
    y = np.asarray(truth, np.int64)
    pred = np.asarray(probs).argmax(axis=1)
    k = max(int(np.asarray(probs).shape[1]), int(y.max(initial=0)) + 1)
    names = list(categories or [])[:k] + [str(i) for i in range(len(categories or []), k)]
    counts = np.bincount(y, minlength=k)
    keep = [int(i) for i in np.argsort(-counts, kind="stable")[: min(k, max_classes)] if counts[i] > 0]
    pooled = len(keep) < k
    index = np.full(k, len(keep), np.int64)
    index[keep] = np.arange(len(keep))
    m = len(keep) + (1 if pooled else 0)
    cm = np.zeros((m, m), np.int64)
    np.add.at(cm, (index[y], index[pred]), 1)
    labels = [_short(names[i]) for i in keep] + (["other"] if pooled else [])
    share = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
    size = 1.9 + 0.36 * m
    fig, axes = new_figure(size + 0.6, size)
    ax = axes[0, 0]
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    for i in range(m):
        for j in range(m):
            if cm[i, j]:
                ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if share[i, j] > 0.6 else "black")
    ax.set_xticks(range(m), labels, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(m), labels, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("actual")
    title = f"confusion matrix ({y.size} rows" + (f"; top {len(keep)} of {k} classes" if pooled else "") + ")"
    ax.set_title(title, fontsize=9)
    return figure_png(fig)


def task_plot(stype: SemanticType, rows: EvalRows) -> tuple[bytes, str] | None:
    """The plot people look at for a target type, and its alt text: predicted vs actual (numbers, timestamps),
    calibration (booleans), confusion matrix (categories). None when there are no rows."""
    if rows is None or len(rows.truth) == 0:
        return None
    preds = {"model": rows.pred, **({"GBDT": rows.gbdt} if rows.gbdt is not None else {}),
             **({"blend": rows.blend} if getattr(rows, "blend", None) is not None else {})}
    draw, alt = _PLOTS[kind(stype).plot]
    return draw(rows, preds), alt


# each target kind's plot (`TargetKind.plot`): how to draw it from the evaluated rows, and its alt text
_PLOTS = {
    "predicted_vs_actual": (lambda rows, preds: plot_predicted_vs_actual(rows.truth, preds), "predicted vs actual"),
    "predicted_vs_actual_dates": (lambda rows, preds: plot_predicted_vs_actual(rows.truth, preds, timestamps=True),
                                  "predicted vs actual (dates)"),
    "calibration": (lambda rows, preds: plot_calibration(rows.truth, preds), "calibration curve"),
    "confusion": (lambda rows, preds: plot_confusion(rows.truth, rows.pred, rows.categories), "confusion matrix"),
}


def training_curves_png(csv_path: Path) -> bytes | None:
    """Every loss column of a training-log CSV against `step` (log scale), plus learning rates, gradient norm and
    throughput when logged; None when the log is missing or has nothing to plot."""
    if not csv_path.exists():
        return None
    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    if not rows or "step" not in rows[0]:
        return None
    if "tag" in rows[0] and "value" in rows[0]:  # long format (step, wall_time, tag, value): pivot by step
        wide: dict[str, dict[str, str]] = {}
        for r in rows:
            wide.setdefault(r["step"], {"step": r["step"]})[r["tag"]] = r["value"]
        rows = list(wide.values())
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in rows:
        try:
            step = float(r["step"])
        except (TypeError, ValueError):
            continue
        for k, v in r.items():
            if k == "step" or v in (None, ""):
                continue
            try:
                fv = float(v)
            except ValueError:
                continue
            if math.isfinite(fv):
                series.setdefault(k, ([], []))
                series[k][0].append(step)
                series[k][1].append(fv)
    train_keys = sorted(k for k in series if "loss" in k and not k.startswith("val"))
    val_keys = sorted(k for k in series if "loss" in k and k.startswith("val"))
    other = sorted(k for k in series if "loss" not in k and k.split("/")[-1] in
                   ("lr_muon", "lr_adamw", "muon", "adamw", "grad_norm", "cells_per_s"))
    panels = [("losses", train_keys), ("validation losses", val_keys)] + [(k, [k]) for k in other]
    panels = [p for p in panels if p[1]]
    if not panels:
        return None
    cols = 2 if len(panels) > 1 else 1
    nrows = -(-len(panels) // cols)
    fig, axes = new_figure(6.4 * cols, 3.4 * nrows, nrows, cols)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    for ax, (title, keys) in zip(axes.ravel(), panels, strict=False):
        for k in keys:
            ax.plot(series[k][0], series[k][1], label=_curve_label(k), lw=1.2,
                    marker="o" if len(series[k][0]) < 12 else None, ms=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if "losses" in title:
            ax.set_yscale("log")
            ax.legend(fontsize=6.5, ncol=2)
        ax.grid(alpha=0.3)
    return figure_png(fig)


def _curve_label(key: str) -> str:
    """A log column's legend label without the repeated prefixes (`val/<store>/<task>/loss` -> `<task>`)."""
    parts = key.split("/")
    if parts[0] == "val" and len(parts) >= 3:
        return "/".join(parts[2:]).removesuffix("/loss")
    return key.removeprefix("train/")


# ------------------------------------------------------------------------------------------------------- page

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em 2em;max-width:1240px;color:#1b1b1b}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
h3{font-size:1em;margin:.2em 0} p.help{color:#444;font-size:.9em;max-width:1100px}
ul.notes{color:#444;font-size:.9em;padding-left:1.2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}
td,th{border:1px solid #d4d4d4;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
table.headline td:first-child{max-width:330px} .desc{font-size:.85em;color:#555;font-weight:normal}
table.headline td{white-space:nowrap} table.headline td:first-child{white-space:normal}
table.headline td:last-child{text-align:left}
.best{font-weight:bold;color:#0a7d28} .good{color:#0a7d28;font-weight:600} .bad{color:#b3261e;font-weight:600}
.meh{color:#8a6d00} .dim{color:#777;font-weight:normal;font-size:.9em}
.tasks{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
.task{border:1px solid #ddd;border-radius:6px;padding:10px 12px}
.why{font-size:.85em;margin-top:.5em} .why pre{font-size:.95em;overflow-x:auto;margin:.3em 0}
.task img{max-width:100%;display:block;margin:4px 0} table.all{font-size:.8em}
"""

_HELP = """Each task is scored on the n rows of the split whose target is known. <b>best trivial</b>: the better of
the constant predictors fitted on the train split (majority class; mean or median). <b>GBDT</b>: LightGBM on
relational features built from the same database. Bold green: the best value of the row. ↑ higher is better,
↓ lower is better. <b>model better by</b>: the model's advantage over the GBDT on the same rows, turned so that
<b>positive always means the model is better</b> (the GBDT's error minus the model's for MAE; the model's score minus
the GBDT's for AUROC and accuracy), with a paired bootstrap 95% interval. <b>Verdict</b>: “beats trivial” when the
model's headline metric is better than the best trivial baseline's; against the GBDT “better” when the whole
interval is positive, “not worse” when it reaches zero (the rows cannot tell the model worse), “worse” when it is
wholly negative."""

_BLEND_HELP = """ <b>blend</b>: w × model + (1 − w) × GBDT, one weight w (the model's share, 0 to 1 by 0.05) per task
chosen on the validation split, where LightGBM was not trained; its gain over the GBDT is shown as the model's.
<b>ship</b>: what the validation split says to use: the blend when it beat both there, else the better of the
model and LightGBM (decided on validation only, never on the rows scored here), and LightGBM unless a paired 95%
interval on validation shows the departure from it better (the guard: a gain inside the noise is not shipped);
and the trivial baseline where what would be shipped is not shown better than it on validation (the floor)."""


def _task_section(task: str, r: Mapping[str, Any], stype: SemanticType | None, desc: str | None) -> str:
    """One task's card: what it asks, n, its plot (when rows were kept) and every metric."""
    info = r.get("info") or {}
    n = n_scored(r)
    facts = [f"{n:,} rows scored" if n is not None else None,
             f"{int(info['n_train']):,} train seeds" if isinstance(info.get("n_train"), int) else None,
             f"checkpoint step {info['checkpoint_step']}" if info.get("checkpoint_step") is not None else None]
    head = f"<h3>{html.escape(task)}</h3>" + (f'<div class="desc">{html.escape(desc)}</div>' if desc else "")
    head += f'<div class="dim">{" · ".join(f for f in facts if f)}</div>'
    plot = task_plot(stype, r["rows"]) if stype is not None and r.get("rows") is not None else None
    img = _img(plot[0], f"{task}: {plot[1]}") if plot else ""
    return f'<div class="task">{head}{img}{task_metrics_html(r, stype)}{importance_html(r.get("importance"))}{certificate_html(r.get("certificate"))}{explanations_html(r.get("explanations"))}</div>'


def importance_html(imp: Mapping[str, Any] | None) -> str:
    """A task's column importance (`evaluate --importance`): per column the model's loss of its headline metric
    when the column is shuffled, beside LightGBM's gain share; empty without one."""
    if not imp or "model" not in imp:
        return ""
    m = imp["model"]
    gbdt = imp.get("gbdt_gain_share") or {}
    cols = list(m["columns"]) + [c for c in gbdt if c not in m["columns"]]
    head = (f"<tr><th>column</th><th>model: {html.escape(m['metric'])} lost when shuffled</th>"
            + ("<th>LightGBM: gain share</th>" if gbdt else "") + "</tr>")
    rows = "".join(f"<tr><td>{html.escape(c)}</td><td>{_fmt(m['columns'].get(c, math.nan))}</td>"
                   + (f"<td>{_fmt(gbdt.get(c, 0.0))}</td>" if gbdt else "") + "</tr>" for c in cols)
    return (f'<div class="imp"><b>what it relies on</b> ({int(m.get("seeds", 0)):,} validation seeds; '
            f"{html.escape(m['metric'])} {_fmt(m['base'])} unshuffled)<table>{head}{rows}</table></div>")


def explanations_html(explanations: list[Mapping[str, Any]] | None) -> str:
    """Example predictions of a task explained (`evaluate --explain`): per prediction its truth and the context rows
    (and cells) that moved it most, as `predict --explain` prints them, folded; empty without any."""
    if not explanations:
        return ""
    from confluence.inference.explain import Explanation

    items = []
    for d in explanations:
        e = Explanation.from_dict({k: v for k, v in d.items() if k != "truth"})
        items.append(f"<details><summary>{html.escape(e.anchor)}: {html.escape(e.quantity)} "
                     f"{_fmt(e.prediction)}, truth {html.escape(str(d.get('truth')))}</summary>"
                     f"<pre>{html.escape(e.text())}</pre></details>")
    return (f'<div class="why"><b>why these predictions</b> ({len(items)} evaluated rows; effect = the prediction '
            f"minus the prediction with the row's values replaced){''.join(items)}</div>")


def certificate_html(cert: Mapping[str, Any] | None) -> str:
    """A task's leakage certificate (`evaluate --certify`): the verdict, what was compared, the leaks and warnings,
    and the certificate's digest; empty without one."""
    if not cert:
        return ""
    verdict = ("no leak" if cert.get("passed") else f"<b>{int(cert.get('n_leaks', 0))} leaking cell(s)</b>")
    lines = [f"<b>leakage certificate</b>: {int(cert.get('seeds', 0)):,} contexts rebuilt with every later cell and "
             f"unknown label randomized: {verdict}" + (f" ({html.escape(cert['note'])})" if cert.get("note") else "")]
    lines += [html.escape(f"leak: {x['table']} {x['row']} column {x['column']!r} ({x['what']}), anchor "
                          f"{x['anchor']}") for x in cert.get("leaks", [])]
    lines += [html.escape(f"warning: {w}") for w in cert.get("warnings", [])]
    lines.append(f'<span class="dim">digest {html.escape(str(cert.get("digest", "")))}</span>')
    return '<div class="cert">' + "<br>".join(lines) + "</div>"


def render_report(
    results: Mapping[str, Mapping[str, Any]],
    stypes: Mapping[str, int] | None = None,
    *,
    descriptions: Mapping[str, str] | None = None,
    train_log: Path | None = None,
    title: str = "Confluence report",
    notes: Mapping[str, str] | None = None,
) -> str:
    """The report page as one HTML string with every image embedded (see `write_report`)."""
    curves = training_curves_png(train_log) if train_log else None
    note_html = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in (notes or {}).items())
    help_html = _HELP + (_BLEND_HELP if any("blend" in r for r in results.values()) else "")
    cards = "\n".join(_task_section(t, r, _stype(t, r, stypes), (descriptions or {}).get(t))
                      for t, r in results.items())
    curves_html = f"<h2>Training curves</h2>{_img(curves, 'training curves')}" if curves else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><meta name="generator" content="confluence"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(title)}</h1><ul class="notes">{note_html}</ul>
<h2>Headline metric per task</h2><p class="help">{help_html}</p>
{metrics_table_html(results, stypes, descriptions)}
<h2>Per task: plots and all metrics (headline first)</h2>
<p class="help">Numbers and timestamps: predicted against actual value per row (on the red line the prediction is
exact). Booleans: calibration — of the rows given about p, a share p should be true. Categories: confusion
matrix of the most likely class.</p>
<div class="tasks">{cards}</div>
{curves_html}
</body></html>"""


def write_report(
    out_dir: Path,
    results: Mapping[str, Mapping[str, Any]],
    stypes: Mapping[str, int] | None = None,
    *,
    descriptions: Mapping[str, str] | None = None,
    train_log: Path | None = None,
    title: str = "Confluence report",
    notes: Mapping[str, str] | None = None,
) -> Path:
    """Write the self-contained `report.html` into `out_dir` and return its path.

    `results` is `evaluate`'s dict (or `confluence evaluate --json` loaded back: target types then come from each
    task's `info.stype` when `stypes` is None); its `rows` entries (`evaluate(keep_rows=True)`) add the plots.
    `descriptions` (`task_descriptions(store)`) say what each task asks; `train_log` is a run's `scalars.csv`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    page = render_report(results, stypes, descriptions=descriptions, train_log=train_log, title=title, notes=notes)
    path = out_dir / "report.html"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path
