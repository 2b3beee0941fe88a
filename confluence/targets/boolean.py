"""Boolean targets: P(true), scored by AUROC (headline), average precision, accuracy at 0.5 and log loss; the trivial
baseline is the train rate; LightGBM fits a binary objective; `predict` writes the value, `confidence` (the
probability of the reported value times 1 - p_null) and `p_true`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
from sklearn import metrics as skm

from confluence.store.format import unpack_bits
from confluence.stypes import SemanticType
from confluence.targets.base import TargetKind, log_odds, safe, sigmoid

EPS = 1e-7


def binary_metrics(y_true: np.ndarray, p_true: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """AUROC (headline), average precision, accuracy at `threshold`, log loss; `p_true` = P(y = 1)."""
    y = np.asarray(y_true).astype(bool)
    p = np.clip(np.asarray(p_true, dtype=np.float64), EPS, 1 - EPS)
    two_classes = y.size > 0 and y.any() and not y.all()
    return {
        "auroc": safe(skm.roc_auc_score, y, p) if two_classes else math.nan,
        "average_precision": safe(skm.average_precision_score, y, p) if y.any() else math.nan,
        "accuracy": float(skm.accuracy_score(y, p >= threshold)) if y.size else math.nan,
        "log_loss": safe(skm.log_loss, y, p, labels=[False, True]) if y.size else math.nan,
        "n": float(y.size),
    }


class Boolean(TargetKind):
    stype = SemanticType.BOOLEAN
    headline = ("auroc", True)
    plot = "calibration"
    relbench_type = "binary_classification"
    classifies = True
    storage = "bits"
    recodes = True

    def recode(self, out: dict[str, np.ndarray], b: int, task: Any, rng: np.random.Generator) -> None:
        """True and false swapped in every cell of the task's column."""
        where = ((out["column_ids"][b] == task.target_col) & (out["semantic_types"][b] == int(self.stype))
                 & ~out["is_null"][b])
        out["bool_values"][b, where] = ~out["bool_values"][b, where]

    def decode(self, store: Any, task: Any, raw: np.ndarray, n: int, ids: np.ndarray) -> np.ndarray:
        return unpack_bits(raw, n)[ids]

    def model_predictions(self, store: Any, task: str, out: Any, keep: np.ndarray,
                          train_ids: np.ndarray | None) -> np.ndarray:
        return sigmoid(out.bool_logit[keep])

    def metrics(self, y: np.ndarray, pred: np.ndarray, target_std: float | None = None) -> dict[str, float]:
        return binary_metrics(y, pred)

    def explained(self, pred: np.ndarray, reference: np.ndarray) -> np.ndarray:
        return log_odds(pred)

    def explained_quantity(self, store: Any, task: Any, reference: np.ndarray) -> list[str]:
        return ["log-odds of true"] * len(reference)

    def point(self, pred: np.ndarray) -> np.ndarray:
        return np.asarray(pred, np.float64) > 0.5

    def value_text(self, store: Any, task: Any, value: Any) -> str:
        return "true" if bool(value) else "false"

    def trivial_predictions(self, train: np.ndarray, n: int, num_classes: int | None) -> dict[str, np.ndarray]:
        tr = np.asarray(train)
        return {"majority": np.full(n, float(tr.astype(bool).mean()) if tr.size else 0.5)}

    def gbdt_target(self, values: np.ndarray, obs: np.ndarray | None, num_classes: int
                    ) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        return np.asarray(values).astype(np.float64), {"objective": "binary"}, {}

    def output_columns(self, store: Any, task: Any, out: Any, p_null: np.ndarray, is_null: np.ndarray,
                       train_ids: np.ndarray | None, top_k: int) -> dict[str, pa.Array]:
        p = sigmoid(out.bool_logit)
        return {"prediction": pa.array(p > 0.5, mask=is_null),
                "confidence": pa.array(np.where(p > 0.5, p, 1 - p) * (1 - p_null)),
                "p_true": pa.array(p)}

    def blend_columns(self, store: Any, task: Any, gbdt: np.ndarray, blended: np.ndarray, p_null: np.ndarray,
                      is_null: np.ndarray) -> dict[str, pa.Array]:
        g, b = np.asarray(gbdt, np.float64), np.asarray(blended, np.float64)
        return {"gbdt_prediction": pa.array(g > 0.5), "gbdt_p_true": pa.array(g),
                "blend_prediction": pa.array(b > 0.5, mask=is_null), "blend_p_true": pa.array(b)}

    def relbench_metrics(self, y: np.ndarray, pred: np.ndarray, train_std: float | None) -> dict[str, float]:
        y, p = np.asarray(y).astype(bool), np.asarray(pred, dtype=np.float64)
        return {
            "average_precision": safe(skm.average_precision_score, y, p),
            "accuracy": float(skm.accuracy_score(y, p > 0.5)),
            "f1": float(skm.f1_score(y, p >= 0.5, average="binary", zero_division=0.0)),
            "roc_auc": safe(skm.roc_auc_score, y, p),
        }
