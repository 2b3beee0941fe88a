"""`confluence bench learnability`: does the model learn what a planted-signal database plants?

One run: write a planted database (`confluence.synth.planted`), preprocess it, train a recipe on all its tasks for a
fixed number of steps, evaluate the test split, and score on exactly the evaluated rows the trivial baselines,
LightGBM and the Bayes predictor (the ceiling). Per task it reports the model's headline metric, the share of the
ceiling it reaches (`of_ceiling`: metric / ceiling for AUROC and accuracy, where higher is better) and the share of
the way from the best trivial baseline to the ceiling (`gap_closed`: 0 = trivial, 1 = ceiling, for every metric,
MAE included, whose ceiling may be 0). A signal is *reached* at 90 % of its ceiling, or of its gap where the ceiling
is an MAE of 0 (the goal of docs/design/learnability.md). With several training seeds (`train_seeds`) the same database
and store are trained once per seed, and the report says which signals are reached in every run: the run-to-run
spread of a 3,000-step run is as large as most changes measured with it.

The root-cause signals (`confluence.synth.planted.ROOT_CAUSES`: where the model lost to LightGBM on real
databases) are also judged against LightGBM on the same rows: `of_gbdt` is the model's share of the gap from trivial
to the ceiling over LightGBM's, and `reached_gbdt` whether it is at least 90 %.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from confluence.evaluation import metrics as M
from confluence.synth.planted import ROOT_CAUSES, SIGNALS, PlantedSpec, bayes_metrics, write_planted


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


GOAL = 0.9  # a signal is reached at this share of its ceiling (of its gap where the ceiling is an MAE of 0)


def reached(row: dict[str, Any], goal: float = GOAL) -> bool:
    """Whether a `summarize` row reaches `goal`: of its ceiling where that is a ratio (AUROC, accuracy), else of the
    gap from the trivial baseline to the ceiling (an MAE, whose ceiling may be 0)."""
    share = _share(row["of_ceiling"], row["gap_closed"])
    return _finite(share) and share >= goal


def of_gbdt(gap_closed: float | None, gbdt_gap_closed: float | None) -> float:
    """The model's share of the gap from trivial to the ceiling over LightGBM's (NaN where LightGBM closes none of
    it: then the model is compared with LightGBM directly by `reached_gbdt`)."""
    if not (_finite(gap_closed) and _finite(gbdt_gap_closed)) or gbdt_gap_closed <= 0:
        return math.nan
    return gap_closed / gbdt_gap_closed


def reached_gbdt(row: dict[str, Any], goal: float = GOAL) -> bool | None:
    """Whether a `summarize` row reaches `goal` of LightGBM's share of the gap (None without LightGBM); where
    LightGBM closes none of the gap, whether the model closes at least as much."""
    if not _finite(row.get("gbdt_gap_closed")):
        return None
    share = row["of_gbdt"]
    if _finite(share):
        return share >= goal
    return _finite(row["gap_closed"]) and row["gap_closed"] >= row["gbdt_gap_closed"]


def _share(of_ceiling: float | None, gap_closed: float | None) -> float | None:
    """The share a signal is judged by: of its ceiling where that is a ratio, else of its gap."""
    return of_ceiling if _finite(of_ceiling) else gap_closed


def _finite(x: float | None) -> bool:
    """A number to compare (the JSON report writes NaN as null)."""
    return x is not None and math.isfinite(x)


def summarize(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per task: signal, metric, model, best trivial, GBDT, ceiling, of_ceiling, gap_closed, reached."""
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
            "n": r["info"]["n_eval"], "root_cause": task in ROOT_CAUSES,
        })
        rows[-1]["of_gbdt"] = of_gbdt(rows[-1]["gap_closed"], rows[-1]["gbdt_gap_closed"])
        rows[-1]["reached"] = reached(rows[-1])
        rows[-1]["reached_gbdt"] = reached_gbdt(rows[-1])
    return rows


