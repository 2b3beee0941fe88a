"""Per-task metrics, computed with scikit-learn, and the trivial baselines they are compared with.

Each `*_metrics` function takes ground truth and predictions for the non-null targets of one task and returns
a flat `{metric: float}` dict. A metric that is undefined on the given rows (AUROC with one class present) is NaN,
never an exception: evaluation of a small split must still report everything else.

Headline metric per target type (what `headline_metric` returns): boolean AUROC, categorical accuracy,
numerical MAE, timestamp MAE in days.
"""

from __future__ import annotations

import math

import numpy as np
from sklearn import metrics as skm

from confluence.stypes import US_PER_DAY, SemanticType

US_PER_HOUR = 3_600e6
_EPS = 1e-7

HEADLINE = {
    SemanticType.BOOLEAN: ("auroc", True),
    SemanticType.CATEGORICAL: ("accuracy", True),
    SemanticType.NUMERICAL: ("mae", False),
    SemanticType.TIMESTAMP: ("mae_days", False),
}


def headline_metric(stype: SemanticType) -> tuple[str, bool]:
    """(metric name, higher is better) of a target type."""
    return HEADLINE[SemanticType(stype)]


def _safe(fn, *args, **kwargs) -> float:
    try:
        value = float(fn(*args, **kwargs))
    except ValueError:
        return math.nan
    return value


def binary_metrics(y_true: np.ndarray, p_true: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """AUROC (headline), average precision, accuracy at `threshold`, log loss; `p_true` = P(y = 1)."""
    y = np.asarray(y_true).astype(bool)
    p = np.clip(np.asarray(p_true, dtype=np.float64), _EPS, 1 - _EPS)
    two_classes = y.size > 0 and y.any() and not y.all()
    return {
        "auroc": _safe(skm.roc_auc_score, y, p) if two_classes else math.nan,
        "average_precision": _safe(skm.average_precision_score, y, p) if y.any() else math.nan,
        "accuracy": float(skm.accuracy_score(y, p >= threshold)) if y.size else math.nan,
        "log_loss": _safe(skm.log_loss, y, p, labels=[False, True]) if y.size else math.nan,
        "n": float(y.size),
    }


def categorical_metrics(y_true: np.ndarray, probs: np.ndarray, top_k: int = 3) -> dict[str, float]:
    """Accuracy (headline), macro-F1, top-k accuracy, log loss. `probs` is [n, K], `y_true` class indices 0..K-1."""
    y = np.asarray(y_true, dtype=np.int64)
    p = np.asarray(probs, dtype=np.float64)
    if y.size == 0:
        return {"accuracy": math.nan, "macro_f1": math.nan, f"top{top_k}_accuracy": math.nan, "log_loss": math.nan, "n": 0.0}
    k = p.shape[1]
    labels = np.arange(k)
    pred = p.argmax(axis=1)
    p = np.clip(p, _EPS, None)
    p = p / p.sum(axis=1, keepdims=True)
    kk = min(top_k, k)
    return {
        "accuracy": float(skm.accuracy_score(y, pred)),
        "macro_f1": float(skm.f1_score(y, pred, labels=np.unique(y), average="macro", zero_division=0)),
        f"top{top_k}_accuracy": float(skm.top_k_accuracy_score(y, p, k=kk, labels=labels)) if k > kk else 1.0,
        "log_loss": _safe(skm.log_loss, y, p, labels=labels),
        "n": float(y.size),
    }


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
        "r2": _safe(skm.r2_score, y, f) if y.size > 1 else math.nan,
        "n": float(y.size),
    }


