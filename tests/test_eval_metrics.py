"""Every evaluation metric against a direct scikit-learn / NumPy computation."""

import math

import numpy as np
import pytest
from sklearn import metrics as skm

from confluence.evaluation import metrics as M
from confluence.stypes import US_PER_DAY, SemanticType

rng = np.random.default_rng(0)


def test_binary_metrics_match_sklearn():
    y = rng.random(200) < 0.3
    p = np.clip(0.3 + 0.4 * (y - 0.3) + 0.2 * rng.standard_normal(200), 0.01, 0.99)
    m = M.binary_metrics(y, p)
    assert m["auroc"] == pytest.approx(skm.roc_auc_score(y, p))
    assert m["average_precision"] == pytest.approx(skm.average_precision_score(y, p))
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, p >= 0.5))
    assert m["log_loss"] == pytest.approx(skm.log_loss(y, p))


def test_binary_auroc_nan_on_one_class():
    m = M.binary_metrics(np.ones(5, bool), np.full(5, 0.9))
    assert math.isnan(m["auroc"])
    assert m["accuracy"] == 1.0


def test_categorical_metrics_match_sklearn():
    k = 5
    y = rng.integers(0, k, 300)
    logits = rng.standard_normal((300, k)) + 2.0 * np.eye(k)[y]
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    m = M.categorical_metrics(y, p, top_k=3)
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, p.argmax(1)))
    assert m["macro_f1"] == pytest.approx(skm.f1_score(y, p.argmax(1), average="macro"))
    assert m["top3_accuracy"] == pytest.approx(skm.top_k_accuracy_score(y, p, k=3))
    assert m["log_loss"] == pytest.approx(skm.log_loss(y, p, labels=np.arange(k)))


def test_regression_metrics_match_sklearn():
    y = rng.standard_normal(100) * 3 + 1
    f = y + rng.standard_normal(100)
    m = M.regression_metrics(y, f, target_std=3.0)
    assert m["mae"] == pytest.approx(skm.mean_absolute_error(y, f))
    assert m["nmae"] == pytest.approx(skm.mean_absolute_error(y, f) / 3.0)
    assert m["rmse"] == pytest.approx(np.sqrt(skm.mean_squared_error(y, f)))
    assert m["r2"] == pytest.approx(skm.r2_score(y, f))


def test_timestamp_metrics_in_days():
    t = np.array([0, 86_400e6, 2 * 86_400e6])
    f = t + 43_200e6  # half a day off
    m = M.timestamp_metrics(t, f)
    assert m["mae_days"] == pytest.approx(0.5)
    assert m["mae_hours"] == pytest.approx(12.0)


def test_null_metrics():
    y = np.array([0, 0, 1, 1, 0], bool)
    p = np.array([0.1, 0.4, 0.35, 0.8, 0.2])
    assert M.null_metrics(y, p)["null_auroc"] == pytest.approx(skm.roc_auc_score(y, p))
    assert math.isnan(M.null_metrics(np.zeros(3, bool), np.zeros(3))["null_auroc"])


def test_trivial_baselines_and_best():
    tr = np.array([1.0, 2.0, 3.0, 100.0])
    ev = np.array([2.0, 3.0])
    b = M.trivial_baselines(SemanticType.NUMERICAL, tr, ev)
    assert b["mean"]["mae"] == pytest.approx(np.mean(np.abs(ev - tr.mean())))
    assert b["median"]["mae"] == pytest.approx(np.mean(np.abs(ev - np.median(tr))))
    name, _ = M.best_baseline(SemanticType.NUMERICAL, b)
    assert name == "median"
    cat = M.trivial_baselines(SemanticType.CATEGORICAL, np.array([0, 0, 1, 2]), np.array([0, 1]), num_classes=3)
    assert cat["majority"]["accuracy"] == pytest.approx(0.5)
    boo = M.trivial_baselines(SemanticType.BOOLEAN, np.array([1, 1, 0, 1]), np.array([1, 0, 1]))
    assert boo["majority"]["accuracy"] == pytest.approx(2 / 3)
    assert boo["majority"]["auroc"] == pytest.approx(0.5)


# ---- paired bootstrap (model vs another predictor on the same rows)