def across_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task over the runs of several training seeds: each seed's model metric, share of the ceiling, share of
    the gap and whether it is reached; how many signals each run reaches and how many every run reaches."""
    tasks = []
    for i, first in enumerate(runs[0]["tasks"]):
        rows = [run["tasks"][i] for run in runs]
        assert all(r["task"] == first["task"] for r in rows)
        tasks.append({"task": first["task"], "signal": first["signal"], "metric": first["metric"],
                      "ceiling": first["ceiling"], "trivial": first["trivial"],
                      "model": [r["model"] for r in rows], "of_ceiling": [r["of_ceiling"] for r in rows],
                      "gap_closed": [r["gap_closed"] for r in rows], "reached": [r["reached"] for r in rows],
                      "reached_in_every_run": all(r["reached"] for r in rows)})
    return {"seeds": [run["seed"] for run in runs], "goal": GOAL, "tasks": tasks,
            "reached_per_run": [sum(r["reached"] for r in run["tasks"]) for run in runs],
            "reached_in_every_run": sum(t["reached_in_every_run"] for t in tasks), "n_signals": len(tasks)}


_HEADLINE_BY_LABEL = {stype.label: value for stype, value in M.HEADLINE.items()}


def run_learnability(out: str | Path, *, spec: PlantedSpec = PlantedSpec(), config: str = "small",
                     sets: dict[str, Any] | None = None, steps: int | str = 3000, max_seeds: int = 2000,
                     gbdt: bool = True, split: str = "val", text_encoder: str | None = None,
                     progress: bool = True, dangling_keys: str = "drop",
                     train_seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """The whole benchmark under `out` (db/, store/, run/, learnability.json); returns the report. `split` is the
    one scored: "val" to choose settings, "test" once for the figure that is reported. `dangling_keys`: how the
    planted database's unmatched foreign keys are preprocessed (`preprocess`). `train_seeds`: train once per seed
    (runs run-seed<N>/, the report's `runs` and `across_runs`; its `tasks` and `results` are the first seed's);
    None: once with the recipe's seed (run/). `steps`: a step count, or "auto" / a duration (the recipe's own run
    length, as `train` without `--max-steps`); each run's `steps` and `best_step` say what it trained."""
    from confluence.errors import ConfigError
    from confluence.evaluation.evaluate import write_json
    from confluence.preprocess.pipeline import check_dangling_keys, preprocess
    from confluence.training.config import load_config
    from confluence.training.loop import open_stream, train

    check_dangling_keys(dangling_keys)  # before anything is written under `out`
    seeds = list(train_seeds) if train_seeds is not None else [None]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError("seed", f"training seeds must be distinct and at least one, got {seeds}")
    cfgs = [load_config(config, {**(sets or {}), **({} if s is None else {"seed": s})}).with_max_steps(steps)
            for s in seeds]  # every setting checked before anything is written
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    db = write_planted(out / "db", spec)
    store = preprocess(db / "raw", db / "planted.metadata.json", out / "store", text_encoder=text_encoder,
                       progress=progress, dangling_keys=dangling_keys)
    timings["data_s"] = time.perf_counter() - t0
    runs = []
    for i, (seed, cfg) in enumerate(zip(seeds, cfgs, strict=True)):
        run_dir = out / ("run" if seed is None else f"run-seed{seed}")
        t0 = time.perf_counter()
        trained = train(cfg, open_stream([store], cfg), run_dir, progress=progress)
        train_s = time.perf_counter() - t0
        t0 = time.perf_counter()  # LightGBM does not depend on the training seed: fitted with the first run only
        results = score_run(run_dir, store, db, split=split, max_seeds=max_seeds, gbdt=gbdt and i == 0)
        runs.append({"seed": cfg.seed, "run": run_dir.name, "steps": trained.step, "best_step": trained.best_step,
                     "train_s": train_s,
                     "evaluate_s": time.perf_counter() - t0, "tasks": summarize(results), "results": results})
    timings["train_s"] = sum(r["train_s"] for r in runs)
    timings["evaluate_s"] = sum(r["evaluate_s"] for r in runs)
    report = {"spec": asdict(spec), "config": config, "sets": sets or {}, "steps": steps, "split": split,
              "dangling_keys": dangling_keys, "max_seeds": max_seeds, "timings": timings,
              "trained_steps": runs[0]["steps"], "best_step": runs[0]["best_step"],
              "tasks": runs[0]["tasks"], "results": runs[0]["results"]}
    if train_seeds is not None:
        report["runs"] = runs
        report["across_runs"] = across_runs(runs)
    write_json(report, out / "learnability.json")
    return report


def score_run(run: str | Path, store: str | Path, db: str | Path, *, split: str = "val", max_seeds: int = 2000,
              gbdt: bool = True) -> dict[str, dict[str, Any]]:
    """Evaluate a trained run on `split` of a planted store, with the Bayes ceiling on the same rows."""
    from confluence.evaluation.evaluate import evaluate

    return evaluate(run, store, split=split, max_seeds=max_seeds, gbdt=gbdt, reference=bayes_reference(Path(db)))


def format_across_runs(summary: dict[str, Any]) -> str:
    """A Markdown table of `across_runs`: per signal, each seed's share of the ceiling (or of the gap) in order."""
    seeds = " / ".join(str(s) for s in summary["seeds"])
    lines = [f"| task | signal | metric | model (seeds {seeds}) | share of ceiling or gap | reached in every run |",
             "|---|---|---|---|---|---|"]
    for t in summary["tasks"]:
        shares = [_share(c, g) for c, g in zip(t["of_ceiling"], t["gap_closed"], strict=True)]
        lines.append(f"| {t['task']} | {t['signal']} | {t['metric']} | "
                     f"{' / '.join(f'{m:.4g}' for m in t['model'])} | {' / '.join(f'{x:.3f}' for x in shares)} | "
                     f"{'yes' if t['reached_in_every_run'] else 'no'} |")
    per_run = ", ".join(f"seed {s}: {n}" for s, n in zip(summary["seeds"], summary["reached_per_run"], strict=True))
    lines.append(f"\nsignals at >= {summary['goal']:.0%} of their ceiling (of the gap where the ceiling is an MAE of "
                 f"0), of {summary['n_signals']}: {per_run}; in every run: {summary['reached_in_every_run']}")
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of `summarize` rows, and how many signals reach the goal."""
    lines = ["| task | signal | metric | model | trivial | GBDT | ceiling | of ceiling | gap closed (model / GBDT) "
             "| of GBDT's gap |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = " (root cause)" if r.get("root_cause") else ""
        lines.append(f"| {r['task']}{mark} | {r['signal']} | {r['metric']} | {r['model']:.4g} | {r['trivial']:.4g} | "
                     f"{r['gbdt']:.4g} | {r['ceiling']:.4g} | {r['of_ceiling']:.3f} | "
                     f"{r['gap_closed']:.3f} / {r['gbdt_gap_closed']:.3f} | {r.get('of_gbdt', math.nan):.3f} |")
    lines.append(f"\nsignals at >= {GOAL:.0%} of their ceiling (of the gap where the ceiling is an MAE of 0): "
                 f"{sum(r['reached'] for r in rows)} of {len(rows)}")
    roots = [r for r in rows if r.get("root_cause") and r.get("reached_gbdt") is not None]
    if roots:
        lines.append(f"root-cause signals at >= {GOAL:.0%} of LightGBM's share of the gap: "
                     f"{sum(bool(r['reached_gbdt']) for r in roots)} of {len(roots)}")
    return "\n".join(lines)