def timestamp_metrics(t_true_us: np.ndarray, t_pred_us: np.ndarray) -> dict[str, float]:
    """MAE in days (headline) and in hours, and RMSE in days, from epoch-microsecond values."""
    t = np.asarray(t_true_us, dtype=np.float64)
    f = np.asarray(t_pred_us, dtype=np.float64)
    if t.size == 0:
        return {"mae_days": math.nan, "mae_hours": math.nan, "rmse_days": math.nan, "n": 0.0}
    mae = float(skm.mean_absolute_error(t, f))
    return {
        "mae_days": mae / US_PER_DAY,
        "mae_hours": mae / US_PER_HOUR,
        "rmse_days": float(math.sqrt(skm.mean_squared_error(t, f))) / US_PER_DAY,
        "n": float(t.size),
    }


def null_metrics(is_null: np.ndarray, p_null: np.ndarray) -> dict[str, float]:
    """AUROC of the null head (NaN when every target is null or none is)."""
    y = np.asarray(is_null).astype(bool)
    if y.size == 0 or y.all() or not y.any():
        return {"null_auroc": math.nan}
    return {"null_auroc": _safe(skm.roc_auc_score, y, np.asarray(p_null, dtype=np.float64))}


# ---------------------------------------------------------------------------------------------- trivial baselines


def trivial_predictions(
    stype: SemanticType, train_targets: np.ndarray, n: int, num_classes: int | None = None
) -> dict[str, np.ndarray]:
    """The constant predictions of the trivial baselines, fitted on the train split's targets, for `n` rows (in the
    units of `metrics_for`): boolean `majority` (P(true) = the train rate); categorical `majority` (the train class
    frequencies, `num_classes` wide); numerical and timestamp `mean` and `median`."""
    stype = SemanticType(stype)
    tr = np.asarray(train_targets)
    if stype == SemanticType.BOOLEAN:
        rate = float(tr.astype(bool).mean()) if tr.size else 0.5
        return {"majority": np.full(n, rate)}
    if stype == SemanticType.CATEGORICAL:
        k = int(num_classes if num_classes is not None else int(tr.max(initial=0)) + 1)
        freq = np.bincount(tr.astype(np.int64), minlength=k).astype(np.float64)[:k] + 1e-3
        freq /= freq.sum()
        return {"majority": np.tile(freq, (n, 1))}
    if stype in (SemanticType.NUMERICAL, SemanticType.TIMESTAMP):
        return {name: np.full(n, value, dtype=np.float64)
                for name, value in (("mean", np.mean(tr) if tr.size else 0.0),
                                    ("median", np.median(tr) if tr.size else 0.0))}
    raise ValueError(f"no baselines for target type {stype.label}")


def trivial_baselines(
    stype: SemanticType, train_targets: np.ndarray, eval_targets: np.ndarray, num_classes: int | None = None
) -> dict[str, dict[str, float]]:
    """Metrics of the constant predictors fitted on the train split (`trivial_predictions`), on the evaluation rows.

    boolean: `majority` (constant P(true) = train rate); categorical: `majority` (train class frequencies);
    numerical and timestamp: `mean` and `median` of the train targets.
    """
    stype = SemanticType(stype)
    tr = np.asarray(train_targets)
    ev = np.asarray(eval_targets)
    if stype == SemanticType.CATEGORICAL and num_classes is None:
        num_classes = max(int(tr.max(initial=0)), int(ev.max(initial=0))) + 1
    preds = trivial_predictions(stype, tr, ev.size, num_classes)
    std = float(np.std(tr)) if tr.size else None
    return {name: metrics_for(stype, ev, pred, target_std=std) for name, pred in preds.items()}


def best_baseline(stype: SemanticType, baselines: dict[str, dict[str, float]]) -> tuple[str, dict[str, float]]:
    """The trivial baseline with the best headline metric (NaN-safe)."""
    metric, higher = headline_metric(stype)

    def score(item):
        v = item[1].get(metric, math.nan)
        if math.isnan(v):
            return -math.inf
        return v if higher else -v

    return max(baselines.items(), key=score)


# ------------------------------------------------------------------------------------------- paired comparison


