"""The time reference (`model.time_reference`): a timestamp's epoch predicted as a gated mix of the generating head
and a pointer's mix of the context's visible timestamps' epochs plus a finely read offset; the calendar features
stay the head's. Checked against numpy with the
pointer made uniform or sharpened onto the target's row, the offset zero or constant and the gate forced open or
shut; the target's own (blanked) cell, NULL cells and cells of other types never reach it."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from confluence.model.config import LossConfig
from confluence.model.heads import OFFSET_SCALE, SAME_ROW_RATE, hard_gate
from confluence.model.loss import target_loss
from confluence.stypes import SemanticType
from tests.fixtures.model import MAX_K, TINY, batch_to_inputs, tables, tiny_batch, tiny_db, tiny_model

REF = dataclasses.replace(TINY, time_reference=True)
TS = 1  # the tiny database's timestamp task


def _set(model, gate_bias: float, uniform: bool = True, same_row: float = 0.0, offset: float | None = 0.0):
    """`model` with the gate's bias `gate_bias` (weights 0), the same-row bias `same_row` (in logits), the offset
    decoder's output the constant `offset` (None: as initialised) and, if `uniform`, a pointer that scores every
    eligible cell alike (query and key weights 0)."""
    r = model.time_ref
    r = eqx.tree_at(lambda r: (r.gate.weight, r.gate.bias, r.same_row), r,
                    (jnp.zeros_like(r.gate.weight), jnp.full_like(r.gate.bias, gate_bias),
                     jnp.asarray(same_row / SAME_ROW_RATE, jnp.float32)))
    if offset is not None:
        r = eqx.tree_at(lambda r: (r.offset.weight, r.offset.bias), r,
                        (jnp.zeros_like(r.offset.weight), jnp.full_like(r.offset.bias, offset)))
    if uniform:
        r = eqx.tree_at(lambda r: (r.query.weight, r.key.weight), r,
                        (jnp.zeros_like(r.query.weight), jnp.zeros_like(r.key.weight)))
    return eqx.tree_at(lambda m: m.time_ref, model, r)


def _run(model, seed: int = 0, edit=None, task: int = TS):
    db = tiny_db()
    col, cat = tables(db)
    inputs = batch_to_inputs(tiny_batch(db, task=task, seed=seed, b=8, s=64, r=12))
    if edit is not None:
        inputs = edit(inputs)
    out = jax.jit(lambda m, i: m.at_targets(i, col, cat))(model, inputs)
    return out, inputs


def _no_timestamps(i):
    """Inputs with every timestamp cell but the target NULL: nothing to point at, the gate closes."""
    i = dict(i)
    i["is_null"] = i["is_null"] | ((i["semantic_types"] == int(SemanticType.TIMESTAMP)) & ~i["is_target"])
    return i


def _eligible(inputs) -> np.ndarray:
    return (~inputs["is_padding"] & ~inputs["is_null"] & ~inputs["is_target"]
            & (inputs["semantic_types"] == int(SemanticType.TIMESTAMP)))


def _mean_over(el: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The mean epoch feature of the cells `el` per sequence (0 where none)."""
    w = el / np.maximum(el.sum(1, keepdims=True), 1)
    return np.einsum("bs,bs->b", w, values[..., -1].astype(np.float64))


def _with_epoch(ts: np.ndarray, epoch: np.ndarray) -> np.ndarray:
    out = np.array(ts, np.float64)
    out[:, -1] = epoch
    return out


def test_an_open_gate_gives_the_mean_of_the_visible_timestamps_plus_the_scaled_offset():
    plain = tiny_model(TINY)  # the same parameters but the time reference (its key is drawn apart)
    base, _ = _run(plain)
    for offset in (0.0, 2.0):
        out, inputs = _run(_set(tiny_model(REF), 30.0, offset=offset))
        el = _eligible(inputs)
        assert el.any(1).all() and (el.sum(1) > 1).any()
        want = _with_epoch(base.ts_preds, _mean_over(el, inputs["timestamp_values"]) + OFFSET_SCALE * offset)
        np.testing.assert_allclose(np.asarray(out.ts_preds), want, rtol=1e-5, atol=1e-5)
    # a half-open gate: the mean of the generating head and the reference
    out, inputs = _run(_set(tiny_model(REF), 0.0))
    half = 0.5 * np.asarray(base.ts_preds[:, -1], np.float64) + 0.5 * _mean_over(_eligible(inputs),
                                                                                 inputs["timestamp_values"])
    want = _with_epoch(base.ts_preds, half)
    np.testing.assert_allclose(np.asarray(out.ts_preds), want, rtol=1e-5, atol=1e-5)
    for name in ("null_logits", "num_preds", "bool_logits"):  # only timestamps move
        np.testing.assert_array_equal(np.asarray(getattr(out, name)), np.asarray(getattr(base, name)))


