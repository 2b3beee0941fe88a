"""The blend of the model and LightGBM (`--blend gbdt`): the weight chosen on validation where the right answer is
known, the ship rule, and `evaluate` / `predict` with a blend on a store and a checkpoint trained in the test."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from confluence.errors import ConfluenceError
from confluence.evaluation import metrics as M
from confluence.evaluation.blend import (
    DEFAULT_WEIGHT,
    GRID,
    blend_predictions,
    check_blend,
    choose_weight,
    fit_blend,
)
from confluence.stypes import US_PER_DAY, SemanticType
from confluence.targets import TargetRange
from tests.test_eval_end_to_end import shop  # noqa: F401  (the store and 12-step checkpoint fixture)

NUM, BOOL, CAT, TS = SemanticType.NUMERICAL, SemanticType.BOOLEAN, SemanticType.CATEGORICAL, SemanticType.TIMESTAMP


def test_grid_is_0_to_1_by_0_05():
    assert len(GRID) == 21 and GRID[0] == 0.0 and GRID[-1] == 1.0 and GRID[10] == 0.5


def test_opposite_biases_blend_to_the_middle_and_beat_both():
    rng = np.random.default_rng(0)
    y = rng.normal(100, 20, 500)
    model, gbdt = y + 5 + rng.normal(0, 0.5, 500), y - 5 + rng.normal(0, 0.5, 500)
    fit = fit_blend(NUM, y, model, gbdt)
    assert fit.weight == 0.5 and fit.ship == "blend" and fit.source == "validation" and fit.n_val == 500
    assert fit.scores["blend"] < min(fit.scores["model"], fit.scores["LightGBM"])
    assert fit.guard == "passed" and fit.best_weight == 0.5 and fit.note is None
    assert fit.val_ci[0] > 0 and fit.val_gain == pytest.approx(fit.scores["LightGBM"] - fit.scores["blend"])
    assert fit.scores["model"] == pytest.approx(M.headline_value(NUM, y, model))


def test_each_good_on_half_the_rows_blend_beats_both_on_accuracy():
    """The model is right and sure on half the rows and wrong but unsure on the other half; LightGBM the reverse.
    Every weight in [0.1, 0.9] gets every row right (accuracy 1 against 0.5 for each alone): the middle, 0.5."""
    n = 200
    y = np.arange(n) % 3
    sure, unsure = np.full((n, 3), 0.05), np.full((n, 3), 0.25)
    sure[np.arange(n), y] = 0.9
    unsure[np.arange(n), y] = 0.35
    unsure[np.arange(n), (y + 1) % 3] = 0.4
    half = (np.arange(n) < n // 2)[:, None]
    model, gbdt = np.where(half, sure, unsure), np.where(half, unsure, sure)
    fit = fit_blend(CAT, y, model, gbdt)
    assert fit.scores == {"model": 0.5, "LightGBM": 0.5, "blend": 1.0}
    assert fit.weight == 0.5 and fit.ship == "blend" and fit.guard == "passed"
    assert M.headline_value(CAT, y, blend_predictions(CAT, model, gbdt, fit.weight)) == 1.0


def test_two_half_signals_blend_beats_both_on_auroc():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=2000), rng.normal(size=2000)
    y = a + b > 0
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    fit = fit_blend(BOOL, y, sig(2 * a), sig(2 * b))
    assert 0.3 <= fit.weight <= 0.7 and fit.ship == "blend" and fit.guard == "passed" and fit.val_ci[0] > 0.03
    assert fit.scores["blend"] > max(fit.scores["model"], fit.scores["LightGBM"]) + 0.05


def test_noise_partner_gets_no_share():
    rng = np.random.default_rng(2)
    y = rng.normal(0, 1, 400)
    good, noise = y + rng.normal(0, 0.1, 400), rng.normal(0, 3, 400)
    assert fit_blend(NUM, y, good, noise).weight == 1.0
    assert fit_blend(NUM, y, good, noise).ship == "model" and fit_blend(NUM, y, good, noise).guard == "passed"
    assert fit_blend(NUM, y, noise, good).weight == 0.0
    assert fit_blend(NUM, y, noise, good).guard is None  # LightGBM alone already: nothing to guard
    assert fit_blend(NUM, y, noise, good).ship == "LightGBM"
    t = 1.7e15 + y * US_PER_DAY  # timestamps: the same in epoch µs
    assert fit_blend(TS, t, 1.7e15 + good * US_PER_DAY, 1.7e15 + noise * US_PER_DAY).weight == 1.0


def test_ties_go_to_the_model_then_lightgbm_then_the_middle():
    assert choose_weight(np.zeros(21)) == 1.0  # identical predictors: the model alone
    s = np.full(21, -1.0)
    s[[0, 4, 5, 6]] = 0.0
    assert choose_weight(s) == 0.0
    s[0] = -1.0
    assert choose_weight(s) == GRID[5]
    s[7] = 0.0  # an even count of tied weights: the lower middle
    assert choose_weight(s) == GRID[5]
    assert choose_weight(np.full(21, np.nan)) is None
    s = np.zeros(21)
    s[10] = 1e-14  # floating-point noise does not make a blend
    assert choose_weight(s) == 1.0


def test_identical_predictors_ship_lightgbm_under_the_guard():
    """The tie goes to the model (w = 1), but nothing shows it better than LightGBM (gain 0, interval [0, 0]): the
    guard ships LightGBM. Without the guard the tie-break stands."""
    y = np.array([1.0, 2.0, 3.0])
    fit = fit_blend(NUM, y, y + 1, y + 1)
    assert fit.best_weight == 1.0 and fit.val_gain == 0.0 and fit.val_ci == (0.0, 0.0)
    assert fit.weight == 0.0 and fit.ship == "LightGBM" and fit.guard == "failed"
    off = fit_blend(NUM, y, y + 1, y + 1, guard=False)
    assert off.weight == 1.0 and off.ship == "model" and off.guard == "off" and off.note is None


def test_no_validation_rows_fall_back_to_the_equal_average():
    fit = fit_blend(NUM, np.zeros(0), np.zeros(0), np.zeros(0))
    assert fit.weight == DEFAULT_WEIGHT and fit.source == "default" and fit.n_val == 0 and "no labelled" in fit.note
    one_class = fit_blend(BOOL, np.ones(10, bool), np.full(10, 0.7), np.full(10, 0.6))  # AUROC undefined
    assert one_class.weight == DEFAULT_WEIGHT and "undefined" in one_class.note
    assert math.isnan(one_class.summary()["model"]) and one_class.summary()["weight_source"] == "default"


def _tiny_auroc_gain(seed: int, n: int = 2000):
    """A boolean task where LightGBM is good and the model weak but with a little signal LightGBM lacks: the best
    validation weight is 0.05, its gain over LightGBM inside the noise (the shape of euip's
    `decision_press_release`, docs/design/decisions.md)."""
    rng = np.random.default_rng(seed)
    z, u = rng.normal(size=n), rng.normal(size=n)
    y = z + 0.15 * u + rng.normal(size=n) > 0
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    return y, sig(0.5 * z + u + rng.normal(0, 2, n)), sig(2 * z)


def test_a_tiny_noisy_validation_gain_ships_lightgbm_and_says_why():
    y, model, gbdt = _tiny_auroc_gain(2)
    fit = fit_blend(BOOL, y, model, gbdt)
    assert fit.best_weight == 0.05 and fit.scores["blend"] > fit.scores["LightGBM"]  # the best on validation ...
    assert 0 < fit.val_gain < 0.002 and fit.val_ci[0] < 0 < fit.val_ci[1]  # ... by a gain inside the noise
    assert fit.val_gain == pytest.approx(fit.scores["blend"] - fit.scores["LightGBM"])
    assert fit.weight == 0.0 and fit.ship == "LightGBM" and fit.guard == "failed"
    assert "w = 0.05" in fit.note and "interval" in fit.note and "LightGBM alone" in fit.note
    assert f"{fit.val_ci[0]:+.3g}" in fit.note
    s = fit.summary()
    assert s["weight"] == 0.0 and s["best_weight"] == 0.05 and s["guard"] == "failed"
    assert s["val_ci"] == list(fit.val_ci) and s["val_gain"] == fit.val_gain and s["note"] == fit.note
    off = fit_blend(BOOL, y, model, gbdt, guard=False)  # the behaviour without the guard
    assert off.weight == 0.05 and off.ship == "blend" and off.guard == "off" and off.note is None
    assert off.val_ci == fit.val_ci and off.summary()["best_weight"] == 0.05
    # numbers: a model with a little of its own signal drowned in noise, on 300 rows
    rng = np.random.default_rng(0)
    t = rng.normal(0, 1, 300)
    num = fit_blend(NUM, t, t + rng.normal(0, 4, 300), t + rng.normal(0, 1, 300))
    assert num.best_weight == 0.05 and num.val_ci[0] < 0 and num.weight == 0.0 and num.ship == "LightGBM"


def test_a_clear_gain_still_ships_the_blend_or_the_model():
    rng = np.random.default_rng(4)
    y = rng.normal(100, 20, 300)
    fit = fit_blend(NUM, y, y + 3 + rng.normal(0, 2, 300), y - 3 + rng.normal(0, 2, 300))
    assert 0.4 <= fit.weight == fit.best_weight <= 0.6 and fit.ship == "blend" and fit.guard == "passed"
    assert fit.val_ci[0] > 1.0 and fit.note is None and "note" not in fit.summary()
    k = np.arange(300) % 4  # categories: the model right on every row, LightGBM on a quarter
    fit = fit_blend(CAT, k, np.eye(4)[k] * 0.6 + 0.1, np.tile([0.4, 0.2, 0.2, 0.2], (300, 1)))
    assert fit.weight == 1.0 and fit.ship == "model" and fit.guard == "passed" and fit.val_ci[0] > 0.6


def test_the_guard_is_waived_where_lightgbm_is_no_better_than_trivial():
    """A boolean where LightGBM is at chance on validation and the model a little above, inside the noise: the
    guard would ship LightGBM; given the trivial baseline it is waived and the best weight shipped. Where LightGBM is
    clearly better than trivial, the same model still fails the guard."""
    rng = np.random.default_rng(3)
    y = rng.random(400) < 0.3
    model = np.clip(0.3 + 0.04 * y + rng.normal(0, 0.2, 400), 0, 1)  # a faint signal
    bad = np.clip(0.3 - 0.03 * y + rng.normal(0, 0.2, 400), 0, 1)  # a faint inverted one
    trivial = M.trivial_predictions(BOOL, y[:100], 400)
    plain = fit_blend(BOOL, y, model, bad)
    assert plain.best_weight >= 0.5 and plain.val_ci[0] < 0 and plain.guard == "failed" and plain.weight == 0.0
    fit = fit_blend(BOOL, y, model, bad, trivial=trivial)
    assert fit.guard == "waived" and fit.weight == plain.best_weight and fit.ship != "LightGBM"
    assert "trivial baseline (majority)" in fit.note and "interval" in fit.note
    assert fit.summary()["guard"] == "waived" and fit.val_ci == plain.val_ci
    good = np.clip(0.3 + 0.5 * y + rng.normal(0, 0.1, 400), 0, 1)  # LightGBM far ahead of trivial ...
    both = fit_blend(BOOL, y, good + rng.normal(0, 0.3, 400), good, trivial=trivial)
    assert both.guard in (None, "failed") and both.weight == 0.0  # ... so the guard holds


def test_the_floor_ships_the_trivial_baseline_where_nothing_beats_it():
    """A boolean where the model and LightGBM both carry no signal (euip's `lfn`: 0.508 and 0.490 AUROC on
    validation, 0.458 and 0.378 on test): neither is shown better than the majority, so the floor ships it and says
    why; without the floor the old choice stands. Where LightGBM is validation's best but no better than the
    majority, the floor ships the majority too; where the model is clearly better, the floor passes."""
    rng = np.random.default_rng(5)
    y = rng.random(600) < 0.3
    model, gbdt = rng.random(600), rng.random(600)  # noise, both
    trivial = M.trivial_predictions(BOOL, y[:200], 600)
    fit = fit_blend(BOOL, y, model, gbdt, trivial=trivial)
    assert fit.ship == "trivial" and fit.trivial_name == "majority" and fit.scores["trivial"] == 0.5
    assert fit.trivial_ci[0] <= 0 < fit.trivial_ci[1] and "the trivial baseline is shipped" in fit.note
    assert fit.summary()["trivial_name"] == "majority" and fit.summary()["trivial_ci"] == list(fit.trivial_ci)
    old = fit_blend(BOOL, y, model, gbdt, trivial=trivial, floor=False)
    assert old.ship != "trivial" and old.trivial_name is None and "trivial" not in old.scores
    assert fit_blend(BOOL, y, model, gbdt, trivial=trivial, guard=False).ship != "trivial"  # no guard, no floor
    lgbm_best = fit_blend(BOOL, y, np.full(600, 0.3), gbdt, trivial=trivial)  # the model says nothing at all
    assert lgbm_best.best_weight == 0.0 and lgbm_best.ship == "trivial"
    good = np.clip(0.3 + 0.5 * y + rng.normal(0, 0.2, 600), 0, 1)
    clear = fit_blend(BOOL, y, good, gbdt, trivial=trivial)
    assert clear.ship == "model" and clear.trivial_ci[0] > 0.3 and clear.note is None


def test_the_floor_compares_a_when_next_task_with_the_median_wait():
    """A timestamp task with observation times: the baselines are the constants and each row's time plus the median
    wait (`median_offset`), the best of them by MAE; a model and LightGBM that only know the calendar's middle are
    not shown better than it, and the shipped baseline is the median wait."""
    from confluence.evaluation.trivial import MEDIAN_OFFSET, TrivialFit

    rng = np.random.default_rng(0)
    obs = (np.sort(rng.integers(0, 3000, 500)) * US_PER_DAY).astype(np.int64)
    wait = rng.gamma(4.0, 5.0, 500) * US_PER_DAY
    truth = obs + wait
    fitted = TrivialFit(constants={"mean": np.asarray(float(truth.mean()))}, offset=20.0 * US_PER_DAY)
    base = fitted.predictions(500, obs)
    assert set(base) == {"mean", MEDIAN_OFFSET} and np.array_equal(base[MEDIAN_OFFSET], obs + 20.0 * US_PER_DAY)
    noisy = lambda: obs + (20.0 + rng.normal(0, 15, 500)) * US_PER_DAY  # noqa: E731
    fit = fit_blend(TS, truth, noisy(), noisy(), trivial=base)
    assert fit.ship == "trivial" and fit.trivial_name == MEDIAN_OFFSET and fit.metric == "mae_days"
    no_cutoff = obs.copy()
    no_cutoff[3] = np.iinfo(np.int64).max  # a row that sees the whole database: no wait to add to
    assert set(fitted.predictions(500, no_cutoff)) == {"mean"}
    cat = TrivialFit(constants={"majority": np.array([0.7, 0.2, 0.1])}).predictions(4)
    assert cat["majority"].shape == (4, 3) and np.allclose(cat["majority"][3], [0.7, 0.2, 0.1])


def test_the_guarded_blend_is_lightgbm_exactly_on_the_test_rows():
    """Guarded to w = 0, the blend a user receives is LightGBM's predictions bit for bit, numbers not rounded or
    clipped by the train targets' range, so on any test rows its paired interval against LightGBM is exactly 0."""
    y, model, gbdt = _tiny_auroc_gain(2)
    fit = fit_blend(BOOL, y, model, gbdt)
    assert fit.weight == 0.0
    y_test, model_test, gbdt_test = _tiny_auroc_gain(12)
    blended = blend_predictions(BOOL, model_test, gbdt_test, fit.weight)
    assert np.array_equal(blended, gbdt_test)
    c = M.paired_bootstrap(BOOL, y_test, blended, gbdt_test)
    assert c["diff"] == 0 and c["ci_low"] == 0 and c["ci_high"] == 0
    rng = np.random.default_rng(0)  # whole-number targets: LightGBM's fractional predictions stay as they are
    t = np.round(rng.normal(100, 20, 300))
    tr = TargetRange(lo=float(t.min()), hi=float(t.max()), integer=True)
    g = t + rng.normal(0, 3, 300)
    fit = fit_blend(NUM, t, tr.apply(t + rng.normal(0, 12, 300)), g, target_range=tr)
    assert fit.best_weight == 0.05 and fit.weight == 0.0 and fit.guard == "failed"
    out = blend_predictions(NUM, tr.apply(t), g, fit.weight, tr)
    assert np.array_equal(out, g) and not np.array_equal(out, tr.apply(g))
    assert fit.scores["LightGBM"] == pytest.approx(M.headline_value(NUM, t, g))  # LightGBM scored as it is
    c = M.paired_bootstrap(NUM, t, out, g)
    assert c["diff"] == 0 and c["ci_low"] == 0 and c["ci_high"] == 0


