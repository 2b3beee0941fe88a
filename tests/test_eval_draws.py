"""Context draws (`confluence.inference.draws`, `--draws`): several contexts per seed, their head outputs combined.

The combination is checked against its definition (mean probabilities, medians of numbers, mean cyclic pairs), one
draw is exactly the old single context, `draws = n` is the combination of the sampler's epochs 0..n-1 (and those
contexts differ), evaluation reports the number of draws, merged serving requests combine draws as `predict` does,
and a bad number is refused by name."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.errors import ConfluenceError
from confluence.evaluation.evaluate import evaluate
from confluence.evaluation.predict import predict, seed_prediction_table
from confluence.inference.draws import combine_draws
from confluence.inference.predictor import HeadOutputs, Predictor, load_model
from confluence.model.transformer import RelationalTransformer
from confluence.serving.batching import head_outputs
from confluence.store import Store
from confluence.targets import sigmoid, softmax
from confluence.toolkit.checkpoint import save_checkpoint
from tests.fixtures.graphs import random_store
from tests.fixtures.model import tiny_run_config

STORE_SAMPLER = {"seq_len": 48, "max_rows": 16, "row_buckets": [16], "text_buckets": [64], "width": 4}
HEADS = ("null_logit", "num_pred", "bool_logit", "ts_pred", "cat_logits")


def _heads(rng: np.random.Generator, n: int, k: int, scale: float = 3.0) -> HeadOutputs:
    return HeadOutputs(*(rng.normal(0, scale, shape).astype(np.float32)
                         for shape in ((n,), (n,), (n,), (n, 15), (n, k))))


def test_one_draw_is_returned_as_it_is():
    one = _heads(np.random.default_rng(0), 5, 3)
    assert combine_draws([one]) is one
    with pytest.raises(ValueError, match="at least one draw"):
        combine_draws([])


def test_the_combination_is_mean_probabilities_and_medians():
    rng = np.random.default_rng(1)
    draws = [_heads(rng, 7, 4) for _ in range(3)]
    got = combine_draws(draws)
    for name in ("null_logit", "bool_logit"):
        want = np.mean([sigmoid(getattr(d, name)) for d in draws], axis=0)
        np.testing.assert_allclose(sigmoid(getattr(got, name)), want, rtol=1e-5)
    np.testing.assert_allclose(softmax(got.cat_logits), np.mean([softmax(d.cat_logits) for d in draws], axis=0),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got.num_pred, np.median([d.num_pred for d in draws], axis=0).astype(np.float32))
    np.testing.assert_allclose(got.ts_pred[:, :14], np.mean([d.ts_pred[:, :14] for d in draws], axis=0), rtol=1e-6)
    np.testing.assert_array_equal(got.ts_pred[:, 14], np.median([d.ts_pred[:, 14] for d in draws], axis=0))
    for name in HEADS:
        assert getattr(got, name).dtype == np.float32 and getattr(got, name).shape == getattr(draws[0], name).shape


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 6), st.integers(0, 5), st.floats(0.1, 200.0), st.integers(0, 2**31 - 1))
def test_combined_outputs_are_finite_and_do_not_depend_on_the_draws_order(n_draws, k, scale, seed):
    """Saturated logits (a probability of 1 - 1e-80) stay finite after combining, and the draws are exchangeable."""
    rng = np.random.default_rng(seed)
    draws = [_heads(rng, 6, k, scale) for _ in range(n_draws)]
    a, b = combine_draws(draws), combine_draws(draws[::-1])
    for name in HEADS:
        x, y = getattr(a, name), getattr(b, name)
        assert np.isfinite(x).all(), name
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    p = softmax(a.cat_logits)
    if k:
        np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-6)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """A random store and the tiny model's initial parameters, its contexts showing 3 labelled rows (drawn at
    random, so contexts differ between draws)."""
    store = random_store(0)
    cfg = tiny_run_config(model={"d_t": store.d_t}, sampler={**STORE_SAMPLER, "labels": 3})
    params = eqx.filter(RelationalTransformer(cfg.model, key=jax.random.key(0)), eqx.is_inexact_array)
    path = tmp_path_factory.mktemp("draws") / "run"
    save_checkpoint(path, 0, params, None, {"config": cfg.to_dict()})
    return path, store


def test_draws_combine_the_samplers_epochs_and_draw_zero_is_the_single_context(labelled):
    path, store = labelled
    loaded = load_model(path)
    one, three = Predictor(loaded, store, batch_size=4), Predictor(loaded, store, batch_size=4, draws=3)
    try:
        differ = 0
        for task in store.tasks:
            ids = one.seed_ids("val", task.name)[:6]
            if len(ids) == 0:
                continue
            single = one.task_outputs(task.name, ids, context="val")
            epochs = [three._draw(task.name, ids, None, "val", e) for e in range(3)]
            for name in HEADS:
                np.testing.assert_array_equal(getattr(epochs[0], name), getattr(single, name))
            got = three.task_outputs(task.name, ids, context="val")
            want = combine_draws(epochs)
            for name in HEADS:
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
            again = three.task_outputs(task.name, ids, context="val")  # deterministic
            np.testing.assert_array_equal(again.null_logit, got.null_logit)
            differ += not np.array_equal(epochs[0].null_logit, epochs[1].null_logit)
        assert differ > 0  # the draws are different contexts, not one context three times
    finally:
        one.close()
        three.close()


def test_evaluate_reports_its_draws_and_merged_serving_requests_combine_them_alike(labelled):
    path, store = labelled
    res = evaluate(path, store.path, split="val", max_seeds=8, draws=2)
    assert {r["info"]["context_draws"] for r in res.values() if "model" in r} == {2}
    predictor = Predictor(load_model(path), store, batch_size=4, draws=2)
    try:
        task = store.tasks[0]
        arrays = store.task_arrays(task.name)
        ids = np.linspace(0, len(arrays.anchor_row) - 1, 5).astype(np.int64)
        rows, obs = np.asarray(arrays.anchor_row)[ids], np.asarray(arrays.obs_time)[ids]
        requests = [(rows, obs), (rows[:2].copy(), obs[:2].copy())]
        for (r, o), got in zip(requests, head_outputs(predictor, task.name, requests), strict=True):
            want = predictor.anchor_outputs(task.name, r, o)
            for name in HEADS:
                np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-6)
    finally:
        predictor.close()


def test_a_bad_number_of_draws_is_refused_by_name(labelled):
    path, store = labelled
    with pytest.raises(ConfluenceError, match=r"draws \(--draws\) must be 1 or more, not 0"):
        Predictor(load_model(path), Store.open(store.path), draws=0)
    res = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(path), "--db", str(store.path), "--draws", "0"])
    assert res.exit_code != 0 and "--draws" in res.output


def test_evaluations_kept_outputs_make_the_table_predict_writes(labelled):
    """The demo writes its predictions from the evaluate step's head outputs instead of computing them again: the
    table equals `predict --split test --max-seeds N` on the same seeds."""
    path, store = labelled
    res = evaluate(path, store.path, split="test", max_seeds=5, draws=2, keep_rows=True)
    checked = 0
    for task in store.tasks:
        rows = res[task.name].get("rows")
        if rows is None:
            continue
        got = seed_prediction_table(store, task.name, rows.seed_ids, rows.head, train_ids=rows.clip_ids)
        want = predict(path, store, task.name, split="test", max_seeds=5, draws=2)
        assert got.equals(want), task.name
        checked += 1
    assert checked > 0
