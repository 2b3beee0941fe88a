"""Evaluation results in RelBench's layout: per task and split (val, test), the metrics RelBench's tasks report,
under RelBench's names, computed with scikit-learn exactly as `relbench/metrics.py` computes them.

RelBench reports a task as `task.evaluate(pred, table)` -> `{metric function name: value}` once for the val table
and once for the test table (examples/gnn_entity.py: `val_metrics`, `test_metrics`); its metric lists
(relbench/tasks/*.py, relbench/base/task_autocomplete.py) are binary classification `average_precision, accuracy,
f1, roc_auc`, regression `r2, mae, rmse` and multiclass classification `accuracy, macro_f1, micro_f1, mrr`.
Regression adds `nmae`, the MAE divided by the std of the train targets (Confluence's normalized MAE; not one of
RelBench's functions). The file (`relbench_results`) holds the model and every baseline in that same layout:

    {"dataset": ..., "checkpoint_step": ..., "tasks": {task: {"task_type", "n", "notes"}},
     "model": {task: {"val": {metric: value}, "test": {...}}},
     "baselines": {"majority" | "mean" | "median" | "gbdt": {task: {"val": {...}, "test": {...}}}}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from confluence.evaluation.evaluate import EvalRows
from confluence.schema.relbench import TASK_TYPES
from confluence.stypes import SemanticType
from confluence.targets import kind

__all__ = ["LINK_METRICS", "RELBENCH_SPLITS", "relbench_link_results", "relbench_metrics", "relbench_results",
           "relbench_tasks"]

RELBENCH_SPLITS = ("val", "test")


def relbench_metrics(stype: SemanticType, y_true: np.ndarray, pred: np.ndarray,
                     train_std: float | None = None) -> dict[str, float]:
    """RelBench's metrics of one predictor on the labelled rows of a split. `pred`: P(true) (boolean), values
    (numerical), [n, K] class probabilities (categorical, `y_true` the class indices)."""
    return kind(stype).relbench_metrics(y_true, pred, train_std)


def relbench_tasks(store_meta: Mapping[str, Any]) -> list[str]:
    """The tasks of a store that come from RelBench task folders: those whose own `split` names each row's file
    (`split.column`), in store order."""
    tasks = (store_meta.get("database") or {}).get("tasks") or {}
    return [t["name"] for t in store_meta.get("tasks", [])
            if ((tasks.get(t["name"]) or {}).get("split") or {}).get("column")]


def relbench_results(by_split: Mapping[str, Mapping[str, dict]], dataset: str) -> dict[str, Any]:
    """RelBench's layout from `{split: evaluate(..., split=split, keep_rows=True)}` for the val and test splits:
    the model's and each baseline's `{task: {split: {metric: value}}}`, computed from the evaluated rows."""
    out: dict[str, Any] = {"dataset": dataset, "checkpoint_step": None, "tasks": {}, "model": {}, "baselines": {}}
    names = list(dict.fromkeys(t for s in RELBENCH_SPLITS for t in by_split.get(s, {})))
    for task in names:
        info: dict[str, Any] = {"task_type": None, "n": {}, "notes": {}}
        out["tasks"][task] = info
        for split in RELBENCH_SPLITS:
            r = by_split.get(split, {}).get(task)
            if r is None:
                continue
            meta = r.get("info", {})
            out["checkpoint_step"] = meta.get("checkpoint_step", out["checkpoint_step"])
            stype = SemanticType.parse(meta.get("stype", "ignored"))
            if stype not in TASK_TYPES:
                info["notes"][split] = f"a {stype.label} target: RelBench has no such task type"
                continue
            info["task_type"] = TASK_TYPES[stype]
            info["n"][split] = int(meta.get("n_eval_non_null", 0))
            rows = r.get("rows")
            if not isinstance(rows, EvalRows):
                out["model"].setdefault(task, {})[split] = None
                info["notes"][split] = meta.get("note") or "not evaluated (run evaluate with keep_rows=True)"
                continue
            out["model"].setdefault(task, {})[split] = relbench_metrics(stype, rows.truth, rows.pred, rows.train_std)
            others = dict(rows.trivial or {})
            if rows.gbdt is not None:
                others["gbdt"] = rows.gbdt
            for name, pred in others.items():
                block = out["baselines"].setdefault(name, {}).setdefault(task, {})
                block[split] = relbench_metrics(stype, rows.truth, pred, rows.train_std)
        if not info["notes"]:
            del info["notes"]
    return out


# Confluence's ranking metrics (`confluence.targets.link.metrics`) under the names of RelBench's functions
# (relbench/metrics.py: the same formulas, seeds with no destination dropped); NDCG@k is not in every RelBench
# version's list, so it keeps Confluence's name, as `nmae` does
LINK_METRICS = {"precision": "link_prediction_precision", "recall": "link_prediction_recall",
                "map": "link_prediction_map", "ndcg": "ndcg"}


def _link_metrics(m: Mapping[str, float]) -> dict[str, float]:
    return {name: m[ours] for ours, name in LINK_METRICS.items()}


def _key_values(store: Any, table: str) -> tuple[Any, bool]:
    """A function from global rows of `table` to its primary-key values (-1: None), and whether they are keys
    (False: the table has none in the store, and a row's position in the table stands for it)."""
    first = store.table(table).row_offset
    keys = store.keys(table)
    values = keys.to_pylist() if keys is not None else None

    def of(rows: np.ndarray) -> list:
        rows = np.asarray(rows, dtype=np.int64)
        flat = [None if r < 0 else values[r - first] if values is not None else int(r - first)
                for r in rows.ravel().tolist()]
        if rows.ndim == 1:
            return flat
        width = max(rows.shape[1], 1)
        return [flat[i:i + width] for i in range(0, len(flat), width)]

    return of, values is not None


def relbench_link_results(store: Any, results: Mapping[str, Mapping[str, dict]],
                          rankings: Mapping[str, Mapping[str, dict]], checkpoint_step: int | None) -> dict[str, Any]:
    """RelBench's layout for link tasks (its RecommendationTask) from `evaluation.links.evaluate_link_splits` on
    the val and test splits (`results`, `rankings`): per task and split, RelBench's metrics of the model and of each
    baseline, and the model's predictions as RelBench's `task.evaluate(pred, table)` takes them: `pred`, [n, eval_k]
    destination keys (the target table's primary-key values, best first; null pads a shorter list), one row per
    (source key, timestamp) of the split, in `src` / `timestamp` (RelBench's `src_entity_col` / `time_col`; its
    table's rows may come in another order: align on them)."""
    from confluence.evaluation.links import BASELINES
    from confluence.schema.relbench import iso

    out: dict[str, Any] = {"dataset": store.name, "checkpoint_step": checkpoint_step, "tasks": {}, "model": {},
                           "baselines": {}, "predictions": {}}
    declared = (store.meta.get("database") or {}).get("link_tasks") or {}
    names = list(dict.fromkeys(t for s in RELBENCH_SPLITS for t in results.get(s, {})))
    for task in names:
        info, arr, meta = store.link_task(task), store.link_arrays(task), declared.get(task) or {}
        entry: dict[str, Any] = {
            "task_type": "link_prediction", "eval_k": info.k, "src_entity_table": info.anchor_table,
            "src_entity_col": meta.get("anchor_key"), "dst_entity_table": info.target_table,
            "dst_entity_col": meta.get("target_key"), "time_col": meta.get("observation_time_column"), "n": {},
            "notes": {}}
        out["tasks"][task] = entry
        src_of, src_keyed = _key_values(store, info.anchor_table)
        dst_of, dst_keyed = _key_values(store, info.target_table)
        for table, keyed in ((info.anchor_table, src_keyed), (info.target_table, dst_keyed)):
            if not keyed:
                entry["notes"][table] = f"table {table!r} has no primary key in the store: its rows' positions " \
                                        "stand for its keys"
        for split in RELBENCH_SPLITS:
            r = results.get(split, {}).get(task)
            if r is None:
                continue
            if "model" not in r:
                out["model"].setdefault(task, {})[split] = None
                entry["notes"][split] = (r.get("info") or {}).get("note") or "not evaluated"
                continue
            ranked = rankings[split][task]
            entry["n"][split] = int(r["model"]["n"])
            out["model"].setdefault(task, {})[split] = _link_metrics(r["model"])
            for name in (*BASELINES, "gbdt"):
                if name in r:
                    out["baselines"].setdefault(name, {}).setdefault(task, {})[split] = _link_metrics(r[name])
            ids = np.asarray(ranked["seed_ids"], dtype=np.int64)
            out["predictions"].setdefault(task, {})[split] = {
                "src": src_of(np.asarray(arr.anchor_row)[ids]),
                "timestamp": [iso(int(t)) for t in np.asarray(arr.obs_time)[ids]],
                "pred": dst_of(ranked["model"])}
        if not entry["notes"]:
            del entry["notes"]
    return out
