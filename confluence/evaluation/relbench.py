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

__all__ = ["RELBENCH_SPLITS", "relbench_metrics", "relbench_results", "relbench_tasks"]

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
