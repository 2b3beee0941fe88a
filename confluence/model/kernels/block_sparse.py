"""Block-sparse flash attention over the relational masks, in Pallas (Triton backend on GPU, interpreter on CPU).

Three kernels, each visiting only the non-empty tiles listed by `structure.block_structure`:

* forward, grid (query tile, batch, head): online softmax over the query tile's non-empty key tiles; writes the
  output and the log-sum-exp per query (FP32);
* dQ, grid (query tile, batch, head): the same key tiles again, recomputing P from the saved log-sum-exp;
* dK / dV, grid (key tile, batch, head): the transposed list, the non-empty query tiles of each key tile.

The mask of a visited tile is computed in the kernel from int32 keys and bit-packed adjacency rows (no `[B,S,S]`
mask exists anywhere). q / k / v may be bf16; logits, softmax statistics and accumulators are FP32. A query with
no visible key (empty inbound mask, padding) has an empty tile list or an all-false mask: its output is exactly 0,
its log-sum-exp is set to 0 and its gradients are 0 (no NaN anywhere).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from confluence.model.attention import Attention, MaskKind
from confluence.model.kernels.structure import BlockStructure, block_structure, check_kind

DEFAULT_BLOCK = 64
NUM_WARPS = 4
NUM_STAGES = 2


def _precision(a: jax.Array) -> lax.Precision | None:
    """FP32 operands get true FP32 products (Triton would otherwise use TF32); bf16 / f16 need no setting."""
    return lax.Precision.HIGHEST if a.dtype == jnp.float32 else None


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b with FP32 accumulation."""
    return lax.dot_general(
        a, b, (((1,), (0,)), ((), ())), precision=_precision(a), preferred_element_type=jnp.float32
    )


