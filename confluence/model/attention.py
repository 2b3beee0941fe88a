"""Attention over the three relational masks, behind one interface (seed 000 section 4, spec/training.md).

An implementation has two parts (`Attention`):

* `prepare(kind, row_ids, col_ids, is_padding, fk_adj) -> prepared`: what every sublayer of one kind needs besides
  q / k / v (a mask, tile lists). It depends only on the batch, so the model calls it once per batch and kind,
  not once per layer;
* `attend(q, k, v, kind, prepared) -> out`: one sublayer's attention. The two built-in implementations also take
  `sink=` ([H] logits of a zero-valued virtual key per head, `ModelConfig.attention_sink`; `sink_attention`).

Calling an `Attention` does both: `fn(q, k, v, kind, row_ids, col_ids, is_padding, fk_adj) -> out`, the one-call
form the tests and benchmarks use. Attention is equivariant under a permutation of the positions, so the sublayer
permutations of seed 000 (which cluster visible pairs into tiles) matter only to a block-sparse kernel: an
implementation with `permuted = False` (the dense reference) gets q / k / v and the ids in the batch's own order and
the model skips the permute / unpermute gathers. Shapes:

* `q`, `k`, `v`: [B, S, H, dh] already gathered into the sublayer's permuted order (`permuted = True`). `q` is already L2-normalised
  and multiplied by the learned per-head temperature, `k` is L2-normalised: logits are exactly `q . k`.
* `kind`: "outbound" | "inbound" | "column".
* `row_ids`, `col_ids` (int32) and `is_padding` (bool): [B, S], permuted the same way as q / k / v.
* `fk_adj`: [B, R, R] bool, indexed by sequence-local row id (not permuted).
* returns [B, S, H, dh] in the same permuted order; a query with no visible key gets exactly 0 (no NaN).

Masks (all AND-ed with ~pad[i] and ~pad[j]):
    outbound[i, j] = row[i] == row[j] or fk_adj[row[i], row[j]]
    inbound[i, j]  = fk_adj[row[j], row[i]]
    column[i, j]   = col[i] == col[j]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp

from confluence.errors import ConfigError
from confluence.model.config import KERNEL_HEADS, KERNEL_WARPS

MaskKind = Literal["outbound", "inbound", "column"]
MASK_KINDS: tuple[MaskKind, ...] = ("outbound", "inbound", "column")

AttentionFn = Callable[..., jax.Array]  # fn(q, k, v, kind, row_ids, col_ids, is_padding, fk_adj) -> out


@dataclass(frozen=True)
class Attention:
    """An attention implementation: `prepare` once per batch and kind, `attend` per sublayer (module doc)."""

    name: str
    prepare: Callable[..., Any]  # (kind, row_ids, col_ids, is_padding, fk_adj) -> prepared (a pytree)
    attend: Callable[..., jax.Array]  # (q, k, v, kind, prepared) -> out
    permuted: bool = True  # wants the sublayer's permuted order (False: any order, the model passes its own)

    def __call__(self, q, k, v, kind: MaskKind, row_ids, col_ids, is_padding, fk_adj) -> jax.Array:
        return self.attend(q, k, v, kind, self.prepare(kind, row_ids, col_ids, is_padding, fk_adj))

    @classmethod
    def from_function(cls, name: str, fn: AttentionFn) -> Attention:
        """A one-call function as an `Attention` whose `prepare` only passes the ids through (without sinks)."""

        def attend(q, k, v, kind, ids, sink=None):
            if sink is not None:
                raise ValueError(f"attention implementation {name!r} has no attention sinks; model.attention_sink "
                                 "needs attention_impl 'reference' or 'block_sparse'")
            return fn(q, k, v, kind, *ids)

        return cls(name, lambda kind, *ids: ids, attend)


def dense_mask(
    kind: MaskKind, row_ids: jax.Array, col_ids: jax.Array, is_padding: jax.Array, fk_adj: jax.Array
) -> jax.Array:
    """The [B, S, S] boolean mask of one sublayer. Used only by the reference path (and tests)."""
    if kind == "column":
        m = col_ids[:, :, None] == col_ids[:, None, :]
    else:
        # A[row[i], row[j]] for the kind's row adjacency A, as one-hot(row) A one-hot(row)^T: two small batched
        # matmuls of exact 0 / 1 counts instead of a gather per (i, j) pair
        r = fk_adj.shape[1]
        if kind == "outbound":
            adj = fk_adj | jnp.eye(r, dtype=bool)[None]
        elif kind == "inbound":
            adj = jnp.swapaxes(fk_adj, 1, 2)
        else:
            raise ValueError(f"unknown attention kind {kind!r}; expected one of {MASK_KINDS}")
        onehot = jax.nn.one_hot(row_ids, r, dtype=jnp.bfloat16)  # a row id outside [0, R) sees nothing
        reach = jnp.einsum("bir,brs->bis", onehot, adj.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
        m = jnp.einsum("bis,bjs->bij", reach.astype(jnp.bfloat16), onehot, preferred_element_type=jnp.float32) > 0.5
    valid = ~is_padding
    return m & valid[:, :, None] & valid[:, None, :]


def _masked_logits(q: jax.Array, k: jax.Array, mask: jax.Array) -> jax.Array:
    """FP32 logits `q . k` ([B, H, S, S]), -inf where the mask hides the key."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    return jnp.where(mask[:, None, :, :], logits, -jnp.inf)