def test_the_guarded_fit_is_deterministic():
    y, model, gbdt = _tiny_auroc_gain(2)
    assert fit_blend(BOOL, y, model, gbdt) == fit_blend(BOOL, y, model.copy(), gbdt.copy())
    assert fit_blend(BOOL, y, model, gbdt).summary() == fit_blend(BOOL, y, model, gbdt).summary()
    y, model, gbdt = _tiny_auroc_gain(4)  # an interval that only just reaches below zero: the same every time
    fits = {fit_blend(BOOL, y, model, gbdt).val_ci for _ in range(3)}
    assert len(fits) == 1


def test_blend_rounds_and_clips_numbers_as_predict_does():
    rng = TargetRange(lo=0.0, hi=10.0, integer=True)
    out = blend_predictions(NUM, np.array([1.0, 9.0, 2.0]), np.array([2.0, 12.0, 2.0]), 0.5, rng)
    assert out.tolist() == [2.0, 10.0, 2.0]  # 1.5 rounds to even, 10.5 clipped, 2 stays


def test_categorical_blend_of_different_widths_and_determinism():
    out = blend_predictions(CAT, np.array([[0.2, 0.8]]), np.array([[0.1, 0.3, 0.6]]), 0.5)
    np.testing.assert_allclose(out, [[0.15, 0.55, 0.3]])
    rng = np.random.default_rng(3)
    y, m, g = rng.normal(size=300), rng.normal(size=300), rng.normal(size=300)
    assert fit_blend(NUM, y, m, g) == fit_blend(NUM, y, m, g)