def test_paired_bootstrap_identical_predictors_have_a_zero_interval():
    rng = np.random.default_rng(0)
    y = rng.normal(size=200)
    f = y + rng.normal(size=200)
    c = M.paired_bootstrap(SemanticType.NUMERICAL, y, f, f.copy())
    assert c["diff"] == 0 and c["ci_low"] == 0 and c["ci_high"] == 0 and c["a_not_worse"] == 1.0


@pytest.mark.parametrize("stype", [SemanticType.NUMERICAL, SemanticType.TIMESTAMP])
def test_paired_bootstrap_separates_a_clearly_better_regressor(stype):
    rng = np.random.default_rng(1)
    scale = US_PER_DAY if stype == SemanticType.TIMESTAMP else 1.0
    y = rng.normal(size=500) * scale
    good, bad = y + 0.1 * rng.normal(size=500) * scale, y + 2.0 * rng.normal(size=500) * scale
    key = "mae_days" if stype == SemanticType.TIMESTAMP else "mae"
    metric = M.timestamp_metrics if stype == SemanticType.TIMESTAMP else M.regression_metrics
    c = M.paired_bootstrap(stype, y, good, bad)
    assert c["diff"] == pytest.approx(metric(y, good)[key] - metric(y, bad)[key])
    assert c["ci_low"] < c["ci_high"] < 0 and c["a_not_worse"] == 1.0  # lower MAE is better
    c = M.paired_bootstrap(stype, y, bad, good)
    assert c["ci_low"] > 0 and c["a_not_worse"] == 0.0


def test_paired_bootstrap_auroc_and_accuracy_match_sklearn():
    rng = np.random.default_rng(2)
    y = rng.random(300) < 0.3
    pa, pb = np.clip(y * 0.4 + rng.random(300) * 0.6, 0, 1), rng.random(300)
    c = M.paired_bootstrap(SemanticType.BOOLEAN, y, pa, pb, n_boot=200)
    assert c["diff"] == pytest.approx(skm.roc_auc_score(y, pa) - skm.roc_auc_score(y, pb))
    assert 0 < c["ci_low"] <= c["diff"] <= c["ci_high"]
    k = rng.integers(0, 4, size=300)
    probs_a = np.eye(4)[k] * 0.5 + 0.125  # always right
    probs_b = np.full((300, 4), 0.25)
    probs_b[:, 0] += 0.01  # always class 0
    c = M.paired_bootstrap(SemanticType.CATEGORICAL, k, probs_a, probs_b, n_boot=200)
    assert c["diff"] == pytest.approx(1.0 - np.mean(k == 0))
    # Same seed, same interval.
    assert M.paired_bootstrap(SemanticType.CATEGORICAL, k, probs_a, probs_b, n_boot=200) == c


def test_metrics_for_dispatches_on_the_target_type():
    y = np.array([0.0, 1.0, 3.0])
    f = np.array([0.5, 1.0, 2.0])
    assert M.metrics_for(SemanticType.NUMERICAL, y, f, target_std=2.0) == M.regression_metrics(y, f, target_std=2.0)
    assert M.metrics_for(SemanticType.TIMESTAMP, y, f) == M.timestamp_metrics(y, f)
    assert M.headline_value(SemanticType.NUMERICAL, y, f) == pytest.approx(skm.mean_absolute_error(y, f))


def test_bootstrap_auroc_resamples_match_sklearn_on_each_resample():
    """The paired bootstrap scores AUROC on all resamples at once (row counts, integer arithmetic): the same per
    resample as `roc_auc_score` on the drawn rows, ties (one half) and single-class resamples (left out) included,
    whatever the chunking."""
    rng = np.random.default_rng(7)
    n = 40
    y = rng.random(n) < 0.1
    pa, pb = np.round(np.clip(y * 0.3 + rng.random(n) * 0.7, 0, 1), 1), np.round(rng.random(n), 2)  # ties
    idx = rng.integers(0, n, size=(300, n))
    want = [skm.roc_auc_score(y[r], pa[r]) - skm.roc_auc_score(y[r], pb[r]) for r in idx if 0 < y[r].sum() < n]
    assert len(want) < 300  # some resamples hold a single class
    for chunk in (n, 7 * n, 10**6):
        np.testing.assert_allclose(M._bootstrap_auroc_diffs(y, pa, pb, idx, chunk_cells=chunk), want, atol=1e-12)
