"""The copy head (`model.copy_head`): a pointer over the context's visible cells of the target's column, mixed into
each typed prediction by a gate. Checked against numpy with the pointer made uniform and the gate forced open or
shut; the target's own (blanked) value and cells of other columns never reach it."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from confluence.model.heads import soft_weighted_median
from confluence.model.loss import categorical_logits
from tests.fixtures.model import MAX_K, TINY, batch_to_inputs, tables, tiny_batch, tiny_db, tiny_model

COPY = dataclasses.replace(TINY, copy_head=True)
NUM, TS, BOOL, CAT = 0, 1, 2, 3  # the tiny database's tasks


def _with_gate(model, bias: float, uniform: bool = True):
    """`model` with every gate's bias set to `bias` (its weights 0) and, if `uniform`, a pointer that scores every
    eligible cell alike (query and key weights and biases 0)."""
    c = model.copy
    gate = eqx.tree_at(lambda g: (g.weight, g.bias), c.gate, (jnp.zeros_like(c.gate.weight),
                                                              jnp.full_like(c.gate.bias, bias)))
    c = eqx.tree_at(lambda c: c.gate, c, gate)
    if uniform:
        c = eqx.tree_at(lambda c: (c.query.weight, c.key.weight), c,
                        (jnp.zeros_like(c.query.weight), jnp.zeros_like(c.key.weight)))
    return eqx.tree_at(lambda m: m.copy, model, c)


def _run(model, task: int, seed: int = 0, edit=None):
    db = tiny_db()
    col, cat = tables(db)
    inputs = batch_to_inputs(tiny_batch(db, task=task, seed=seed))
    if edit is not None:
        inputs = edit(inputs)
    out = jax.jit(lambda m, i: m.at_targets(i, col, cat))(model, inputs)
    logits = categorical_logits(out.cat_preds, model.encoder, cat, jnp.asarray(inputs["cat_block_start"]),
                                jnp.asarray(inputs["cat_count"]), MAX_K, out.cat_copy,
                                inputs["categorical_embed_ids"])
    return out, np.asarray(logits), inputs


def _eligible(inputs) -> np.ndarray:
    r = np.arange(inputs["is_target"].shape[0])
    pos = inputs["is_target"].argmax(1)
    col, st = inputs["column_ids"][r, pos], inputs["semantic_types"][r, pos]
    return (~inputs["is_padding"] & ~inputs["is_null"] & ~inputs["is_target"]
            & (inputs["column_ids"] == col[:, None]) & (inputs["semantic_types"] == st[:, None]))


def _mean_over(el: np.ndarray, values: np.ndarray) -> np.ndarray:
    w = el / np.maximum(el.sum(1, keepdims=True), 1)
    return np.einsum("bs,bs...->b...", w, values.astype(np.float64))


def test_an_open_gate_and_a_uniform_pointer_give_the_mean_of_the_columns_visible_values():
    model = _with_gate(tiny_model(COPY), 30.0)
    plain = tiny_model(TINY)  # the same parameters but the copy head (its key is drawn apart)
    for task, field, pred in ((NUM, "numeric_values", "num_preds"), (TS, "timestamp_values", "ts_preds")):
        out, _, inputs = _run(model, task)
        ref, _, _ = _run(plain, task)
        el = _eligible(inputs)
        has = el.any(1)
        assert has.any() and (task != NUM or (~has).any())  # NUM's batch also has sequences with nothing to copy
        got = np.asarray(getattr(out, pred))
        np.testing.assert_allclose(got[has], _mean_over(el, inputs[field])[has], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[~has], np.asarray(getattr(ref, pred))[~has], rtol=1e-5, atol=1e-5)
    out, _, inputs = _run(model, BOOL)
    el = _eligible(inputs)
    p = 1.0 / (1.0 + np.exp(-np.asarray(out.bool_logits, np.float64)))
    np.testing.assert_allclose(p[el.any(1)], np.clip(_mean_over(el, inputs["bool_values"]), 1e-6, 1 - 1e-6)[el.any(1)],
                               atol=1e-5)


def _weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    """numpy: the smallest value whose cumulative weight (in value order) reaches half the total."""
    o = np.argsort(x, kind="stable")
    c = np.cumsum(w[o])
    return float(x[o][np.searchsorted(c, 0.5 * c[-1])])


def test_soft_weighted_median_is_the_weighted_median_and_its_gradient_reaches_the_weights():
    rng = np.random.default_rng(3)
    x = rng.standard_t(2, size=(64, 40)).astype(np.float32)
    x[:, 30:] = x[:, :10]  # ties
    w = rng.random((64, 40)).astype(np.float32) * (rng.random((64, 40)) < 0.6)
    w[0] = 0.0  # nothing to copy: 0
    w /= np.maximum(w.sum(1, keepdims=True), 1e-12)
    got = np.asarray(soft_weighted_median(jnp.asarray(x), jnp.asarray(w), tau=1e-6))
    assert got[0] == 0.0
    want = np.array([_weighted_median(a, b) for a, b in zip(x[1:], w[1:], strict=True)])
    # rows where no cumulative weight sits within 1e-4 of 1/2 (float32 sums): the soft median is the median
    cum = np.cumsum(np.take_along_axis(w, np.argsort(x, axis=1, kind="stable"), axis=1), axis=1)
    clear = (np.abs(cum - 0.5) > 1e-4).all(axis=1)[1:]
    assert clear.sum() > 50
    np.testing.assert_allclose(got[1:][clear], want[clear], rtol=1e-5, atol=1e-6)
    # uniform weights over an odd count: the middle value at the default softness, within 1 % of the values'
    # spread (the logistic step leaks about 0.1 % of the weight to each neighbour)
    u = np.zeros_like(w)
    u[:, :7] = 1 / 7
    got = np.asarray(soft_weighted_median(jnp.asarray(x), jnp.asarray(u)))
    spread = x[:, :7].max(1) - x[:, :7].min(1)
    assert np.all(np.abs(got - np.median(x[:, :7], axis=1)) <= 0.01 * spread)
    # far from the mean on a skewed sample
    skew = np.array([[0.0, 0.1, 0.2, 0.3, 50.0]], np.float32)
    assert abs(float(soft_weighted_median(jnp.asarray(skew), jnp.full((1, 5), 0.2))[0]) - 0.2) < 1e-3
    g = jax.grad(lambda v: soft_weighted_median(jnp.asarray(x), v).sum())(jnp.asarray(w))
    assert np.all(np.isfinite(np.asarray(g))) and float(jnp.abs(g).sum()) > 0


def test_copy_numbers_median_copies_the_median_of_the_columns_visible_values():
    model = _with_gate(tiny_model(dataclasses.replace(COPY, copy_numbers="median")), 30.0)
    out, _, inputs = _run(model, NUM)
    el = _eligible(inputs)
    has = el.any(1)
    assert has.any()
    x = inputs["numeric_values"].astype(np.float64)
    want = np.array([np.median(x[b][el[b]]) if has[b] else 0.0 for b in range(len(has))])
    np.testing.assert_allclose(np.asarray(out.num_preds)[has], want[has], rtol=1e-3, atol=1e-3)


def test_an_unknown_copy_numbers_is_named():
    from confluence.errors import ConfigError

    with pytest.raises(ConfigError, match="copy_numbers"):
        dataclasses.replace(COPY, copy_numbers="mode")


def test_an_open_gate_gives_the_class_frequencies_of_the_visible_cells():
    model = _with_gate(tiny_model(COPY), 30.0)
    _, logits, inputs = _run(model, CAT)
    el = _eligible(inputs)
    start, count = int(inputs["cat_block_start"]), int(inputs["cat_count"])
    for b in np.flatnonzero(el.any(1)):
        classes = inputs["categorical_embed_ids"][b][el[b]].astype(int) - start
        freq = np.bincount(classes, minlength=count)[:count] / len(classes)
        np.testing.assert_allclose(np.exp(logits[b, :count]), freq, atol=1e-5)
        assert np.all(logits[b, count:] <= -1e8)


def test_a_shut_gate_is_the_model_without_the_copy_head():
    model = _with_gate(tiny_model(COPY), -40.0, uniform=False)
    plain = tiny_model(TINY)
    for task in (NUM, TS, BOOL, CAT):
        out, logits, _ = _run(model, task)
        ref, ref_logits, _ = _run(plain, task)
        for name in ("null_logits", "num_preds", "bool_logits", "ts_preds"):
            np.testing.assert_allclose(np.asarray(getattr(out, name)), np.asarray(getattr(ref, name)), rtol=1e-4,
                                       atol=1e-5, err_msg=name)
        count = max(int(_run(plain, task)[2]["cat_count"]), 1)
        np.testing.assert_allclose(jax.nn.log_softmax(ref_logits[:, :count]), logits[:, :count], atol=1e-4)


@pytest.mark.parametrize("task", [NUM, BOOL, CAT])
def test_the_pointer_reads_neither_the_target_cell_nor_other_columns(task):
    """Scrambling the (blanked) target cell's value tensors or the values of cells of other columns leaves the copy
    distribution as it was: only the eligible cells' values enter it."""
    model = _with_gate(tiny_model(COPY), 30.0)
    out, logits, inputs = _run(model, task)
    el = _eligible(inputs)

    def scramble(i):
        i = dict(i)
        other = ~el
        i["numeric_values"] = np.where(other, 123.0, i["numeric_values"]).astype(i["numeric_values"].dtype)
        i["bool_values"] = np.where(other, True, i["bool_values"])
        i["categorical_embed_ids"] = np.where(other, 1, i["categorical_embed_ids"]).astype(np.uint32)
        return i

    # with the uniform pointer the attention weights do not depend on the hidden states, so the mixture's copy
    # part must be identical; the generating part (gate ~ 1) contributes ~0
    # (sequences with nothing to copy have a shut gate: their generating heads read the whole context)
    out2, logits2, _ = _run(model, task, edit=scramble)
    has = el.any(1)
    assert has.any()
    np.testing.assert_allclose(np.asarray(out.cat_copy), np.asarray(out2.cat_copy), atol=1e-6)
    if task == NUM:
        np.testing.assert_allclose(np.asarray(out.num_preds)[has], np.asarray(out2.num_preds)[has], atol=1e-4)
    if task == BOOL:
        np.testing.assert_allclose(np.asarray(out.bool_logits)[has], np.asarray(out2.bool_logits)[has], atol=1e-3)
    if task == CAT:
        np.testing.assert_allclose(logits[has, :7], logits2[has, :7], atol=1e-4)


def test_the_copy_head_trains_and_its_gradient_reaches_every_parameter():
    from confluence.model.config import LossConfig
    from confluence.model.loss import target_loss

    model = tiny_model(COPY)
    db = tiny_db()
    col, cat = tables(db)
    # every task's batch, so that every mixture (number, timestamp, boolean, category) carries gradient: in the
    # categorical batch alone no eligible cell holds the target's class, so the loss is the same for any pointer
    # and the pointer's exact gradient is 0 (JAX 0.10 gave 5e-7 of rounding there, JAX 0.12 exactly 0)
    batches = [batch_to_inputs(tiny_batch(db, task=t)) for t in (NUM, TS, BOOL, CAT)]

    def loss(m):
        return sum(target_loss(m.at_targets(i, col, cat), {k: jnp.asarray(v) for k, v in i.items()},
                               m.encoder, cat, LossConfig(max_k=MAX_K)).loss for i in batches)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    assert np.isfinite(float(value))
    for name in ("query", "key", "gate"):
        g = getattr(grads.copy, name).weight
        # far above rounding (about 1e-6 here): a gradient that truly reaches the parameter
        assert np.all(np.isfinite(np.asarray(g))) and float(jnp.abs(g).sum()) > 1e-2, name
