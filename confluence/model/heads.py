"""Decoder heads (seed 004): all five run on every position; `ModelOutput` holds their dense outputs. The optional
copy head (`ModelConfig.copy_head`, not in the seeds) mixes into the target's prediction the values of the
context's visible cells of the target's own column, weighted by a learned pointer attention."""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from confluence.model.config import ModelConfig
from confluence.toolkit.layers import Linear


class ModelOutput(NamedTuple):
    """Dense outputs of the forward pass (seed 004). Float32 regardless of the compute dtype."""

    h: jax.Array  # [B, S, D] final hidden states (after the final RMSNorm)
    null_logits: jax.Array  # [B, S]
    num_preds: jax.Array  # [B, S] z-score scale
    bool_logits: jax.Array  # [B, S]
    ts_preds: jax.Array  # [B, S, D_time]
    cat_preds: jax.Array  # [B, S, D] in the space of `categorical_encoder`
    # copy head only (at the target cells, else None): [B, S] the gated pointer weights of the categorical copy
    # distribution, summing to its gate (0 where nothing can be copied); `categorical_logits` mixes it in
    cat_copy: jax.Array | None = None


class DecoderHeads(eqx.Module):
    null_head: Linear
    numerical_decoder: Linear
    boolean_decoder: Linear
    timestamp_decoder: Linear
    categorical_decoder: Linear

    def __init__(self, cfg: ModelConfig, *, key: jax.Array):
        k = jax.random.split(key, 5)
        d = cfg.d_model
        self.null_head = Linear(d, 1, key=k[0])
        self.numerical_decoder = Linear(d, 1, key=k[1])
        self.boolean_decoder = Linear(d, 1, key=k[2])
        self.timestamp_decoder = Linear(d, cfg.d_time, key=k[3])
        self.categorical_decoder = Linear(d, d, key=k[4])

    def __call__(self, h: jax.Array) -> ModelOutput:
        f32 = jax.numpy.float32
        return ModelOutput(
            h=h.astype(f32),
            null_logits=self.null_head(h)[..., 0].astype(f32),
            num_preds=self.numerical_decoder(h)[..., 0].astype(f32),
            bool_logits=self.boolean_decoder(h)[..., 0].astype(f32),
            ts_preds=self.timestamp_decoder(h).astype(f32),
            cat_preds=self.categorical_decoder(h).astype(f32),
        )


# probability clip of the mixed boolean prediction before it is turned back into a logit
_BOOL_EPS = 1e-6
# width (in units of pointer weight) of the step that picks the weighted median in `soft_weighted_median`
MEDIAN_SOFTNESS = 0.01


def soft_weighted_median(x: jax.Array, w: jax.Array, tau: float = MEDIAN_SOFTNESS) -> jax.Array:
    """The weighted median of `x` [B, S] under weights `w` [B, S] (>= 0, summing to 1 or all 0) along the last
    axis, smoothed so that its gradient reaches the weights.

    Ordered by value (ties by position), cell i owns the interval [lo_i, hi_i) of the cumulative weight; the
    weighted median is the value whose interval holds 1/2. Here each cell gets the share
    `sigmoid((1/2 - lo_i) / tau) - sigmoid((1/2 - hi_i) / tau)` of a logistic step at 1/2 (the shares sum to about
    1; zero-weight cells get none), and the result is the share-weighted mean: the exact weighted median as
    `tau -> 0`, the mean of the two middle values when 1/2 falls on a boundary. Dense [B, S, S] comparisons, no
    sort: S is a context's length. Rows whose weights are all 0 give 0."""
    f32 = jnp.float32
    x = x.astype(f32)
    w = w.astype(f32)
    s = x.shape[-1]
    idx = jnp.arange(s)
    # before[b, i, j]: cell j comes before cell i in the value order
    before = (x[:, None, :] < x[:, :, None]) | ((x[:, None, :] == x[:, :, None]) & (idx[None, :] < idx[:, None]))
    lo = jnp.einsum("bij,bj->bi", before.astype(f32), w, precision=jax.lax.Precision.HIGHEST)
    hi = lo + w
    half = 0.5 * jnp.sum(w, axis=-1, keepdims=True)
    share = jax.nn.sigmoid((half - lo) / tau) - jax.nn.sigmoid((half - hi) / tau)
    total = jnp.sum(share, axis=-1)
    return jnp.sum(share * x, axis=-1) / jnp.where(total > 0, total, 1.0)