def test_with_the_copy_head_an_open_gate_is_still_the_whole_epoch():
    """The time reference runs after the copy head: an open gate's epoch is the reference, whatever the copy mixed
    in; the calendar features are the copy head's mixture."""
    both = dataclasses.replace(REF, copy_head=True)
    out, inputs = _run(_set(tiny_model(both), 30.0, offset=1.0))
    copy_only, _ = _run(tiny_model(dataclasses.replace(TINY, copy_head=True)))
    want = _with_epoch(copy_only.ts_preds, _mean_over(_eligible(inputs), inputs["timestamp_values"]) + OFFSET_SCALE)
    np.testing.assert_allclose(np.asarray(out.ts_preds), want, rtol=1e-5, atol=1e-5)


def test_the_gate_reaches_exactly_zero_and_one_at_finite_logits():
    g = np.asarray(hard_gate(jnp.asarray([-40.0, -3.0, 0.0, 1.0, 3.0, 40.0])))
    assert g[0] == g[1] == 0.0 and g[4] == g[5] == 1.0 and g[2] == 0.5 and 0.5 < g[3] < 1.0
    grad = jax.grad(lambda x: hard_gate(x).sum())(jnp.asarray([0.0, 5.0]))
    assert float(grad[0]) > 0 and float(grad[1]) == 0.0


def test_a_shut_gate_or_no_visible_timestamp_is_the_model_without_it():
    plain = tiny_model(TINY)
    base, _ = _run(plain)
    out, _ = _run(_set(tiny_model(REF), -40.0, uniform=False))
    np.testing.assert_allclose(np.asarray(out.ts_preds), np.asarray(base.ts_preds), rtol=1e-5, atol=1e-5)

    out, inputs = _run(_set(tiny_model(REF), 30.0), edit=_no_timestamps)
    base, _ = _run(plain, edit=_no_timestamps)
    assert not _eligible(inputs).any()
    np.testing.assert_allclose(np.asarray(out.ts_preds), np.asarray(base.ts_preds), rtol=1e-5, atol=1e-5)


def test_the_same_row_bias_points_at_the_target_rows_own_timestamps():
    """The boolean task's anchor rows hold timestamps (the timestamp task's only one is its target); the heads'
    timestamp output exists at every target, so the reference can be checked there."""
    out, inputs = _run(_set(tiny_model(REF), 30.0, same_row=60.0), task=2)
    base, _ = _run(tiny_model(TINY), task=2)
    el = _eligible(inputs)
    rows = np.arange(el.shape[0])
    row_t = inputs["seq_row_ids"][rows, inputs["is_target"].argmax(1)]
    own = el & (inputs["seq_row_ids"] == row_t[:, None])
    has = own.any(1)
    assert has.any() and (el & ~own).any(1)[has].all()  # rows with their own times and others to ignore
    want = _with_epoch(base.ts_preds, _mean_over(own, inputs["timestamp_values"]))
    np.testing.assert_allclose(np.asarray(out.ts_preds)[has], want[has], rtol=1e-5, atol=1e-5)


def test_the_pointer_reads_neither_the_target_cell_nor_null_cells():
    """Writing values into the target's blanked cell and into NULL timestamp cells leaves the reference as it was.
    With a uniform pointer and a zero offset the weights do not depend on the hidden states, so the open gate's
    prediction is the reference alone."""
    def ref(edit=None):
        return np.asarray(_run(_set(tiny_model(REF), 30.0), edit=edit)[0].ts_preds)

    _, inputs = _run(tiny_model(REF))
    hidden = (inputs["is_target"] | inputs["is_null"]) & (inputs["semantic_types"] == int(SemanticType.TIMESTAMP))
    assert (inputs["is_null"] & hidden).any()

    def scramble(i):
        i = dict(i)
        i["timestamp_values"] = np.where(hidden[..., None], 77.0, i["timestamp_values"]).astype(np.float32)
        return i

    np.testing.assert_allclose(ref(scramble), ref(), atol=1e-5)


