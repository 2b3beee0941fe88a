"""Numerical targets: a number, scored by MAE (headline), normalized MAE, RMSE and R²; the trivial baselines are the
train targets' mean and median; LightGBM regresses the standardized number with an L1 objective; `predict` writes
the number rounded and clipped as the train targets imply (no confidence: the model gives no uncertainty for a
number, and 1 - p_null would read as certainty)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
from sklearn import metrics as skm

from confluence.stypes import SemanticType
from confluence.targets.base import TargetKind, safe
from confluence.targets.decode import numerical_predictions


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray, target_std: float | None = None) -> dict[str, float]:
    """MAE (headline), MAE normalized by the target's std (RelBench's normalized MAE), RMSE, R²."""
    y = np.asarray(y_true, dtype=np.float64)
    f = np.asarray(y_pred, dtype=np.float64)
    if y.size == 0:
        return {"mae": math.nan, "nmae": math.nan, "rmse": math.nan, "r2": math.nan, "n": 0.0}
    mae = float(skm.mean_absolute_error(y, f))
    std = float(target_std) if target_std else float(np.std(y))
    return {
        "mae": mae,
        "nmae": mae / std if std > 0 else math.nan,
        "rmse": float(math.sqrt(skm.mean_squared_error(y, f))),
        "r2": safe(skm.r2_score, y, f) if y.size > 1 else math.nan,
        "n": float(y.size),
    }


def mean_and_median(train: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """The constant `mean` and `median` of the train targets for `n` rows (numbers and times alike)."""
    tr = np.asarray(train, dtype=np.float64)
    return {name: np.full(n, value, dtype=np.float64)
            for name, value in (("mean", np.mean(tr) if tr.size else 0.0), ("median", np.median(tr) if tr.size else 0.0))}


def standardized(target: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
    """`target` as z-scores and its (mean, std): what LightGBM regresses (a timestamp is ~1e15 µs)."""
    target = np.asarray(target, np.float64)
    scale = (float(np.mean(target)) if target.size else 0.0, float(np.std(target)) or 1.0)
    return (target - scale[0]) / scale[1], scale


class Numerical(TargetKind):
    stype = SemanticType.NUMERICAL
    headline = ("mae", False)
    plot = "predicted_vs_actual"
    relbench_type = "regression"
    storage = "f32"
    recodes = True

    def recode(self, out: dict[str, np.ndarray], b: int, task: Any, rng: np.random.Generator) -> None:
        """z -> a z + b in every cell of the task's column, |a| in [1/2, 2] with a random sign, b in [-1, 1]."""
        where = ((out["column_ids"][b] == task.target_col) & (out["semantic_types"][b] == int(self.stype))
                 & ~out["is_null"][b])
        a = np.float32(np.exp(rng.uniform(np.log(0.5), np.log(2.0))) * rng.choice([-1.0, 1.0]))
        shift = np.float32(rng.uniform(-1.0, 1.0))
        out["numeric_values"][b, where] = out["numeric_values"][b, where] * a + shift

    def decode(self, store: Any, task: Any, raw: np.ndarray, n: int, ids: np.ndarray) -> np.ndarray:
        mean, std = float(task.stats["mean"]), float(task.stats["std"]) or 1.0
        return np.asarray(raw[ids], dtype=np.float64) * std + mean

    def model_predictions(self, store: Any, task: str, out: Any, keep: np.ndarray,
                          train_ids: np.ndarray | None) -> np.ndarray:
        return numerical_predictions(store, task, out.num_pred[keep], train_ids)

    def metrics(self, y: np.ndarray, pred: np.ndarray, target_std: float | None = None) -> dict[str, float]:
        return regression_metrics(y, pred, target_std=target_std)

    def per_row_scores(self, y: np.ndarray, pred: np.ndarray) -> np.ndarray:
        return np.abs(np.asarray(pred, np.float64) - np.asarray(y, np.float64))

    def target_std(self, train_values: np.ndarray) -> float | None:
        return float(np.std(train_values)) if np.size(train_values) else None

    def explained_quantity(self, store: Any, task: Any, reference: np.ndarray) -> list[str]:
        return [task.name] * len(reference)

    def trivial_predictions(self, train: np.ndarray, n: int, num_classes: int | None) -> dict[str, np.ndarray]:
        return mean_and_median(train, n)

    def blend(self, model: np.ndarray, gbdt: np.ndarray, weight: float, target_range: Any = None) -> np.ndarray:
        out = super().blend(model, gbdt, weight)
        return out if target_range is None else target_range.apply(out)

    def gbdt_target(self, values: np.ndarray, obs: np.ndarray | None, num_classes: int
                    ) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        # L1 objective: its minimiser is the median, the right point estimate for the headline MAE
        target, scale = standardized(values)
        return target, {"objective": "regression_l1"}, {"scale": scale}

    def gbdt_output(self, raw: np.ndarray, n: int, num_classes: int, fit: dict[str, Any],
                    obs: np.ndarray | None) -> np.ndarray:
        mean, std = fit["scale"]
        return raw * std + mean

    def output_columns(self, store: Any, task: Any, out: Any, p_null: np.ndarray, is_null: np.ndarray,
                       train_ids: np.ndarray | None, top_k: int) -> dict[str, pa.Array]:
        return {"prediction": pa.array(numerical_predictions(store, task.name, out.num_pred, train_ids),
                                       mask=is_null)}

    def blend_columns(self, store: Any, task: Any, gbdt: np.ndarray, blended: np.ndarray, p_null: np.ndarray,
                      is_null: np.ndarray) -> dict[str, pa.Array]:
        return {"gbdt_prediction": pa.array(np.asarray(gbdt, np.float64)),
                "blend_prediction": pa.array(np.asarray(blended, np.float64), mask=is_null)}

    def relbench_metrics(self, y: np.ndarray, pred: np.ndarray, train_std: float | None) -> dict[str, float]:
        y, p = np.asarray(y, np.float64), np.asarray(pred, np.float64)
        mae = float(skm.mean_absolute_error(y, p))
        return {
            "r2": safe(skm.r2_score, y, p) if y.size > 1 else math.nan,
            "mae": mae,
            "rmse": float(math.sqrt(skm.mean_squared_error(y, p))),
            "nmae": mae / train_std if train_std else math.nan,
        }
