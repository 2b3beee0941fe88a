"""Per-task metrics, computed with scikit-learn, and the trivial baselines they are compared with.

Each kind's metrics live in its module (`confluence.targets`); this module asks the kind. Each `*_metrics` function
takes ground truth and predictions for the non-null targets of one task and returns
a flat `{metric: float}` dict. A metric that is undefined on the given rows (AUROC with one class present) is NaN,
never an exception: evaluation of a small split must still report everything else.

Headline metric per target type (what `headline_metric` returns): boolean AUROC, categorical accuracy,
numerical MAE, timestamp MAE in days.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn import metrics as skm

from confluence.stypes import SemanticType
from confluence.targets import KINDS, kind
from confluence.targets.base import safe as _safe
from confluence.targets.boolean import binary_metrics
from confluence.targets.categorical import categorical_metrics
from confluence.targets.numerical import regression_metrics
from confluence.targets.timestamp import US_PER_HOUR, timestamp_metrics

__all__ = ["HEADLINE", "US_PER_HOUR", "best_baseline", "binary_metrics", "categorical_metrics", "headline_metric",
           "headline_value", "metrics_for", "null_metrics", "paired_bootstrap", "regression_metrics",
           "timestamp_metrics", "trivial_baselines", "trivial_predictions"]

HEADLINE = {st: k.headline for st, k in KINDS.items()}


def headline_metric(stype: SemanticType) -> tuple[str, bool]:
    """(metric name, higher is better) of a target type."""
    return kind(stype).headline


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
    return kind(stype).trivial_predictions(np.asarray(train_targets), n, num_classes)


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
    if kind(stype).has_classes and num_classes is None:  # K from the data
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
    return kind(stype).metrics(y_true, pred, target_std=target_std)


def headline_value(stype: SemanticType, y_true: np.ndarray, pred: np.ndarray) -> float:
    """The headline metric of one predictor (`pred` as for `metrics_for`)."""
    return metrics_for(stype, y_true, pred)[headline_metric(stype)[0]]


def _per_row_scores(stype: SemanticType, y: np.ndarray, pred: np.ndarray) -> np.ndarray | None:
    """Per-row terms whose mean is the headline metric (None for AUROC, which does not decompose)."""
    return kind(stype).per_row_scores(y, pred)


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
    else:  # AUROC: recomputed per resample, all resamples at once (resamples with a single class are skipped)
        diffs = _bootstrap_auroc_diffs(y.astype(bool), np.asarray(pred_a, np.float64),
                                       np.asarray(pred_b, np.float64), idx)
    if diffs.size == 0:
        return {"diff": diff, "ci_low": math.nan, "ci_high": math.nan, "n_boot": 0.0, "a_not_worse": math.nan}
    alpha = (1.0 - level) / 2
    lo, hi = (float(v) for v in np.quantile(diffs, [alpha, 1 - alpha]))
    not_worse = hi >= 0 if higher else lo <= 0
    return {"diff": float(diff), "ci_low": lo, "ci_high": hi, "n_boot": float(diffs.size),
            "a_not_worse": float(not_worse)}


def oriented_gain(c: Mapping[str, Any] | None, higher: bool) -> tuple[float, float, float] | None:
    """A `paired_bootstrap` result of A against B turned so that positive always means A is better: (gain, low,
    high); A − B for a score (higher is better), B − A for an error. None without a finite difference; a bound
    that is missing or null reads NaN. An exact tie reads +0, not −0."""
    def num(v: Any) -> float:
        return float(v) if isinstance(v, int | float | np.number) else math.nan

    if not c or not math.isfinite(num(c.get("diff"))):
        return None
    d, lo, hi = num(c.get("diff")), num(c.get("ci_low")), num(c.get("ci_high"))
    return (d, lo, hi) if higher else (0.0 - d, 0.0 - hi, 0.0 - lo)


def _resample_aurocs(y: np.ndarray, score: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """AUROC of `score` on each resample of a paired bootstrap, given as `counts` [B, n] (how many times each row
    was drawn): the Mann-Whitney statistic with each row weighted by its count, a tie between a positive and a
    negative counting one half, which is what `roc_auc_score` returns on the resampled rows (here in exact integer
    arithmetic up to the final division). NaN for a resample with a single class."""
    order = np.argsort(score, kind="stable")
    s, pos = score[order], y[order]
    group = np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1  # tied scores share a group, lowest first
    neg_upto = np.r_[0, np.cumsum(~pos)]  # [k]: negatives among the first k sorted rows
    pi = np.flatnonzero(pos)
    g = group[pi]
    lo = neg_upto[np.searchsorted(group, g, side="left")]  # per positive: negatives in lower groups ...
    hi = neg_upto[np.searchsorted(group, g, side="right")]  # ... and those plus the negatives tied with it
    cn = counts[:, order[~pos]]
    cum = np.zeros((counts.shape[0], cn.shape[1] + 1), np.int64)
    np.cumsum(cn, axis=1, out=cum[:, 1:])  # drawn negatives among the first k negatives
    cp = counts[:, order[pi]].astype(np.int64)
    twice = (cp * (cum[:, lo] + cum[:, hi])).sum(axis=1)  # 2 x (pairs ranked right + half the tied ones)
    with np.errstate(invalid="ignore", divide="ignore"):
        return twice / (2.0 * cp.sum(axis=1) * cum[:, -1])


def _bootstrap_auroc_diffs(y: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray, idx: np.ndarray,
                           chunk_cells: int = 4_000_000) -> np.ndarray:
    """AUROC of A minus that of B on each resample `idx` [B, n] of the rows (row indices drawn with replacement),
    resamples with a single class left out; vectorized over resamples (`_resample_aurocs`), `chunk_cells`
    resample-rows at a time to bound memory. Equal, up to rounding, to `roc_auc_score` on each resample."""
    n_boot, n = idx.shape
    step = max(1, chunk_cells // max(n, 1))
    out = []
    for lo in range(0, n_boot, step):
        part = idx[lo:lo + step]
        b = part.shape[0]
        counts = np.bincount((part + n * np.arange(b)[:, None]).ravel(), minlength=b * n).reshape(b, n)
        d = _resample_aurocs(y, pred_a, counts) - _resample_aurocs(y, pred_b, counts)
        out.append(d[np.isfinite(d)])
    return np.concatenate(out) if out else np.zeros(0)