def test_the_heads_own_epoch_keeps_the_seeds_loss_and_is_not_trained_through_the_mixture():
    """The timestamp loss is the seed's formula on the mixed prediction plus `ts_scalar_weight` x Huber of the heads'
    own epoch; the mixture's term sends no gradient into the generating heads (they learn from their own term, as
    without the reference)."""
    from confluence.model.loss import huber, timestamp_loss

    model = _set(tiny_model(REF), 0.5, uniform=False, offset=None)
    db = tiny_db()
    col, cat = tables(db)
    inputs = {k: jnp.asarray(v) for k, v in batch_to_inputs(tiny_batch(db, task=TS, b=8, s=64, r=12)).items()}
    cfg = LossConfig(max_k=MAX_K)
    out = model.at_targets(inputs, col, cat)
    assert out.ts_epoch_head is not None
    parts = target_loss(out, inputs, model.encoder, cat, cfg)
    tgt = inputs["target_timestamp"]
    per = (timestamp_loss(out.ts_preds, tgt, cfg.huber_delta, cfg.ts_scalar_weight)
           + cfg.ts_scalar_weight * huber(out.ts_epoch_head - tgt[:, -1], cfg.huber_delta))
    null = np.asarray(inputs["target_is_null"], np.float64)
    assert null.sum() < len(null)
    got = np.asarray(parts.type_loss)
    want = float(np.sum((1 - null) * np.asarray(per) * np.asarray(parts.weight)) / np.asarray(parts.weight).sum())
    np.testing.assert_allclose(got, want, rtol=1e-5)

    def mixed_only(m):  # the mixture's epoch alone: no gradient reaches the timestamp decoder
        return jnp.sum(m.at_targets(inputs, col, cat).ts_preds[:, -1])

    g = jax.grad(mixed_only)(model)
    assert float(jnp.abs(g.time_ref.offset.weight).sum()) > 0
    assert float(jnp.abs(g.heads.timestamp_decoder.weight).sum()) == 0.0
    # the pointer and gate are trained into the trunk (measured better than a detached pointer: docs/design/decisions.md)
    assert any(float(jnp.abs(x).sum()) > 0 for x in jax.tree.leaves(eqx.filter(g.blocks, eqx.is_inexact_array)))


def test_the_time_reference_trains_and_its_gradient_reaches_every_parameter():
    """The loss of the timestamp task, plus a timestamp loss at the boolean task's targets (whose rows hold other
    timestamps, so the same-row bias matters there), reaches every parameter of the pointer and the gate."""
    model = _set(tiny_model(REF), 0.0, uniform=False, same_row=0.5, offset=None)
    db = tiny_db()
    col, cat = tables(db)
    ts_inputs = batch_to_inputs(tiny_batch(db, task=TS, b=8, s=64, r=12))
    other = batch_to_inputs(tiny_batch(db, task=2, b=8, s=64, r=12))

    def loss(m):
        task = target_loss(m.at_targets(ts_inputs, col, cat), {k: jnp.asarray(v) for k, v in ts_inputs.items()},
                           m.encoder, cat, LossConfig(max_k=MAX_K)).loss
        return task + jnp.mean((m.at_targets(other, col, cat).ts_preds - 1.0) ** 2)

    grads = jax.grad(loss)(model)
    for leaf in jax.tree.leaves(eqx.filter(grads.time_ref, eqx.is_inexact_array)):
        assert np.all(np.isfinite(np.asarray(leaf))) and float(jnp.abs(leaf).sum()) > 0


def test_an_open_gate_setting_ignores_the_learned_gate_and_closes_only_without_timestamps():
    """model.time_reference_gate = "open": whatever the gate's logit, the epoch is the reference plus the offset
    where a timestamp is visible; with none visible it is the absolute head, as with the learned gate."""
    opened = dataclasses.replace(REF, time_reference_gate="open")
    plain = tiny_model(TINY)
    base, _ = _run(plain)
    out, inputs = _run(_set(tiny_model(opened), -40.0, offset=2.0))  # a shut learned gate changes nothing
    want = _with_epoch(base.ts_preds, _mean_over(_eligible(inputs), inputs["timestamp_values"]) + OFFSET_SCALE * 2.0)
    np.testing.assert_allclose(np.asarray(out.ts_preds), want, rtol=1e-5, atol=1e-5)

    out, _ = _run(_set(tiny_model(opened), 30.0), edit=_no_timestamps)
    base, _ = _run(plain, edit=_no_timestamps)
    np.testing.assert_allclose(np.asarray(out.ts_preds), np.asarray(base.ts_preds), rtol=1e-5, atol=1e-5)