def _dot_t(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b.T with FP32 accumulation."""
    return lax.dot_general(
        a, b, (((1,), (1,)), ((), ())), precision=_precision(a), preferred_element_type=jnp.float32
    )


def _tile_mask(
    kind: MaskKind,
    qkey: jax.Array,
    kkey: jax.Array,
    bits_ref,
    q0: jax.Array,
    wlo: jax.Array,
    whi: jax.Array,
    words: int | None,
) -> jax.Array:
    """[Tq, Tk] visibility of one tile from the query keys / bit rows and the key labels.

    Row kinds visit the 32-bit words `wlo..whi` that the key tile's ranks touch: unrolled `words` times when the
    caller knows every tile spans at most that many (no nested loop, so Triton can pipeline the tile loop; a word
    index past `whi` is clamped into range, which only repeats hits already counted), else in a dynamic loop.
    """
    if kind == "column":
        return qkey[:, None] == kkey[None, :]
    tq = qkey.shape[0]
    kword = kkey >> 5
    kbit = kkey & 31

    def word(w, m):
        qw = bits_ref[w, pl.ds(q0, tq)]
        hit = ((qw[:, None] >> kbit[None, :]) & 1) != 0
        return m | (hit & (kword[None, :] == w))

    m = jnp.zeros((tq, kkey.shape[0]), jnp.bool_)
    if words is None:
        return lax.fori_loop(wlo, whi + 1, word, m)
    last = bits_ref.shape[0] - 1
    for i in range(words):
        m = word(jnp.minimum(wlo + i, last), m)
    return m


def _fwd_kernel(
    kv_list_ref,
    kv_cnt_ref,
    wlo_ref,
    whi_ref,
    qkey_ref,
    kkey_ref,
    bits_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    lse_ref,
    *,
    kind: MaskKind,
    block: int,
    words: int | None,
):
    qt = pl.program_id(0)
    q0 = pl.multiple_of(qt * block, block)
    q = q_ref[...]
    qkey = qkey_ref[pl.ds(q0, block)]
    d = q.shape[-1]

    def body(n, carry):
        acc, m, lsum = carry
        kt = kv_list_ref[n]
        k0 = pl.multiple_of(kt * block, block)
        k = k_ref[pl.ds(k0, block), :]
        v = v_ref[pl.ds(k0, block), :]
        mask = _tile_mask(
            kind, qkey, kkey_ref[pl.ds(k0, block)], bits_ref, q0, wlo_ref[kt], whi_ref[kt], words
        )
        s = jnp.where(mask, _dot_t(q, k), -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - m_safe[:, None])
        corr = jnp.exp(m - m_safe)
        l_new = corr * lsum + jnp.sum(p, axis=-1)
        acc = corr[:, None] * acc + _dot(p.astype(v.dtype), v)
        return acc, m_new, l_new

    init = (
        jnp.zeros((block, d), jnp.float32),
        jnp.full((block,), -jnp.inf, jnp.float32),
        jnp.zeros((block,), jnp.float32),
    )
    acc, m, lsum = lax.fori_loop(0, kv_cnt_ref[qt], body, init)
    seen = lsum > 0.0
    safe = jnp.where(seen, lsum, 1.0)
    o_ref[...] = (acc / safe[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(safe), 0.0)


def _dq_kernel(
    kv_list_ref,
    kv_cnt_ref,
    wlo_ref,
    whi_ref,
    qkey_ref,
    kkey_ref,
    bits_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dq_ref,
    *,
    kind: MaskKind,
    block: int,
    words: int | None,
):
    qt = pl.program_id(0)
    q0 = pl.multiple_of(qt * block, block)
    q = q_ref[...]
    do = do_ref[...]
    lse = lse_ref[...]
    delta = delta_ref[...]
    qkey = qkey_ref[pl.ds(q0, block)]

    def body(n, dq):
        kt = kv_list_ref[n]
        k0 = pl.multiple_of(kt * block, block)
        k = k_ref[pl.ds(k0, block), :]
        v = v_ref[pl.ds(k0, block), :]
        mask = _tile_mask(
            kind, qkey, kkey_ref[pl.ds(k0, block)], bits_ref, q0, wlo_ref[kt], whi_ref[kt], words
        )
        p = jnp.where(mask, jnp.exp(_dot_t(q, k) - lse[:, None]), 0.0)
        ds = p * (_dot_t(do, v) - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k)

    dq = lax.fori_loop(0, kv_cnt_ref[qt], body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkv_kernel(
    q_list_ref,
    q_cnt_ref,
    wlo_ref,
    whi_ref,
    qkey_ref,
    kkey_ref,
    bits_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dk_ref,
    dv_ref,
    *,
    kind: MaskKind,
    block: int,
    words: int | None,
):
    kt = pl.program_id(0)
    k0 = pl.multiple_of(kt * block, block)
    k = k_ref[...]
    v = v_ref[...]
    kkey = kkey_ref[pl.ds(k0, block)]
    wlo = wlo_ref[kt]
    whi = whi_ref[kt]

    def body(n, carry):
        dk, dv = carry
        qt = q_list_ref[n]
        q0 = pl.multiple_of(qt * block, block)
        q = q_ref[pl.ds(q0, block), :]
        do = do_ref[pl.ds(q0, block), :]
        lse = lse_ref[pl.ds(q0, block)]
        delta = delta_ref[pl.ds(q0, block)]
        mask = _tile_mask(kind, qkey_ref[pl.ds(q0, block)], kkey, bits_ref, q0, wlo, whi, words)
        p = jnp.where(mask, jnp.exp(_dot_t(q, k) - lse[:, None]), 0.0)  # [Tq, Tk]
        dv = dv + _dot(p.astype(do.dtype).T, do)
        ds = p * (_dot_t(do, v) - delta[:, None])
        dk = dk + _dot(ds.astype(q.dtype).T, q)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, q_cnt_ref[kt], body, (zeros, zeros))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _specs(st: BlockStructure, sp: int, block: int) -> list[pl.BlockSpec]:
    """BlockSpecs of (tile list, counts, wlo, whi, qkey, kkey, bits) for a grid (tile, batch, head)."""
    nt = sp // block
    w = st.qbits.shape[1]
    return [
        pl.BlockSpec((None, None, nt), lambda t, b, h: (b, t, 0)),
        pl.BlockSpec((None, nt), lambda t, b, h: (b, 0)),
        pl.BlockSpec((None, nt), lambda t, b, h: (b, 0)),
        pl.BlockSpec((None, nt), lambda t, b, h: (b, 0)),
        pl.BlockSpec((None, sp), lambda t, b, h: (b, 0)),
        pl.BlockSpec((None, sp), lambda t, b, h: (b, 0)),
        pl.BlockSpec((None, w, sp), lambda t, b, h: (b, 0, 0)),
    ]


def _tile_spec(block: int, d: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, block, None, d), lambda t, b, h: (b, t, h, 0))


def _full_spec(sp: int, d: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, sp, None, d), lambda t, b, h: (b, 0, h, 0))


def _stat_tile_spec(block: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, None, block), lambda t, b, h: (b, h, t))


def _stat_full_spec(sp: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, None, sp), lambda t, b, h: (b, h, 0))


def _params() -> plgpu.CompilerParams:
    return plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES)


def _dispatch(st: BlockStructure, kind: MaskKind, call: Callable[[int | None], Callable], *operands):
    """`call(words)(*operands)`, with the word loop unrolled when every key tile spans few enough words.

    Row ranks are contiguous per row after the sampler's permutations, so a tile of T positions spans at most
    T consecutive ranks, i.e. at most T/32 + 1 words: the unrolled variant is the normal case; arbitrary orders
    fall back to the dynamic loop (both variants are compiled; `lax.cond` picks one on the device).
    """
    if kind == "column":
        return call(None)(*operands)
    block = st.kkey.shape[1] // st.wlo.shape[1]
    words = fast_words(block)
    return lax.cond(jnp.max(st.whi - st.wlo) < words, call(words), call(None), *operands)


def fast_words(block: int) -> int:
    """Words a tile of `block` consecutive ranks can touch: the unroll count of the common case."""
    return max(2, block // 32 + 1)


def _forward(q, k, v, st: BlockStructure, kind: MaskKind, block: int, interpret: bool):
    bsz, sp, h, d = q.shape
    nt = sp // block

    def call(words: int | None) -> Callable:
        return pl.pallas_call(
            functools.partial(_fwd_kernel, kind=kind, block=block, words=words),
            grid=(nt, bsz, h),
            in_specs=[*_specs(st, sp, block), _tile_spec(block, d), _full_spec(sp, d), _full_spec(sp, d)],
            out_specs=[_tile_spec(block, d), _stat_tile_spec(block)],
            out_shape=[
                jax.ShapeDtypeStruct(q.shape, v.dtype),
                jax.ShapeDtypeStruct((bsz, h, sp), jnp.float32),
            ],
            compiler_params=_params(),
            interpret=interpret,
            name=f"block_sparse_fwd_{kind}",
        )

    meta = (st.kv_list, st.kv_cnt, st.wlo, st.whi, st.qkey, st.kkey, st.qbits)
    return _dispatch(st, kind, call, *meta, q, k, v)


def _backward(q, k, v, o, lse, do, st: BlockStructure, kind: MaskKind, block: int, interpret: bool):
    bsz, sp, h, d = q.shape
    nt = sp // block
    delta = jnp.einsum("bshd,bshd->bhs", o.astype(jnp.float32), do.astype(jnp.float32))
    do = do.astype(q.dtype)

    def dq_call(words: int | None) -> Callable:
        return pl.pallas_call(
            functools.partial(_dq_kernel, kind=kind, block=block, words=words),
            grid=(nt, bsz, h),
            in_specs=[
                *_specs(st, sp, block),
                _tile_spec(block, d),
                _full_spec(sp, d),
                _full_spec(sp, d),
                _tile_spec(block, d),
                _stat_tile_spec(block),
                _stat_tile_spec(block),
            ],
            out_specs=_tile_spec(block, d),
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            compiler_params=_params(),
            interpret=interpret,
            name=f"block_sparse_dq_{kind}",
        )

    def dkv_call(words: int | None) -> Callable:
        return pl.pallas_call(
            functools.partial(_dkv_kernel, kind=kind, block=block, words=words),
            grid=(nt, bsz, h),
            in_specs=[
                *_specs(st, sp, block),
                _full_spec(sp, d),
                _tile_spec(block, d),
                _tile_spec(block, d),
                _full_spec(sp, d),
                _stat_full_spec(sp),
                _stat_full_spec(sp),
            ],
            out_specs=[_tile_spec(block, d), _tile_spec(block, d)],
            out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
            compiler_params=_params(),
            interpret=interpret,
            name=f"block_sparse_dkv_{kind}",
        )

    common = (st.wlo, st.whi, st.qkey, st.kkey, st.qbits, q, k, v, do, lse, delta)
    dq = _dispatch(st, kind, dq_call, st.kv_list, st.kv_cnt, *common)
    dk, dv = _dispatch(st, kind, dkv_call, st.q_list, st.q_cnt, *common)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _attend(q, k, v, st: BlockStructure, kind: MaskKind, block: int, interpret: bool):
    return _forward(q, k, v, st, kind, block, interpret)[0]


def _attend_fwd(q, k, v, st, kind, block, interpret):
    o, lse = _forward(q, k, v, st, kind, block, interpret)
    return o, (q, k, v, o, lse, st)


def _attend_bwd(kind, block, interpret, res, do):
    q, k, v, o, lse, st = res
    dq, dk, dv = _backward(q, k, v, o, lse, do, st, kind, block, interpret)
    return dq, dk, dv, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def _pad_to(x: jax.Array, sp: int, dp: int) -> jax.Array:
    s, d = x.shape[1], x.shape[3]
    if s == sp and d == dp:
        return x
    return jnp.pad(x, ((0, 0), (0, sp - s), (0, 0), (0, dp - d)))


def default_interpret() -> bool:
    """Interpret (run the kernels through the Pallas interpreter) unless the default backend is a GPU."""
    return jax.default_backend() != "gpu"


def _check_block(block: int) -> None:
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")


def attend_block_sparse(
    q: jax.Array, k: jax.Array, v: jax.Array, kind: MaskKind, st: BlockStructure, *, interpret: bool | None = None
) -> jax.Array:
    """One sublayer's attention on a structure from `block_structure` (built once per batch and kind): q / k / v
    `[B, S, H, dh]` in the sublayer's permuted order; returns `[B, S, H, dh]` in v's dtype."""
    check_kind(kind)
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one [B, S, H, dh] shape, got {q.shape}, {k.shape}, {v.shape}")
    bsz, s, _, d = q.shape
    sp = st.kkey.shape[1]
    if st.kkey.shape[0] != bsz or not 0 <= sp - s < sp // st.kv_cnt.shape[1]:
        raise ValueError(f"structure of shape {st.kkey.shape} does not fit q of shape {q.shape}")
    block = sp // st.kv_cnt.shape[1]
    if interpret is None:
        interpret = default_interpret()
    dp = max(16, pl.next_power_of_2(d))
    dtype = jnp.promote_types(q.dtype, v.dtype)
    qp, kp, vp = (_pad_to(x.astype(dtype), sp, dp) for x in (q, k, v))
    out = _attend(qp, kp, vp, st, kind, block, interpret)
    return out[:, :s, :, :d].astype(v.dtype)


def block_sparse_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    kind: MaskKind,
    row_ids: jax.Array,
    col_ids: jax.Array,
    is_padding: jax.Array,
    fk_adj: jax.Array,
    *,
    block: int = DEFAULT_BLOCK,
    interpret: bool | None = None,
) -> jax.Array:
    """Masked attention that skips all-empty tiles; same contract as `confluence.model.attention`.

    q / k / v `[B, S, H, dh]` in the sublayer's permuted order (logits are exactly `q . k`), ids and padding
    `[B, S]` permuted alike, `fk_adj` `[B, R, R]`. Returns `[B, S, H, dh]` in v's dtype; exactly 0 for a query with
    no visible key. Differentiable in q, k, v (custom VJP with block-sparse dQ and dK/dV kernels). `block` is the
    square tile size (a power of two, at least 16); `interpret=None` runs compiled on a GPU and through the Pallas
    interpreter elsewhere.
    """
    check_kind(kind)
    _check_block(block)
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one [B, S, H, dh] shape, got {q.shape}, {k.shape}, {v.shape}")
    bsz, s = q.shape[:2]
    for name, x in (("row_ids", row_ids), ("col_ids", col_ids), ("is_padding", is_padding)):
        if x.shape != (bsz, s):
            raise ValueError(f"{name} must be [B={bsz}, S={s}], got {x.shape}")
    st = block_structure(kind, row_ids, col_ids, is_padding, fk_adj, block)
    return attend_block_sparse(q, k, v, kind, st, interpret=interpret)


def block_sparse(block: int = DEFAULT_BLOCK, interpret: bool | None = None) -> Attention:
    """The kernel as an `Attention`: the tile structure of each kind is built once per batch (`block_structure`)
    and shared by the sublayers of every layer."""
    _check_block(block)
    name = f"block_sparse(block={block}, interpret={interpret})"
    return Attention(
        name,
        lambda kind, row_ids, col_ids, is_padding, fk_adj: block_structure(
            kind, row_ids, col_ids, is_padding, fk_adj, block),
        lambda q, k, v, kind, st: attend_block_sparse(q, k, v, kind, st, interpret=interpret),
    )


BLOCK_SPARSE = block_sparse()