def _weights(q: jax.Array, k: jax.Array, mask: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """Unnormalised softmax weights `exp(q . k - rowmax)` ([B, H, S, S] in `dtype`, 0 where masked) and the inverse
    of their row sums ([B, H, S] FP32, 0 for a query that sees no key). FP32 logits and statistics."""
    logits = _masked_logits(q, k, mask)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    e = jnp.exp(logits - row_max)  # exp(-inf) = 0 at masked positions
    denom = jnp.sum(e, axis=-1)
    return e.astype(dtype), jnp.where(denom > 0, 1.0 / jnp.where(denom > 0, denom, 1.0), 0.0)


def _sink_weights(q, k, mask, sink, dtype):
    """`_weights` with a learned per-head sink (`sink`: [H] FP32 logits of a virtual key whose value is 0), plus
    the sink's own unnormalised weight ([B, H, S] FP32). Every row then has a finite maximum and a positive sum."""
    logits = _masked_logits(q, k, mask)
    s = sink.astype(jnp.float32)[None, :, None]
    row_max = jnp.maximum(jnp.max(logits, axis=-1), s)
    e = jnp.exp(logits - row_max[..., None])
    e_sink = jnp.exp(s - row_max)
    return e.astype(dtype), 1.0 / (jnp.sum(e, axis=-1) + e_sink), e_sink


def _rows_scaled(x: jax.Array, inv: jax.Array) -> jax.Array:
    """x [B, S, H, dh] (FP32) times inv [B, H, S] per (query, head)."""
    return x * jnp.swapaxes(inv, 1, 2)[..., None]


def _normalised_output(e: jax.Array, inv: jax.Array, v: jax.Array) -> jax.Array:
    """The attention output from unnormalised weights and inverse row sums: (e V) * inv, in v's dtype."""
    acc = jnp.einsum("bhqk,bkhd->bqhd", e, v, preferred_element_type=jnp.float32)
    return _rows_scaled(acc, inv).astype(v.dtype)


@jax.custom_vjp
def masked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Dense masked softmax attention with a precomputed `[B, S, S]` mask; [B, S, H, dh] in v's dtype.

    Written as flash attention's algebra on dense tiles, with the gradient written out (custom VJP) instead of
    differentiated through the softmax: the forward pass keeps the unnormalised weights (in v's dtype) and the
    inverse row sums, normalises the `[B, S, H, dh]` output rather than the `[B, H, S, S]` weights, and the backward
    pass needs four passes over `[B, H, S, S]` tensors instead of the dozen that autodiff of the masked softmax
    produces (selects, converts, the max and the division each transposed)."""
    return _masked_fwd(q, k, v, mask)[0]


def _masked_fwd(q, k, v, mask):
    e, inv = _weights(q, k, mask, v.dtype)
    out = _normalised_output(e, inv, v)
    return out, (q, k, v, e, inv, out)


def _softmax_grads(q, k, v, e, inv, out, g):
    """dq, dk, dv of softmax attention from the forward's unnormalised weights `e` and inverse row sums `inv`, and
    `delta` = inv * rowsum(g * out) ([B, H, S] FP32). p = e * inv per query row; with gs = g * inv:
    dV = p^T g = e^T gs, and dS = p (dP - rowsum(p dP)) = e (gs V^T - inv * (O . g))."""
    f32 = jnp.float32
    gs = _rows_scaled(g.astype(f32), inv)
    dv = jnp.einsum("bhqk,bqhd->bkhd", e, gs.astype(e.dtype), preferred_element_type=f32)
    dps = jnp.einsum("bqhd,bkhd->bhqk", gs.astype(v.dtype), v, preferred_element_type=f32)
    delta = inv * jnp.einsum("bqhd,bqhd->bhq", g.astype(f32), out.astype(f32))
    ds = (e.astype(f32) * (dps - delta[..., None])).astype(q.dtype)
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds, k, preferred_element_type=f32)
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q, preferred_element_type=f32)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), delta


def _masked_bwd(res, g):
    q, k, v, e, inv, out = res
    return *_softmax_grads(q, k, v, e, inv, out, g)[:3], None


masked_attention.defvjp(_masked_fwd, _masked_bwd)


@jax.custom_vjp
def sink_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, sink: jax.Array) -> jax.Array:
    """`masked_attention` whose softmax also holds a virtual key per head with the learned logit `sink` ([H]) and
    value 0: out = sum_j e_j v_j / (sum_j e_j + exp(sink)). The output's size then says how much of the row
    matched (softmax alone averages); a query that sees no key gets 0."""
    return _sink_fwd(q, k, v, mask, sink)[0]


def _sink_fwd(q, k, v, mask, sink):
    e, inv, e_sink = _sink_weights(q, k, mask, sink, v.dtype)
    out = _normalised_output(e, inv, v)
    return out, (q, k, v, e, inv, e_sink, out, sink)


def _sink_bwd(res, g):
    q, k, v, e, inv, e_sink, out, sink = res
    dq, dk, dv, delta = _softmax_grads(q, k, v, e, inv, out, g)
    # the sink's value is 0, so its dP is 0 and its logit's gradient is p_sink (0 - rowsum(p dP)) = -e_sink delta
    dsink = -jnp.sum(e_sink * delta, axis=(0, 2))
    return dq, dk, dv, None, dsink.astype(sink.dtype)


sink_attention.defvjp(_sink_fwd, _sink_bwd)


def _reference_attend(q, k, v, kind, mask, sink=None):
    return masked_attention(q, k, v, mask) if sink is None else sink_attention(q, k, v, mask, sink)


def reference_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    kind: MaskKind,
    row_ids: jax.Array,
    col_ids: jax.Array,
    is_padding: jax.Array,
    fk_adj: jax.Array,
) -> jax.Array:
    """Dense masked softmax attention; FP32 logits and softmax statistics. Runs on any backend."""
    return masked_attention(q, k, v, dense_mask(kind, row_ids, col_ids, is_padding, fk_adj))


REFERENCE = Attention("reference", dense_mask, _reference_attend, permuted=False)


# --- Registry: the model picks its attention implementation by name (ModelConfig.attention_impl). ---------------
# "block_sparse" resolves lazily to `confluence.model.kernels` (imported on first use, so the model has no hard
# dependency on Pallas); other implementations can be added with `register_attention`.

_ATTENTION_IMPLS: dict[str, Attention] = {"reference": REFERENCE}
_KERNEL_LAUNCHES: dict[tuple[int, int], Attention] = {}  # the block-sparse kernel's other launches, made once each


def register_attention(name: str, impl: Attention | AttentionFn) -> None:
    """Make `impl` selectable as `attention_impl=name`: an `Attention`, or a one-call function with the signature
    of `reference_attention` (then nothing is prepared once per batch)."""
    _ATTENTION_IMPLS[name] = impl if isinstance(impl, Attention) else Attention.from_function(name, impl)


def _kernel_backend_missing() -> str | None:
    """Why this JAX cannot compile the block-sparse kernel (its Pallas Triton backend is gone), or None."""
    from confluence.model.kernels.block_sparse import NO_TRITON, triton_available

    return None if triton_available() else NO_TRITON


def get_attention(name: str, *, kernel_heads: int = KERNEL_HEADS, kernel_warps: int = KERNEL_WARPS) -> Attention:
    """Resolve an attention implementation by name; raises ValueError listing the available ones.
    "auto" is the block-sparse kernel when the default backend is a GPU and the reference elsewhere (on a GPU too,
    with a warning, where this JAX cannot compile the kernel; "block_sparse" there is a ConfigError).
    `kernel_heads` / `kernel_warps` set the block-sparse kernel's launch (heads and warps per program)."""
    on_gpu = jax.default_backend() == "gpu"
    missing = _kernel_backend_missing() if on_gpu and name in ("auto", "block_sparse") else None
    if name == "auto":
        if missing:  # slower, not broken
            warnings.warn(f"attention_impl 'auto' runs the reference attention: {missing}", RuntimeWarning,
                          stacklevel=2)
        name = "block_sparse" if on_gpu and not missing else "reference"
    if name == "block_sparse" and missing:
        raise ConfigError("model.attention_impl", missing)
    if name == "block_sparse" and name not in _ATTENTION_IMPLS:
        from confluence.model.kernels import BLOCK_SPARSE

        _ATTENTION_IMPLS[name] = BLOCK_SPARSE
    if name == "block_sparse" and (kernel_heads, kernel_warps) != (KERNEL_HEADS, KERNEL_WARPS):
        launch = (kernel_heads, kernel_warps)
        if launch not in _KERNEL_LAUNCHES:
            from confluence.model.kernels import block_sparse

            _KERNEL_LAUNCHES[launch] = block_sparse(heads=kernel_heads, warps=kernel_warps)
        return _KERNEL_LAUNCHES[launch]
    try:
        return _ATTENTION_IMPLS[name]
    except KeyError:
        raise ValueError(f"unknown attention_impl {name!r}; available: {sorted(_ATTENTION_IMPLS)}") from None