def test_only_gbdt_is_a_blend_partner():
    assert check_blend(None) is None and check_blend("gbdt") == "gbdt"
    with pytest.raises(ConfluenceError, match="gbdt"):
        check_blend("xgboost")


@pytest.mark.slow
def test_evaluate_with_a_blend(shop):  # noqa: F811
    from confluence.evaluation.evaluate import evaluate
    from confluence.inference.predictor import load_model
    from confluence.store import Store
    from confluence.targets import train_target_range

    store, run, _ = shop
    with pytest.raises(ConfluenceError, match="blended with gbdt"):
        evaluate(run, store, tasks=["amount"], blend="lgbm")
    model = load_model(run)
    res = evaluate(model, store, split="test", tasks=["amount", "status"], max_seeds=64, blend="gbdt",
                   keep_rows=True)
    for task, metric in (("amount", "mae"), ("status", "accuracy")):
        r = res[task]
        b, v = r["blend"], r["validation"]
        assert b["weight"] in GRID and b["n_val"] > 0 and v["weight"] == b["weight"] and v["metric"] == metric
        assert v["weight_source"] == "validation" and v["best_weight"] in GRID
        by_weight = "model" if b["weight"] == 1 else "LightGBM" if b["weight"] == 0 else "blend"
        # the floor: what the weight says is shipped where validation shows it better than the best trivial
        # baseline, else that baseline; either way the shipped predictions are scored on the evaluated rows
        assert v["trivial_name"] in r and (r["ship"] == "trivial") == (v["trivial_ci"][0] <= 0)
        assert r["ship"] in (by_weight, "trivial") and r["shipped"]["ship"] == r["ship"] == v["ship"]
        shipped = r[v["trivial_name"]] if r["ship"] == "trivial" else b  # a constant scores as its baseline
        assert r["shipped"][metric] == pytest.approx(shipped[metric], rel=1e-9)
        # the ship choice is the best validation score (ties to the model, then LightGBM) unless the guard found
        # its gain over LightGBM inside the noise: then LightGBM, and the note says so
        sign = 1 if metric == "accuracy" else -1
        best = max(sign * v["model"], sign * v["LightGBM"], sign * v["blend"])
        assert sign * v["blend"] == best
        if v.get("guard") == "failed":
            assert r["ship"] == "LightGBM" and v["val_ci"][0] <= 0 and "LightGBM alone" in v["note"]
        else:
            assert sign * v[by_weight] == best and v["weight"] == v["best_weight"]
            # passed, or waived where LightGBM was not shown better than the trivial baseline on validation
            assert v.get("guard") in (("passed", "waived") if v["best_weight"] > 0 else (None,))
            if v.get("guard") == "waived":
                assert "trivial baseline" in v["note"]
        c = r["blend_vs_gbdt"]
        assert c["diff"] == pytest.approx(b[metric] - r["gbdt"][metric], rel=1e-9, abs=1e-12)
        rows = r["rows"]
        assert rows.blend is not None and len(rows.blend) == len(rows.truth)
    # the blended rows are w * model + (1 - w) * LightGBM, clipped to the train targets' range
    rows, w = res["amount"]["rows"], res["amount"]["blend"]["weight"]
    s = Store.open(store)
    rng = train_target_range(s, "amount", rows.clip_ids)  # clip_ids: the train seeds
    np.testing.assert_allclose(rows.blend, rng.apply(w * rows.pred + (1 - w) * rows.gbdt) if w else rows.gbdt)
    assert ("note" in res["amount"]["validation"]) == (res["amount"]["validation"].get("guard") in ("failed", "waived"))
    # evaluating the validation split itself says the weight was chosen on the same rows
    on_val = evaluate(model, store, split="val", tasks=["amount"], max_seeds=64, blend="gbdt")
    assert "optimistic" in on_val["amount"]["validation"]["note"]