WAIT = dataclasses.replace(REF, time_wait=True)


def _with_waits(ref: np.ndarray, scale: np.ndarray):
    def edit(i):
        i = dict(i)
        i["wait_ref"], i["wait_scale"] = np.asarray(ref, np.float32), np.asarray(scale, np.float32)
        return i
    return edit


def _set_wait(model, bias: float):
    r = model.time_ref
    r = eqx.tree_at(lambda r: (r.wait.weight, r.wait.bias), r,
                    (jnp.zeros_like(r.wait.weight), jnp.full_like(r.wait.bias, bias)))
    return eqx.tree_at(lambda m: m.time_ref, model, r)


def test_a_sequence_with_a_wait_is_its_reference_plus_the_wait_in_its_unit():
    """With `time_wait`, a sequence whose `wait_scale` s > 0 answers `wait_ref + s * wait(h)` whatever the pointer
    and gate say; a sequence with s = 0 answers as the model without waits (the same parameters otherwise)."""
    ref = np.linspace(-1.0, 1.0, 8)
    scale = np.array([0.0, 0.01, 0.0, 0.5, 0.002, 0.0, 1.0, 0.03])
    model = _set_wait(_set(tiny_model(WAIT), 0.0, uniform=False, offset=None), 1.5)
    out, _ = _run(model, edit=_with_waits(ref, scale))
    without, _ = _run(eqx.tree_at(lambda m: m.time_ref.wait, model, None, is_leaf=lambda x: x is None),
                      edit=_with_waits(ref, scale))
    got, plain = np.asarray(out.ts_preds[:, -1], np.float64), np.asarray(without.ts_preds[:, -1], np.float64)
    has = scale > 0
    np.testing.assert_allclose(got[has], (ref + 1.5 * scale)[has], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[~has], plain[~has])
    np.testing.assert_array_equal(np.asarray(out.ts_preds[:, :-1]), np.asarray(without.ts_preds[:, :-1]))
    np.testing.assert_array_equal(np.asarray(out.ts_epoch_scale), np.where(has, scale, 1.0).astype(np.float32))
    assert without.ts_epoch_scale is None


def test_a_waits_epoch_loss_is_read_in_its_unit():
    """The epoch term of a sequence with a wait is Huber of the error divided by its scale (a month of a 150-year
    database is a unit, not 0.003); the cyclic terms and the heads' own epoch keep their loss."""
    from confluence.model.loss import huber

    scale = np.array([0.0, 0.01, 0.0, 0.5, 0.002, 0.0, 1.0, 0.03])
    model = _set_wait(tiny_model(WAIT), 0.3)
    db = tiny_db()
    col, cat = tables(db)
    inputs = _with_waits(np.zeros(8), scale)(batch_to_inputs(tiny_batch(db, task=TS, b=8, s=64, r=12)))
    inputs = {k: jnp.asarray(v) for k, v in inputs.items()}
    cfg = LossConfig(max_k=MAX_K)
    out = model.at_targets(inputs, col, cat)
    parts = target_loss(out, inputs, model.encoder, cat, cfg)
    tgt = np.asarray(inputs["target_timestamp"], np.float64)
    pred = np.asarray(out.ts_preds, np.float64)
    unit = np.where(scale > 0, scale, 1.0)
    cyc = np.mean(np.asarray(huber(jnp.asarray(pred[:, :14] - tgt[:, :14]), cfg.huber_delta)), axis=1)
    epoch = np.asarray(huber(jnp.asarray((pred[:, 14] - tgt[:, 14]) / unit), cfg.huber_delta))
    head = np.asarray(huber(out.ts_epoch_head - inputs["target_timestamp"][:, -1], cfg.huber_delta))
    per = cyc + cfg.ts_scalar_weight * (epoch + head)
    null = np.asarray(inputs["target_is_null"], np.float64)
    w = np.asarray(parts.weight, np.float64)
    np.testing.assert_allclose(float(parts.type_loss), np.sum((1 - null) * per * w) / w.sum(), rtol=1e-5)
    # the wait decoder is trained by it
    g = jax.grad(lambda m: target_loss(m.at_targets(inputs, col, cat), inputs, m.encoder, cat, cfg).loss)(model)
    assert float(jnp.abs(g.time_ref.wait.weight).sum()) > 0