class CopyHead(eqx.Module):
    """A pointer from the target cell to the context's visible cells of the same column and type (the labels of
    labelled task rows, the column's other values in the walk), mixed into each typed prediction by a learned gate.

    Pointer-generator form (See et al. 2017): `pred = (1 - g) * head(h_t) + g * sum_j a_j value_j` for numbers
    (z-scores; with `numbers="median"` the weighted median of the values under `a` instead) and timestamps (their
    15 features), the same mixture of probabilities for booleans and categories;
    `a = softmax(q(h_t) . k(h_j) / sqrt(D))` over the eligible cells, `g = sigmoid(gate(h_t))` per type and 0 when
    no cell is eligible. Copying a label's answer then needs one attention and one gate, the same in every
    database, where the generating heads must map a context value through the model's weights to an output
    direction (measured: zero-shot, a categorical head that does not copy answers a class no label has;
    docs/learnability.md). It reads only cells the model already sees, so it adds no leakage path."""

    query: Linear
    key: Linear
    gate: Linear  # D -> 4 gates, in LOSS_STYPES order: numerical, boolean, timestamp, categorical
    numbers: Literal["mean", "median"] = eqx.field(static=True)  # what is copied of numbers (ModelConfig)

    def __init__(self, d: int, *, numbers: Literal["mean", "median"] = "mean", key: jax.Array):
        if numbers not in ("mean", "median"):
            raise ValueError(f"CopyHead numbers must be 'mean' or 'median', got {numbers!r}")
        k = jax.random.split(key, 3)
        self.numbers = numbers
        self.query = Linear(d, d, key=k[0])
        self.key = Linear(d, d, key=k[1])
        self.gate = Linear(d, 4, key=k[2], init="normal", scale=0.1)

    def __call__(self, out: ModelOutput, hn: jax.Array, hn_t: jax.Array, inputs: dict[str, jax.Array]) -> ModelOutput:
        """`out`: the heads at the target cells ([B] fields); `hn` [B, S, D] and `hn_t` [B, D]: the final-normed
        hidden states of every cell and of the target cell. Returns `out` with the mixtures applied."""
        f32 = jnp.float32
        is_target = inputs["is_target"]
        t = jnp.argmax(is_target, axis=1)
        bidx = jnp.arange(t.shape[0])
        col_t = inputs["column_ids"][bidx, t]
        st_t = inputs["semantic_types"][bidx, t]
        eligible = (~inputs["is_padding"] & ~inputs["is_null"] & ~is_target
                    & (inputs["column_ids"] == col_t[:, None]) & (inputs["semantic_types"] == st_t[:, None]))
        q = self.query(hn_t).astype(f32)
        k = self.key(hn).astype(f32)
        scores = jnp.einsum("bd,bsd->bs", q, k) / math.sqrt(q.shape[-1])
        scores = jnp.where(eligible, scores, -1e30)
        any_el = jnp.any(eligible, axis=1)
        a = jax.nn.softmax(scores, axis=1) * eligible.astype(f32)  # all zeros where nothing is eligible
        g = jax.nn.sigmoid(self.gate(hn_t).astype(f32)) * any_el[:, None].astype(f32)  # [B, 4]
        if self.numbers == "median":
            num = soft_weighted_median(inputs["numeric_values"], a)
        else:
            num = jnp.einsum("bs,bs->b", a, inputs["numeric_values"].astype(f32))
        boo = jnp.einsum("bs,bs->b", a, inputs["bool_values"].astype(f32))
        ts = jnp.einsum("bs,bsk->bk", a, inputs["timestamp_values"].astype(f32))
        p = (1.0 - g[:, 1]) * jax.nn.sigmoid(out.bool_logits) + g[:, 1] * boo
        p = jnp.clip(p, _BOOL_EPS, 1.0 - _BOOL_EPS)
        return out._replace(
            num_preds=(1.0 - g[:, 0]) * out.num_preds + g[:, 0] * num,
            bool_logits=jnp.log(p) - jnp.log1p(-p),
            ts_preds=(1.0 - g[:, 2:3]) * out.ts_preds + g[:, 2:3] * ts,
            cat_copy=a * g[:, 3:4],
        )