@pytest.mark.slow
def test_predict_with_a_blend(shop):  # noqa: F811
    from confluence.evaluation.predict import blend_summary, predict
    from confluence.inference.predictor import load_model

    store, run, tmp = shop
    model = load_model(run)
    t = predict(model, store, "buys_next_30d", split="test", max_seeds=20, blend="gbdt", out=tmp / "b.parquet")
    for col in ("gbdt_prediction", "gbdt_p_true", "blend_prediction", "blend_p_true", "blend_weight"):
        assert col in t.column_names
    s = blend_summary(t)
    assert s["ship"] in ("model", "LightGBM", "blend", "trivial") and s["weight"] in GRID
    w = s["weight"]
    np.testing.assert_allclose(t.column("blend_p_true").to_numpy(),
                               w * t.column("p_true").to_numpy() + (1 - w) * t.column("gbdt_p_true").to_numpy())
    # the trivial baseline the floor compared with (the majority: the train seeds' rate), beside them
    from confluence.inference.predictor import Predictor
    from confluence.store import Store
    from confluence.targets import decode_targets

    st = Store.open(store)
    predictor = Predictor(model, st)
    try:
        train = decode_targets(st, "buys_next_30d", predictor.seed_ids("train", "buys_next_30d"))
    finally:
        predictor.close()
    rate = float(train.values[~train.is_null].astype(bool).mean())
    assert s["trivial_name"] == "majority" and s["trivial"] == 0.5
    np.testing.assert_allclose(t.column("trivial_p_true").to_numpy(), rate)
    assert t.column("trivial_prediction").to_pylist() == [rate > 0.5] * t.num_rows
    # ad-hoc anchors with observation times: LightGBM's features are built for them too
    pacsv.write_csv(pa.table({"customer_id": [1, 2, 3],
                              "observation_time": pa.array([dt.datetime(2020, 6, 1)] * 3, pa.timestamp("us"))}),
                    tmp / "blend_anchors.csv")
    a = predict(model, store, "buys_next_30d", anchors=tmp / "blend_anchors.csv", blend="gbdt")
    assert a.num_rows == 3 and a.column("gbdt_p_true").null_count == 0
    assert blend_summary(a)["weight"] == w  # the same fit: train seeds, validation seeds


