"""`confluence bench learnability`: does the model learn what a planted-signal database plants?

One run: write a planted database (`confluence.synth.planted`), preprocess it, train a recipe on all its tasks for a
fixed number of steps, evaluate the test split, and score on exactly the evaluated rows the trivial baselines,
LightGBM and the Bayes predictor (the ceiling). Per task it reports the model's headline metric, the share of the
ceiling it reaches (`of_ceiling`: metric / ceiling for AUROC and accuracy, where higher is better) and the share of
the way from the best trivial baseline to the ceiling (`gap_closed`: 0 = trivial, 1 = ceiling, for every metric,
MAE included, whose ceiling may be 0).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from confluence.evaluation import metrics as M
from confluence.synth.planted import SIGNALS, PlantedSpec, bayes_metrics, write_planted


def bayes_reference(db_dir: Path):
    """An `evaluate(reference=...)` hook scoring the planted database's Bayes predictor on the evaluated rows,
    found by anchor key (and observation time, for the derived tasks)."""
    tables = {p.stem: pq.read_table(p) for p in sorted((db_dir / "bayes").glob("*.parquet"))}

    def score(task: str, eval_ids: np.ndarray, store: Any) -> dict[str, Any]:
        if task not in tables:
            return {}
        t = tables[task]
        arrays = store.task_arrays(task)
        info = store.table(store.task(task).anchor_table)
        keys = np.asarray(store.keys(info.name).to_numpy(zero_copy_only=False))
        wanted = keys[arrays.anchor_row[eval_ids] - info.row_offset].tolist()
        have = t.column(0).to_pylist()
        if "obs_time" in t.column_names:  # derived tasks: one row per (anchor, observation time)
            wanted = list(zip(wanted, arrays.obs_time[eval_ids].tolist(), strict=True))
            have = list(zip(have, t.column("obs_time").cast("int64").to_pylist(), strict=True))
        row_of = {k: i for i, k in enumerate(have)}
        rows = t.take(np.asarray([row_of[k] for k in wanted], dtype=np.int64))
        return {"ceiling": bayes_metrics(task, rows)}

    return score


def summarize(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per task: signal, metric, model, best trivial, GBDT, ceiling, of_ceiling, gap_closed."""
    rows = []
    for task, r in results.items():
        if "model" not in r or "ceiling" not in r:
            continue
        metric, higher = _HEADLINE_BY_LABEL[r["info"]["stype"]]
        model, trivial, ceil = r["model"][metric], r["baseline"][metric], r["ceiling"][metric]
        gbdt = r.get("gbdt", {}).get(metric, math.nan)
        gap = ceil - trivial
        rows.append({
            "task": task, "signal": SIGNALS[task][0], "metric": metric, "model": model, "trivial": trivial,
            "trivial_name": r["baseline"].get("name"), "gbdt": gbdt, "ceiling": ceil,
            "of_ceiling": model / ceil if higher and ceil else math.nan,
            "gap_closed": (model - trivial) / gap if gap else math.nan,
            "gbdt_gap_closed": (gbdt - trivial) / gap if gap else math.nan,
            "n": r["info"]["n_eval"],
        })
    return rows


_HEADLINE_BY_LABEL = {stype.label: value for stype, value in M.HEADLINE.items()}


def run_learnability(out: str | Path, *, spec: PlantedSpec = PlantedSpec(), config: str = "small",
                     sets: dict[str, Any] | None = None, steps: int = 3000, max_seeds: int = 2000,
                     gbdt: bool = True, split: str = "val", text_encoder: str | None = None,
                     progress: bool = True, dangling_keys: str = "drop") -> dict[str, Any]:
    """The whole benchmark under `out` (db/, store/, run/, learnability.json); returns the report. `split` is the
    one scored: "val" to choose settings, "test" once for the figure that is reported. `dangling_keys`: how the
    planted database's unmatched foreign keys are preprocessed (`preprocess`)."""
    from confluence.evaluation.evaluate import write_json
    from confluence.preprocess.pipeline import check_dangling_keys, preprocess
    from confluence.training.config import load_config
    from confluence.training.loop import open_stream, train

    check_dangling_keys(dangling_keys)  # before anything is written under `out`
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    db = write_planted(out / "db", spec)
    store = preprocess(db / "raw", db / "planted.metadata.json", out / "store", text_encoder=text_encoder,
                       progress=progress, dangling_keys=dangling_keys)
    timings["data_s"] = time.perf_counter() - t0
    cfg = load_config(config, sets or {}).with_max_steps(steps)
    t0 = time.perf_counter()
    train(cfg, open_stream([store], cfg), out / "run", progress=progress)
    timings["train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    results = score_run(out / "run", store, db, split=split, max_seeds=max_seeds, gbdt=gbdt)
    timings["evaluate_s"] = time.perf_counter() - t0
    report = {"spec": asdict(spec), "config": config, "sets": sets or {}, "steps": steps, "split": split,
              "dangling_keys": dangling_keys, "max_seeds": max_seeds,
              "timings": timings, "tasks": summarize(results), "results": results}
    write_json(report, out / "learnability.json")
    return report


def score_run(run: str | Path, store: str | Path, db: str | Path, *, split: str = "val", max_seeds: int = 2000,
              gbdt: bool = True) -> dict[str, dict[str, Any]]:
    """Evaluate a trained run on `split` of a planted store, with the Bayes ceiling on the same rows."""
    from confluence.evaluation.evaluate import evaluate

    return evaluate(run, store, split=split, max_seeds=max_seeds, gbdt=gbdt, reference=bayes_reference(Path(db)))


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of `summarize` rows."""
    lines = ["| task | signal | metric | model | trivial | GBDT | ceiling | of ceiling | gap closed (model / GBDT) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['signal']} | {r['metric']} | {r['model']:.4g} | {r['trivial']:.4g} | "
                     f"{r['gbdt']:.4g} | {r['ceiling']:.4g} | {r['of_ceiling']:.3f} | "
                     f"{r['gap_closed']:.3f} / {r['gbdt_gap_closed']:.3f} |")
    return "\n".join(lines)
