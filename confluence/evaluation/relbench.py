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

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from scipy.stats import rankdata
from sklearn import metrics as skm

from confluence.evaluation.evaluate import EvalRows
from confluence.schema.relbench import TASK_TYPES
from confluence.stypes import SemanticType

__all__ = ["RELBENCH_SPLITS", "relbench_metrics", "relbench_results", "relbench_tasks"]

RELBENCH_SPLITS = ("val", "test")


def _nan_on_error(fn: Callable[[], float]) -> float:
    """A metric that is undefined on these rows (one class present) is NaN (null in JSON), where RelBench raises."""
    try:
        return float(fn())
    except ValueError:
        return math.nan


def _mrr(y: np.ndarray, probs: np.ndarray) -> float:
    ranks = rankdata(-probs, method="min", axis=1)
    return float(np.mean(1.0 / np.take_along_axis(ranks, y.astype(int).reshape(-1, 1), axis=1).ravel()))


def relbench_metrics(stype: SemanticType, y_true: np.ndarray, pred: np.ndarray,
                     train_std: float | None = None) -> dict[str, float]:
    """RelBench's metrics of one predictor on the labelled rows of a split. `pred`: P(true) (boolean), values
    (numerical), [n, K] class probabilities (categorical, `y_true` the class indices)."""
    stype = SemanticType(stype)
    y, p = np.asarray(y_true), np.asarray(pred, dtype=np.float64)
    if stype == SemanticType.BOOLEAN:
        y = y.astype(bool)
        return {
            "average_precision": _nan_on_error(lambda: skm.average_precision_score(y, p)),
            "accuracy": float(skm.accuracy_score(y, p > 0.5)),
            "f1": float(skm.f1_score(y, p >= 0.5, average="binary", zero_division=0.0)),
            "roc_auc": _nan_on_error(lambda: skm.roc_auc_score(y, p)),
        }
    if stype == SemanticType.NUMERICAL:
        y = y.astype(np.float64)
        mae = float(skm.mean_absolute_error(y, p))
        return {
            "r2": _nan_on_error(lambda: skm.r2_score(y, p)) if y.size > 1 else math.nan,
            "mae": mae,
            "rmse": float(math.sqrt(skm.mean_squared_error(y, p))),
            "nmae": mae / train_std if train_std else math.nan,
        }
    if stype == SemanticType.CATEGORICAL:
        label = p.argmax(axis=1)
        return {
            "accuracy": float(skm.accuracy_score(y, label)),
            "macro_f1": float(skm.f1_score(y, label, average="macro", zero_division=0.0)),
            "micro_f1": float(skm.f1_score(y, label, average="micro", zero_division=0.0)),
            "mrr": _mrr(y, p),
        }
    raise ValueError(f"RelBench has no task type for {stype.label} targets")


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