@pytest.mark.slow
def test_the_service_blends_as_predict_does(shop, caplog):  # noqa: F811
    """`serve --blend gbdt`: the blend is fitted per task at start-up (a log line each), and a request's rows carry
    the columns `predict --blend gbdt --anchors` writes, with the same values."""
    import logging

    from confluence.evaluation.predict import predict
    from confluence.serving.service import PredictionService, ServeSettings, json_rows

    store, run, tmp = shop
    with pytest.raises(ConfluenceError, match="blended with gbdt"):
        PredictionService(run, store, ServeSettings(blend="xgb"))
    with caplog.at_level(logging.INFO, logger="confluence.serving"):
        service = PredictionService(run, store, ServeSettings(blend="gbdt", warm_up=False, batch_size=8))
    try:
        assert sum("blend " in m and "ship" in m for m in caplog.messages) == 3  # a line per task
        info = next(t for t in service.tasks if t["name"] == "buys_next_30d")
        assert info["blend"]["ship"] in ("model", "LightGBM", "blend", "trivial")
        job = service.job("buys_next_30d", [1, 2, 3], ["2020-06-01T00:00:00"] * 3, None)
        got = json_rows(job.finish(service.predictor.anchor_outputs(job.task, job.rows, job.obs, context="all")))
    finally:
        service.stop()
    pacsv.write_csv(pa.table({"customer_id": [1, 2, 3], "observation_time": ["2020-06-01T00:00:00"] * 3}),
                    tmp / "serve_anchors.csv")
    want = json_rows(predict(run, store, "buys_next_30d", anchors=tmp / "serve_anchors.csv", blend="gbdt",
                             batch_size=8))
    assert [list(r) for r in got] == [list(r) for r in want]
    for g, w in zip(got, want, strict=True):
        for k in w:
            assert g[k] == pytest.approx(w[k], rel=1e-5, abs=1e-6) if isinstance(w[k], float) else g[k] == w[k], k