def metrics_for(stype: SemanticType, y_true: np.ndarray, pred: np.ndarray,
                target_std: float | None = None) -> dict[str, float]:
    """Every metric of one predictor on the non-null targets of a task: `pred` is P(true) (boolean), [n, K]
    probabilities (categorical), values (numerical; `target_std` normalizes the MAE) or epoch microseconds
    (timestamp)."""
    stype = SemanticType(stype)
    if stype == SemanticType.BOOLEAN:
        return binary_metrics(y_true, pred)
    if stype == SemanticType.CATEGORICAL:
        return categorical_metrics(y_true, pred)
    if stype == SemanticType.NUMERICAL:
        return regression_metrics(y_true, pred, target_std=target_std)
    return timestamp_metrics(y_true, pred)


def headline_value(stype: SemanticType, y_true: np.ndarray, pred: np.ndarray) -> float:
    """The headline metric of one predictor (`pred` as for `metrics_for`)."""
    return metrics_for(stype, y_true, pred)[headline_metric(stype)[0]]


def _per_row_scores(stype: SemanticType, y: np.ndarray, pred: np.ndarray) -> np.ndarray | None:
    """Per-row terms whose mean is the headline metric (None for AUROC, which does not decompose)."""
    if stype == SemanticType.CATEGORICAL:
        return (np.asarray(pred).argmax(axis=1) == np.asarray(y, dtype=np.int64)).astype(np.float64)
    if stype == SemanticType.NUMERICAL:
        return np.abs(np.asarray(pred, np.float64) - np.asarray(y, np.float64))
    if stype == SemanticType.TIMESTAMP:
        return np.abs(np.asarray(pred, np.float64) - np.asarray(y, np.float64)) / US_PER_DAY
    return None


def paired_bootstrap(
    stype: SemanticType, y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray, *, n_boot: int = 1000,
    seed: int = 0, level: float = 0.95,
) -> dict[str, float]:
    """Headline metric of A minus that of B on the same rows, with a paired percentile bootstrap interval.

    Rows are resampled with replacement `n_boot` times (the same resample for A and B), so the interval reflects
    how much the difference depends on which evaluation rows were drawn. `a_not_worse` is 1.0 when the interval
    reaches the side where A is at least as good as B (for a higher-is-better metric: `ci_high >= 0`), i.e. the
    data cannot tell A worse than B at this level.
    """
    stype = SemanticType(stype)
    _, higher = headline_metric(stype)
    y = np.asarray(y_true)
    n = y.shape[0]
    diff = headline_value(stype, y, pred_a) - headline_value(stype, y, pred_b)
    if n == 0 or not math.isfinite(diff):
        return {"diff": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n_boot": 0.0, "a_not_worse": math.nan}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    sa, sb = _per_row_scores(stype, y, pred_a), _per_row_scores(stype, y, pred_b)
    if sa is not None and sb is not None:
        diffs = (sa - sb)[idx].mean(axis=1)
    else:  # AUROC: recompute per resample (resamples with a single class are skipped)
        yb = y.astype(bool)
        pa, pb = np.asarray(pred_a, np.float64), np.asarray(pred_b, np.float64)
        vals = []
        for r in idx:
            if yb[r].all() or not yb[r].any():
                continue
            vals.append(skm.roc_auc_score(yb[r], pa[r]) - skm.roc_auc_score(yb[r], pb[r]))
        diffs = np.asarray(vals)
    if diffs.size == 0:
        return {"diff": diff, "ci_low": math.nan, "ci_high": math.nan, "n_boot": 0.0, "a_not_worse": math.nan}
    alpha = (1.0 - level) / 2
    lo, hi = (float(v) for v in np.quantile(diffs, [alpha, 1 - alpha]))
    not_worse = hi >= 0 if higher else lo <= 0
    return {"diff": float(diff), "ci_low": lo, "ci_high": hi, "n_boot": float(diffs.size),
            "a_not_worse": float(not_worse)}
