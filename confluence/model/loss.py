"""Loss of seed 004, in FP32: per target cell `null_bce + (1 - is_null) * type_loss`, with all four type losses
computed unconditionally and selected by a one-hot of the batch's target stype (no graph break).

* numerical: Huber (delta 1) on the z-score;
* timestamp: mean of the Huber losses of the 14 cyclic components + `ts_scalar_weight` * Huber of the epoch one
  (for a "when next" task with `ModelConfig.time_wait`, of the epoch's error in the task's wait unit);
* option `numeric_loss="median"` (not the seed's default; see docs/design/decisions.md): the numerical loss becomes
  smooth L1 (`huber(e, d) / d` with a small `d = median_delta`), whose minimiser is the conditional *median*, the
  right point estimate when the headline metric is MAE (timestamps keep Huber: measured, smooth L1 on the epoch
  term doubled the demo's `flights.dep_at` MAE after 3,000 steps);
* boolean: BCE on the logit;
* categorical: cross-entropy over the target column's K categories (`categorical_encoder` applied to the block
  `[cat_block_start, cat_block_start + max_K)` of the categorical table, entries k >= K masked to -1e9) + z-loss.
Batch loss: mean over sequences that are valid (`seq_valid`) and have a target.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from confluence.model.config import LossConfig
from confluence.model.encoding import ValueEncoder
from confluence.model.heads import ModelOutput
from confluence.stypes import SemanticType

# Order of the type-loss stack (seed 004): [num, bool, ts, cat].
LOSS_STYPES = (SemanticType.NUMERICAL, SemanticType.BOOLEAN, SemanticType.TIMESTAMP, SemanticType.CATEGORICAL)
_STYPE_TO_SLOT = np.array([-1, 0, 2, 1, 3, -1, -1], np.int32)  # SemanticType value -> slot in LOSS_STYPES


class LossParts(NamedTuple):
    loss: jax.Array  # scalar batch loss
    null_loss: jax.Array  # scalar: mean null BCE over counted targets
    type_loss: jax.Array  # scalar: mean (1 - is_null) * type loss over counted targets
    per_seq: jax.Array  # [B] cell loss per sequence (0 where not counted)
    weight: jax.Array  # [B] 1.0 where the sequence counts


def huber(err: jax.Array, delta: float) -> jax.Array:
    """0.5 e^2 for |e| <= delta, delta (|e| - delta / 2) beyond."""
    return optax.losses.huber_loss(err, delta=delta)


def smooth_l1(err: jax.Array, delta: float) -> jax.Array:
    """huber(e, delta) / delta: e^2 / (2 delta) near 0, |e| - delta / 2 beyond; minimised by the median."""
    return huber(err, delta) / delta


def numeric_point_loss(err: jax.Array, cfg: LossConfig) -> jax.Array:
    """The elementwise loss of a numerical target under `cfg`."""
    if cfg.numeric_loss == "huber":
        return huber(err, cfg.huber_delta)
    if cfg.numeric_loss == "median":
        return smooth_l1(err, cfg.median_delta)
    raise ValueError(f"numeric_loss must be 'huber' or 'median', got {cfg.numeric_loss!r}")


def timestamp_loss(
    pred: jax.Array, target: jax.Array, delta: float, scalar_weight: float, epoch_scale: jax.Array | None = None,
) -> jax.Array:
    """[..., 15] -> [...]: mean Huber of the 14 cyclic components + scalar_weight * Huber of the epoch one, whose
    error is divided by `epoch_scale` [...] where given (a wait's unit: `confluence.sampler.waits`)."""
    err = pred - target
    h = huber(err, delta)
    epoch = h[..., 14] if epoch_scale is None else huber(err[..., 14] / epoch_scale, delta)
    return jnp.mean(h[..., :14], axis=-1) + scalar_weight * epoch


def categorical_logits(
    cat_pred: jax.Array, encoder: ValueEncoder, category_table: jax.Array, block_start: jax.Array, count: jax.Array,
    max_k: int, copy: jax.Array | None = None, cell_ids: jax.Array | None = None,
) -> jax.Array:
    """[B, D] predictions -> [B, max_K] logits over the target's category block; entries k >= K are -1e9.

    With the copy head's `copy` [B, S] (gated pointer weights summing to the gate g) and the cells' category rows
    `cell_ids` [B, S], the result is the log of the mixture `(1 - g) softmax(logits) + g p_copy`, where `p_copy`
    puts each pointed-at cell's weight on its class of the block."""
    category_table = jnp.asarray(category_table)
    k = jnp.arange(max_k, dtype=jnp.int32)
    rows = jnp.clip(block_start + k, 0, category_table.shape[0] - 1)
    proj = encoder.categorical_encoder(category_table[rows].astype(jnp.float32))  # [max_K, D] in FP32
    logits = cat_pred.astype(jnp.float32) @ proj.T
    valid = k < jnp.maximum(count, 1)  # K = 0 (non-categorical batch): keep one finite logit
    logits = jnp.where(valid[None, :], logits, -1e9)
    if copy is None:
        return logits
    copy = jnp.asarray(copy, jnp.float32)
    local = jnp.asarray(cell_ids).astype(jnp.int32) - block_start  # a cell's class in the block (the batch's one)
    p_copy = jnp.einsum("bs,bsk->bk", copy, jax.nn.one_hot(local, max_k, dtype=jnp.float32))
    gate = jnp.sum(copy, axis=1, keepdims=True)
    p = (1.0 - gate) * jax.nn.softmax(logits, axis=-1) + p_copy
    return jnp.where(valid[None, :], jnp.log(jnp.maximum(p, 1e-30)), -1e9)


def at_positions(out: ModelOutput, t: jax.Array) -> ModelOutput:
    """The dense outputs `[B, S, ...]` at one position per sequence `t [B]`: fields `[B, ...]`."""
    bidx = jnp.arange(t.shape[0])
    return ModelOutput(*(None if x is None else jnp.asarray(x)[bidx, t] for x in out))


def compute_loss(
    out: ModelOutput, inputs: dict[str, jax.Array], encoder: ValueEncoder, category_table: jax.Array,
    cfg: LossConfig,
) -> LossParts:
    """The batch loss of dense outputs (every position, as `RelationalTransformer.__call__` returns them): the
    target loss of their values at each sequence's target cell."""
    t = jnp.argmax(jnp.asarray(inputs["is_target"]), axis=1)
    return target_loss(at_positions(out, t), inputs, encoder, category_table, cfg)


def target_loss(
    out: ModelOutput, inputs: dict[str, jax.Array], encoder: ValueEncoder, category_table: jax.Array,
    cfg: LossConfig,
) -> LossParts:
    """The batch loss and its parts from the head outputs at each sequence's target cell (`[B]`-shaped fields,
    `RelationalTransformer.at_targets`). `encoder` must be the float32 (master) value encoder. The truth comes from
    the `[B]` target fields of `confluence.model.inputs.TARGET_FIELDS`, never from the (blanked) value tensors."""
    inputs = {k: jnp.asarray(v) for k, v in inputs.items()}
    weight = (jnp.any(inputs["is_target"], axis=1) & inputs["seq_valid"]).astype(jnp.float32)
    is_null = inputs["target_is_null"].astype(jnp.float32)

    null_loss = optax.sigmoid_binary_cross_entropy(out.null_logits, is_null)
    num_loss = numeric_point_loss(out.num_preds - inputs["target_numeric"].astype(jnp.float32), cfg)
    bool_loss = optax.sigmoid_binary_cross_entropy(out.bool_logits, inputs["target_bool"].astype(jnp.float32))
    ts_target = inputs["target_timestamp"].astype(jnp.float32)
    ts_loss = timestamp_loss(out.ts_preds, ts_target, cfg.huber_delta, cfg.ts_scalar_weight, out.ts_epoch_scale)
    if out.ts_epoch_head is not None:  # the time reference: the heads' own epoch keeps the seed's loss too
        ts_loss = ts_loss + cfg.ts_scalar_weight * huber(out.ts_epoch_head - ts_target[:, -1], cfg.huber_delta)
    start = inputs["cat_block_start"].astype(jnp.int32)
    count = inputs["cat_count"].astype(jnp.int32)
    logits = categorical_logits(out.cat_preds, encoder, category_table, start, count, cfg.max_k, out.cat_copy,
                                inputs["categorical_embed_ids"])
    target_idx = jnp.clip(inputs["target_category"].astype(jnp.int32) - start, 0, cfg.max_k - 1)
    lse = jax.nn.logsumexp(logits, axis=-1)
    ce = lse - jnp.sum(logits * jax.nn.one_hot(target_idx, cfg.max_k, dtype=logits.dtype), axis=-1)  # no scatter
    cat_loss = ce + cfg.z_loss * lse**2

    type_losses = jnp.stack([num_loss, bool_loss, ts_loss, cat_loss])  # [4, B]
    selector = jax.nn.one_hot(jnp.asarray(_STYPE_TO_SLOT)[inputs["target_stype"].astype(jnp.int32)], 4, dtype=jnp.float32)
    type_loss = (1.0 - is_null) * (selector @ type_losses)  # [B]
    per_seq = (null_loss + type_loss) * weight
    denom = jnp.maximum(jnp.sum(weight), 1.0)
    return LossParts(
        loss=jnp.sum(per_seq) / denom,
        null_loss=jnp.sum(null_loss * weight) / denom,
        type_loss=jnp.sum(type_loss * weight) / denom,
        per_seq=per_seq,
        weight=weight,
    )


def link_loss(logits: jax.Array, candidates: jax.Array, positives: jax.Array, seq_valid: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
    """A link batch's loss: per sequence the mean binary cross-entropy of its candidate rows' logits [B, R]
    (positive: the row is in the seed's answer), averaged over the valid sequences that have a candidate.
    Returns (loss, number of sequences counted). Binary, not a softmax over the candidates: the logits stay
    probabilities that rank against rows outside the context (`confluence.evaluation.links`)."""
    w = (candidates & seq_valid[:, None]).astype(jnp.float32)
    bce = optax.sigmoid_binary_cross_entropy(logits, positives.astype(jnp.float32))
    n = w.sum(axis=1)
    per_seq = (bce * w).sum(axis=1) / jnp.maximum(n, 1.0)
    counted = (n > 0).astype(jnp.float32)
    return (per_seq * counted).sum() / jnp.maximum(counted.sum(), 1.0), counted.sum()


def catalogue_loss(logits: jax.Array, truth: jax.Array, seq_valid: jax.Array, item_valid: jax.Array,
                   kind: str = "softmax") -> jax.Array:
    """The catalogue side's loss over a batch's seeds [B] and catalogue rows [M] (`truth` [B, M]: the row is in the
    seed's answer; `item_valid` [M]: a real row, not padding), averaged over the valid seeds with a positive.

    "softmax" (sampled softmax): each positive against the seed's non-answer rows, -log(e^s+ / (e^s+ + sum e^s-)),
    averaged over its positives; a score shared by every row cancels, so it learns only what tells rows apart.
    "binary": the mean binary cross-entropy over all rows, as `link_loss` (measured slower to learn, which rows
    match, docs/design/decisions.md)."""
    valid = seq_valid[:, None] & item_valid[None, :]
    pos = truth & valid
    neg = ~truth & valid
    if kind == "binary":
        w = valid.astype(jnp.float32)
        bce = optax.sigmoid_binary_cross_entropy(logits, truth.astype(jnp.float32))
        n = w.sum(axis=1)
        per_seq = (bce * w).sum(axis=1) / jnp.maximum(n, 1.0)
        counted = (n > 0).astype(jnp.float32)
    else:
        neg_lse = jax.nn.logsumexp(jnp.where(neg, logits, -1e9), axis=1, keepdims=True)  # [B, 1]; finite: no NaN
        nll = jnp.logaddexp(logits, neg_lse) - logits  # each row taken as the positive
        n_pos = pos.sum(axis=1).astype(jnp.float32)
        per_seq = jnp.where(pos, nll, 0.0).sum(axis=1) / jnp.maximum(n_pos, 1.0)
        counted = ((n_pos > 0) & neg.any(axis=1)).astype(jnp.float32)
    return (jnp.where(counted > 0, per_seq, 0.0)).sum() / jnp.maximum(counted.sum(), 1.0)