BLENDED = {
    "flights.dep_delay": {
        "info": {"stype": "numerical", "n_eval": 2000},
        "model": {"mae": 17.16, "r2": -2.3e-05, "n": 2000.0},
        "baseline": {"mae": 17.41, "r2": -0.13, "name": "median"},
        "gbdt": {"mae": 15.73, "r2": 0.12},
        "model_vs_gbdt": {"diff": 1.43, "ci_low": 1.05, "ci_high": 1.83, "n_boot": 1000.0, "a_not_worse": 0.0},
        "blend": {"mae": 15.21, "r2": 0.14, "n": 2000.0, "weight": 0.35, "n_val": 1800},
        "blend_vs_gbdt": {"diff": -0.52, "ci_low": -0.8, "ci_high": -0.25, "n_boot": 1000.0, "a_not_worse": 1.0},
        "validation": {"metric": "mae", "model": 17.5, "LightGBM": 16.0, "blend": 15.5, "weight": 0.35,
                       "n_val": 1800, "weight_source": "validation"},
        "ship": "blend"},
}


def test_console_results_show_the_blend_and_what_to_ship_at_80_columns():
    import contextlib
    import io

    from confluence.cli.eval_cmds import print_results

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_results(BLENDED, "db — split test")
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "blend" in text.splitlines()[2]  # the header's columns
    assert "verdict: beats trivial, worse than GBDT, blend better than GBDT" in text
    assert "gain vs GBDT, blend:  +0.52 [+0.25, +0.8]" in text
    assert "ship: blend (w = 0.35 model share; validation mae on 1,800 rows" in text


