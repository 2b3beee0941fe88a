"""Categorical targets: [n, K] class probabilities over the target's category block, scored by accuracy (headline),
macro-F1, top-3 accuracy and log loss; the trivial baseline is the train class frequencies; LightGBM fits a
multiclass objective; `predict` writes the top class, its `confidence` and the `top_k` classes with their
probabilities (times 1 - p_null)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
from scipy.stats import rankdata
from sklearn import metrics as skm

from confluence.stypes import SemanticType
from confluence.targets.base import TargetKind, log_odds, safe, softmax
from confluence.targets.decode import task_categories

EPS = 1e-7


def categorical_metrics(y_true: np.ndarray, probs: np.ndarray, top_k: int = 3) -> dict[str, float]:
    """Accuracy (headline), macro-F1, top-k accuracy, log loss. `probs` is [n, K], `y_true` class indices 0..K-1."""
    y = np.asarray(y_true, dtype=np.int64)
    p = np.asarray(probs, dtype=np.float64)
    if y.size == 0:
        return {"accuracy": math.nan, "macro_f1": math.nan, f"top{top_k}_accuracy": math.nan, "log_loss": math.nan,
                "n": 0.0}
    k = p.shape[1]
    labels = np.arange(k)
    pred = p.argmax(axis=1)
    p = np.clip(p, EPS, None)
    p = p / p.sum(axis=1, keepdims=True)
    kk = min(top_k, k)
    return {
        "accuracy": float(skm.accuracy_score(y, pred)),
        "macro_f1": float(skm.f1_score(y, pred, labels=np.unique(y), average="macro", zero_division=0)),
        f"top{top_k}_accuracy": float(skm.top_k_accuracy_score(y, p, k=kk, labels=labels)) if k > kk else 1.0,
        "log_loss": safe(skm.log_loss, y, p, labels=labels),
        "n": float(y.size),
    }


def as_probs(p: np.ndarray, k: int) -> np.ndarray:
    """[n, K] probabilities widened (zeros) to `k` columns."""
    p = np.asarray(p, dtype=np.float64)
    if p.shape[1] >= k:
        return p
    return np.pad(p, ((0, 0), (0, k - p.shape[1])))


def _mrr(y: np.ndarray, probs: np.ndarray) -> float:
    ranks = rankdata(-probs, method="min", axis=1)
    return float(np.mean(1.0 / np.take_along_axis(ranks, y.astype(int).reshape(-1, 1), axis=1).ravel()))


class Categorical(TargetKind):
    stype = SemanticType.CATEGORICAL
    headline = ("accuracy", True)
    plot = "confusion"
    relbench_type = "multiclass_classification"
    has_classes = True
    classifies = True
    storage = "u32"
    recodes = True

    def unknown_targets(self, n: int, cat_block_start: int) -> dict[str, np.ndarray]:
        return self.target_arrays(np.full(n, cat_block_start, np.uint32))  # a valid id: the block's first class

    def recode(self, out: dict[str, np.ndarray], b: int, task: Any, rng: np.random.Generator) -> None:
        """A random permutation of the task's K classes, applied to every category id of its block."""
        k, start = int(task.cat_count), int(task.cat_block_start)
        ids = out["categorical_embed_ids"][b]
        where = (out["semantic_types"][b] == int(self.stype)) & ~out["is_null"][b] & (ids >= start) & (ids < start + k)
        if k > 1 and where.any():
            perm = rng.permutation(k).astype(ids.dtype)
            ids[where] = perm[ids[where] - start] + start

    def decode(self, store: Any, task: Any, raw: np.ndarray, n: int, ids: np.ndarray) -> np.ndarray:
        return np.asarray(raw[ids], dtype=np.int64) - int(task.cat_block_start)

    def num_classes(self, store: Any, task: Any) -> int:
        return int(task.cat_count)

    def model_predictions(self, store: Any, task: str, out: Any, keep: np.ndarray,
                          train_ids: np.ndarray | None) -> np.ndarray:
        return softmax(out.cat_logits[keep])

    def empty_predictions(self, num_classes: int) -> np.ndarray:
        return np.zeros((0, num_classes))

    def metrics(self, y: np.ndarray, pred: np.ndarray, target_std: float | None = None) -> dict[str, float]:
        return categorical_metrics(y, pred)

    def per_row_scores(self, y: np.ndarray, pred: np.ndarray) -> np.ndarray:
        return (np.asarray(pred).argmax(axis=1) == np.asarray(y, dtype=np.int64)).astype(np.float64)

    def explained(self, pred: np.ndarray, reference: np.ndarray) -> np.ndarray:
        pred = np.asarray(pred, np.float64)
        return log_odds(pred[np.arange(pred.shape[0]), np.asarray(reference).argmax(axis=1)])

    def explained_quantity(self, store: Any, task: Any, reference: np.ndarray) -> list[str]:
        names = task_categories(store, task)
        return [f"log-odds of {names[int(c)]!r}" if int(c) < len(names) else f"log-odds of class {int(c)}"
                for c in np.asarray(reference).argmax(axis=1)]

    def point(self, pred: np.ndarray) -> np.ndarray:
        return np.asarray(pred).argmax(axis=1)

    def value_text(self, store: Any, task: Any, value: Any) -> str:
        names = task_categories(store, task)
        return repr(names[int(value)]) if 0 <= int(value) < len(names) else f"class {int(value)}"

    def trivial_predictions(self, train: np.ndarray, n: int, num_classes: int | None) -> dict[str, np.ndarray]:
        tr = np.asarray(train)
        k = int(num_classes if num_classes is not None else int(tr.max(initial=0)) + 1)
        freq = np.bincount(tr.astype(np.int64), minlength=k).astype(np.float64)[:k] + 1e-3
        freq /= freq.sum()
        return {"majority": np.tile(freq, (n, 1))}

    def blend(self, model: np.ndarray, gbdt: np.ndarray, weight: float, target_range: Any = None) -> np.ndarray:
        k = max(np.asarray(model).shape[1], np.asarray(gbdt).shape[1])  # widths may differ: widened with zeros
        return weight * as_probs(model, k) + (1.0 - weight) * as_probs(gbdt, k)

    def gbdt_target(self, values: np.ndarray, obs: np.ndarray | None, num_classes: int
                    ) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        return values, {"objective": "multiclass", "num_class": max(int(num_classes), 2)}, {}

    def gbdt_output(self, raw: np.ndarray, n: int, num_classes: int, fit: dict[str, Any],
                    obs: np.ndarray | None) -> np.ndarray:
        return raw.reshape(n, -1)[:, :num_classes]

    def output_columns(self, store: Any, task: Any, out: Any, p_null: np.ndarray, is_null: np.ndarray,
                       train_ids: np.ndarray | None, top_k: int) -> dict[str, pa.Array]:
        probs = softmax(out.cat_logits)
        cats = np.asarray(task_categories(store, task), dtype=object)
        n, k = len(p_null), probs.shape[1]
        if k == 0 or len(cats) == 0:
            return {"prediction": pa.nulls(n, pa.string()), "confidence": pa.array(np.zeros(n))}
        order = np.argsort(-probs, axis=1, kind="stable")  # most probable first; ties keep block order
        joint = probs * (1.0 - p_null)[:, None]  # P(value = class) = P(class | not null) * P(not null)
        rows = np.arange(n)
        cols: dict[str, pa.Array] = {
            "prediction": pa.array(cats[order[:, 0]], pa.string(), mask=is_null),
            "confidence": pa.array(joint[rows, order[:, 0]]),
        }
        for j in range(min(top_k, k)):
            cols[f"class_{j + 1}"] = pa.array(cats[order[:, j]], pa.string())
            cols[f"prob_{j + 1}"] = pa.array(joint[rows, order[:, j]])
        return cols

    def blend_columns(self, store: Any, task: Any, gbdt: np.ndarray, blended: np.ndarray, p_null: np.ndarray,
                      is_null: np.ndarray) -> dict[str, pa.Array]:
        cats = np.asarray(task_categories(store, task), dtype=object)
        n = len(p_null)
        cols: dict[str, pa.Array] = {}
        for name, probs, mask, scale in (("gbdt", gbdt, None, np.ones(n)), ("blend", blended, is_null, 1 - p_null)):
            probs = np.asarray(probs, np.float64)
            if probs.shape[1] == 0 or len(cats) == 0:
                cols[f"{name}_prediction"] = pa.nulls(n, pa.string())
                cols[f"{name}_confidence"] = pa.array(np.zeros(n))
                continue
            top = probs.argmax(axis=1)
            cols[f"{name}_prediction"] = pa.array(cats[np.minimum(top, len(cats) - 1)], pa.string(), mask=mask)
            cols[f"{name}_confidence"] = pa.array(probs[np.arange(n), top] * scale)
        return cols

    def relbench_metrics(self, y: np.ndarray, pred: np.ndarray, train_std: float | None) -> dict[str, float]:
        y, p = np.asarray(y), np.asarray(pred, dtype=np.float64)
        label = p.argmax(axis=1)
        return {
            "accuracy": float(skm.accuracy_score(y, label)),
            "macro_f1": float(skm.f1_score(y, label, average="macro", zero_division=0.0)),
            "micro_f1": float(skm.f1_score(y, label, average="micro", zero_division=0.0)),
            "mrr": _mrr(y, p),
        }
