"""A report a person would rather look at than read: one self-contained HTML page with the per-task metrics
table (model beside the trivial and GBDT baselines, the winner highlighted) and the training curves as PNG."""

from __future__ import annotations

import csv
import html
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluence.evaluation.metrics import HEADLINE
from confluence.stypes import SemanticType

_HEADLINE_BY_METRIC = {m: hib for m, hib in HEADLINE.values()}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.4g}"
    return html.escape(str(v))


def plot_training_curves(csv_path: Path, png_path: Path) -> Path | None:
    """Plot every numeric column of a training-log CSV against `step` (loss columns on a log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), squeeze=False)
    for ax, (title, keys) in zip(axes[:, 0], panels, strict=True):
        for k in keys:
            ax.plot(series[k][0], series[k][1], label=k, lw=1.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        if "losses" in title:
            ax.set_yscale("log")
            ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=90)
    plt.close(fig)
    return png_path


_META_KEYS = ("info", "model_vs_gbdt")  # entries of a task's results that are not a predictor's metrics
_NOT_PREDICTORS = ("model", "baseline", *_META_KEYS)


def _ci_cell(c: Mapping[str, Any] | None) -> str:
    """`diff [low, high]`, marked when the interval cannot tell the model worse than the GBDT."""
    if not c or not isinstance(c.get("diff"), float) or not math.isfinite(c["diff"]):
        return "–"
    text = f"{_fmt(c['diff'])} [{_fmt(c.get('ci_low', math.nan))}, {_fmt(c.get('ci_high', math.nan))}]"
    return f'<span class="best">{text}</span>' if c.get("a_not_worse") == 1.0 else text


def metrics_table_html(results: Mapping[str, Mapping[str, Any]], stypes: Mapping[str, int]) -> str:
    """Per-task table: for each headline metric, the model, the best trivial baseline and every other baseline."""
    others = sorted({k for r in results.values() for k in r if k not in _NOT_PREDICTORS})
    paired = any("model_vs_gbdt" in r for r in results.values())
    head = ["task", "type", "metric", "model", "best trivial"] + others
    head += ["model − gbdt (95% CI)"] if paired else []
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for task, r in results.items():
        stype = SemanticType(stypes[task])
        metric, higher = HEADLINE[stype]
        vals = {"model": r.get("model", {}).get(metric, math.nan), "best trivial": r.get("baseline", {}).get(metric, math.nan)}
        for o in others:
            vals[o] = r.get(o, {}).get(metric, math.nan)
        finite = {k: v for k, v in vals.items() if isinstance(v, float) and math.isfinite(v)}
        best = (max if higher else min)(finite, key=finite.get) if finite else None
        arrow = "↑" if higher else "↓"
        cells = [html.escape(task), stype.label, f"{metric} {arrow}"]
        for k in ["model", "best trivial"] + others:
            cls = ' class="best"' if k == best else ""
            cells.append(f"<span{cls}>{_fmt(vals[k])}</span>")
        if paired:
            cells.append(_ci_cell(r.get("model_vs_gbdt")))
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def all_metrics_html(results: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    for task, r in results.items():
        names = sorted({m for k, v in r.items() if isinstance(v, Mapping) and k not in _META_KEYS for m in v})
        rows = ["<tr><th></th>" + "".join(f"<th>{html.escape(n)}</th>" for n in names) + "</tr>"]
        for who, v in r.items():
            if isinstance(v, Mapping) and who not in _META_KEYS:
                rows.append(f"<tr><td>{html.escape(who)}</td>" + "".join(f"<td>{_fmt(v.get(n, math.nan))}</td>" for n in names) + "</tr>")
        parts.append(f"<h3>{html.escape(task)}</h3><table>{''.join(rows)}</table>")
    return "\n".join(parts)


def write_report(
    out_dir: Path,
    results: Mapping[str, Mapping[str, Any]],
    stypes: Mapping[str, int],
    *,
    train_log: Path | None = None,
    title: str = "Confluence report",
    notes: Mapping[str, str] | None = None,
) -> Path:
    """Write `report.html` (and `training_curves.png`) into `out_dir`; returns the HTML path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot_training_curves(train_log, out_dir / "training_curves.png") if train_log else None
    note_html = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in (notes or {}).items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child,th:first-child{{text-align:left}}
.best{{font-weight:bold;color:#0a7d28}} h1{{font-size:1.5em}}</style></head><body>
<h1>{html.escape(title)}</h1><ul>{note_html}</ul>
<h2>Headline metric per task</h2><p>Bold green: best on that task. ↑ higher is better, ↓ lower is better.
Last column (when the GBDT ran): the model's headline metric minus the GBDT's on the same rows, with a paired
bootstrap 95% interval; green when the interval cannot tell the model worse than the GBDT.</p>
{metrics_table_html(results, stypes)}
{'<h2>Training curves</h2><img src="training_curves.png" alt="training curves">' if png else ''}
<h2>All metrics</h2>{all_metrics_html(results)}
</body></html>"""
    path = out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