def test_report_shows_the_blend_column_and_the_ship_choice():
    from confluence.evaluation.report import metrics_table_html, render_report

    table = metrics_table_html(BLENDED)
    assert "<th>blend</th>" in table and "ship (chosen on validation)" in table and "<b>the blend</b>" in table
    assert table.index("<th>GBDT</th>") < table.index("<th>blend</th>")
    assert "blend better by (+) vs GBDT" in table and "+0.52 [+0.25, +0.8]" in table
    assert "<th>ship</th>" not in table and "<th>validation</th>" not in table  # not scorers
    assert "w × model + (1 − w) × GBDT" in render_report(BLENDED)


def _console_words(results: dict) -> str:
    """`print_results`' text of `results` (every line checked to fit 80 columns) with its whitespace collapsed."""
    import contextlib
    import io

    from confluence.cli.eval_cmds import print_results

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_results(results, "db — split test")
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    return " ".join(text.split())


def _guarded_results() -> dict:
    """`BLENDED` with a real guarded fit in `validation` (euip-like: w = 0.05 inside the noise) and one that passed."""
    import copy

    y, model, gbdt = _tiny_auroc_gain(2)
    fit = fit_blend(BOOL, y, model, gbdt)
    failed = copy.deepcopy(BLENDED["flights.dep_delay"])
    failed["info"]["stype"] = "boolean"
    failed["validation"], failed["ship"] = fit.summary(), fit.ship
    passed = copy.deepcopy(BLENDED["flights.dep_delay"])
    passed["validation"] |= {"best_weight": 0.35, "val_gain": 0.5, "val_ci": [0.25, 0.8], "guard": "passed"}
    return {"guarded": failed, "passed": passed}


def test_console_and_report_show_the_guard():
    from confluence.evaluation.report import metrics_table_html

    res = _guarded_results()
    flat = _console_words(res)
    assert "ship: LightGBM (w = 0 model share; validation auroc on 2,000 rows" in flat
    assert "blend 0.839 at w = 0.05)" in flat and "so LightGBM alone is shipped (w = 0)" in flat
    assert "interval [-0.000665, +0.00183]" in flat  # the interval that failed, once (in the note)
    assert flat.count("-0.000665") == 1
    assert "blend 15.5; gain over LightGBM +0.5 [+0.25, +0.8], guard passed)" in flat
    table = metrics_table_html(res)
    assert "<b>LightGBM</b>" in table and "at w = 0.05" in table and "LightGBM alone is shipped" in table
    assert "gain over LightGBM +0.5 [+0.25, +0.8], guard passed" in table


def _floored_results() -> dict:
    """`BLENDED` made a boolean whose blend lost to LightGBM on test while the floor shipped the majority, which
    did not: a real fit in `validation` (model and LightGBM both noise)."""
    import copy

    rng = np.random.default_rng(5)
    y = rng.random(600) < 0.3
    fit = fit_blend(BOOL, y, rng.random(600), rng.random(600), trivial=M.trivial_predictions(BOOL, y[:200], 600))
    r = copy.deepcopy(BLENDED["flights.dep_delay"])
    r["info"]["stype"] = "boolean"
    r["model"], r["baseline"], r["gbdt"] = {"auroc": 0.46, "n": 900.0}, {"auroc": 0.5, "name": "majority"}, \
        {"auroc": 0.38}
    r["model_vs_gbdt"] = {"diff": 0.08, "ci_low": 0.03, "ci_high": 0.13, "n_boot": 1000.0, "a_not_worse": 1.0}
    r["blend"] = {"auroc": 0.37, "n": 900.0, "weight": fit.weight, "n_val": 600}
    r["blend_vs_gbdt"] = {"diff": -0.01, "ci_low": -0.02, "ci_high": -0.003, "n_boot": 1000.0, "a_not_worse": 0.0}
    r["shipped"] = {"auroc": 0.5, "n": 900.0, "ship": "trivial"}
    r["shipped_vs_gbdt"] = {"diff": 0.12, "ci_low": 0.08, "ci_high": 0.16, "n_boot": 1000.0, "a_not_worse": 1.0}
    r["validation"], r["ship"] = fit.summary(), fit.ship
    return {"lfn": r}


def test_console_report_and_tally_show_the_trivial_baseline_shipped():
    from confluence.bench.quality import tally
    from confluence.evaluation.report import metrics_table_html

    res = _floored_results()
    assert res["lfn"]["ship"] == "trivial"
    flat = _console_words(res)
    assert "ship: trivial baseline (majority) (w = " in flat and ", trivial (majority) 0.5" in flat
    assert "the trivial baseline is shipped" in flat
    assert "blend worse than GBDT, shipped (trivial) better than GBDT" in flat
    assert "gain vs GBDT, shipped (trivial): +0.12 [+0.08, +0.16]" in flat
    table = metrics_table_html(res)
    assert "<b>the trivial baseline (majority)</b>" in table and "<th>shipped</th>" not in table
    assert tally("db", "check", res).blend_not_worse == 1  # what --blend ships, not the blend it did not ship
    res["lfn"]["ship"] = "blend"
    assert tally("db", "check", res).blend_not_worse == 0
