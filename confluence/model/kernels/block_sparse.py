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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

try:  # the Triton backend: deprecated in JAX 0.11/0.12 and to be removed (docs/design/training_speed.md, "JAX versions")
    from jax.experimental.pallas import triton as plgpu
except ImportError:  # a JAX without it: the interpreter (CPU, tests) still runs; a compiled launch says why not
    plgpu = None

from confluence.errors import ConfigError
from confluence.model.attention import Attention, MaskKind
from confluence.model.config import KERNEL_HEADS, KERNEL_WARPS, kernel_launch_problems
from confluence.model.kernels.structure import BlockStructure, block_structure, check_kind

DEFAULT_BLOCK = 64
DEFAULT_HEADS = KERNEL_HEADS  # heads per program (the model's default launch: confluence.model.config)
NUM_WARPS = KERNEL_WARPS
NUM_STAGES = 2


class Launch(NamedTuple):
    """How the kernels are launched (nothing here changes what they compute): `heads` per program (a power of two
    dividing H; the programs of one tile pair's heads share its tile list, its scalar loads and its mask), Triton
    warps per program, whether to run through the Pallas interpreter, and whether every input keeps each row's
    cells contiguous (`contiguous`: the bit-window mask compiled alone instead of two word loops and a `lax.cond`)."""

    heads: int = DEFAULT_HEADS
    warps: int = NUM_WARPS
    interpret: bool = False
    contiguous: bool = False  # rows contiguous in every input (the sampler's orders): the bit-window mask only


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


WINDOW = "window"  # the word-loop variant for key tiles whose ranks span fewer than 32 * window_words(T)


def window_words(block: int) -> int:
    """32-bit words of the bit window a key tile of `block` consecutive ranks reads (`_window_mask`)."""
    return max(1, block // 32)


def _window_mask(kkey: jax.Array, bits_ref, q0: jax.Array, tq: int) -> jax.Array:
    """[Tq, Tk] visibility of a row-kind tile whose key ranks span fewer than 32 * n bits (n = `window_words`).

    Each query row's adjacency bits from the tile's lowest key rank r0 on are shifted into n window words once
    per row (n + 1 word loads, a funnel shift each), so a pair costs one select among the n words, one shift and
    one test, instead of a pass per touched word. Padding keys (rank -1) see nothing.
    """
    tk = kkey.shape[0]
    n = window_words(tk)
    last = bits_ref.shape[0] - 1
    valid = kkey >= 0
    r0 = jnp.min(jnp.where(valid, kkey, jnp.int32(2**30)))
    r0 = jnp.where(r0 == 2**30, 0, r0)  # an all-padding tile: any window, nothing is valid
    w0 = r0 >> 5
    sh = r0 & 31
    src = [bits_ref[jnp.minimum(w0 + m, last), pl.ds(q0, tq)] for m in range(n + 1)]
    win = []
    for m in range(n):
        hi = lax.shift_left(src[m + 1], jnp.where(sh == 0, 0, 32 - sh))
        win.append(lax.shift_right_logical(src[m], sh) | jnp.where(sh == 0, 0, hi))
    d = jnp.where(valid, kkey - r0, 0)
    w = jnp.broadcast_to(win[0][:, None], (tq, tk))
    for m in range(1, n):
        w = jnp.where(((d >> 5) == m)[None, :], win[m][:, None], w)
    return ((lax.shift_right_logical(w, (d & 31)[None, :]) & 1) != 0) & valid[None, :]


def _tile_mask(
    kind: MaskKind,
    qkey: jax.Array,
    kkey: jax.Array,
    bits_ref,
    q0: jax.Array,
    wlo: jax.Array,
    whi: jax.Array,
    words: int | str | None,
) -> jax.Array:
    """[Tq, Tk] visibility of one tile from the query keys / bit rows and the key labels.

    Row kinds visit the 32-bit words `wlo..whi` that the key tile's ranks touch: unrolled `words` times when the
    caller knows every tile spans at most that many (no nested loop, so Triton can pipeline the tile loop; a word
    index past `whi` is clamped into range, which only repeats hits already counted), else in a dynamic loop;
    `words = WINDOW` reads a bit window from the tile's lowest rank instead (`_window_mask`), for key tiles whose
    ranks span fewer than 32 * `window_words(T)` (rows contiguous: at most T consecutive ranks).
    """
    if kind == "column":
        return qkey[:, None] == kkey[None, :]
    tq = qkey.shape[0]
    if words == WINDOW:
        return _window_mask(kkey, bits_ref, q0, tq)
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


def _group(heads: int) -> list[int | None]:
    """The heads one program computes: `[None]` for one head (its axis squeezed away by the BlockSpec), else the
    indices `0..heads-1` into the program's block of heads."""
    return [None] if heads == 1 else list(range(heads))


def _at(g: int | None, rows=None, stat: bool = False):
    """The index of head `g`'s rows (all when `rows` is None) in a program's block: `[rows, (heads,) d]` for
    q / k / v / dO / outputs, `[(heads,) rows]` for the log-sum-exp and delta (`stat`); `g = None` is the one-head
    block whose head axis the BlockSpec squeezed away."""
    if g is None:
        return ... if rows is None else ((rows,) if stat else (rows, slice(None)))
    r = slice(None) if rows is None else rows
    return (g, r) if stat else (r, g, slice(None))


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
    words: int | str | None,
    heads: int,
):
    qt = pl.program_id(0)
    q0 = pl.multiple_of(qt * block, block)
    hs = _group(heads)
    qs = [q_ref[_at(g)] for g in hs]
    qkey = qkey_ref[pl.ds(q0, block)]
    d = qs[0].shape[-1]

    def body(n, carry):
        kt = kv_list_ref[n]
        k0 = pl.multiple_of(kt * block, block)
        kvs = [(k_ref[_at(g, pl.ds(k0, block))], v_ref[_at(g, pl.ds(k0, block))]) for g in hs]
        mask = _tile_mask(
            kind, qkey, kkey_ref[pl.ds(k0, block)], bits_ref, q0, wlo_ref[kt], whi_ref[kt], words
        )
        out = []
        for q, (k, v), (acc, m, lsum) in zip(qs, kvs, carry, strict=True):
            s = jnp.where(mask, _dot_t(q, k), -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
            p = jnp.exp(s - m_safe[:, None])
            corr = jnp.exp(m - m_safe)
            l_new = corr * lsum + jnp.sum(p, axis=-1)
            acc = corr[:, None] * acc + _dot(p.astype(v.dtype), v)
            out.append((acc, m_new, l_new))
        return tuple(out)

    init = tuple(
        (
            jnp.zeros((block, d), jnp.float32),
            jnp.full((block,), -jnp.inf, jnp.float32),
            jnp.zeros((block,), jnp.float32),
        )
        for _ in hs
    )
    res = lax.fori_loop(0, kv_cnt_ref[qt], body, init)
    for g, (acc, m, lsum) in zip(hs, res, strict=True):
        seen = lsum > 0.0
        safe = jnp.where(seen, lsum, 1.0)
        o_ref[_at(g)] = (acc / safe[:, None]).astype(o_ref.dtype)
        lse_ref[_at(g, stat=True)] = jnp.where(seen, m + jnp.log(safe), 0.0)


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
    words: int | str | None,
    heads: int,
):
    qt = pl.program_id(0)
    q0 = pl.multiple_of(qt * block, block)
    hs = _group(heads)
    qs = [q_ref[_at(g)] for g in hs]
    dos = [do_ref[_at(g)] for g in hs]
    lses = [lse_ref[_at(g, stat=True)] for g in hs]
    deltas = [delta_ref[_at(g, stat=True)] for g in hs]
    qkey = qkey_ref[pl.ds(q0, block)]

    def body(n, carry):
        kt = kv_list_ref[n]
        k0 = pl.multiple_of(kt * block, block)
        kvs = [(k_ref[_at(g, pl.ds(k0, block))], v_ref[_at(g, pl.ds(k0, block))]) for g in hs]
        mask = _tile_mask(
            kind, qkey, kkey_ref[pl.ds(k0, block)], bits_ref, q0, wlo_ref[kt], whi_ref[kt], words
        )
        out = []
        for q, do, lse, delta, (k, v), dq in zip(qs, dos, lses, deltas, kvs, carry, strict=True):
            p = jnp.where(mask, jnp.exp(_dot_t(q, k) - lse[:, None]), 0.0)
            ds = p * (_dot_t(do, v) - delta[:, None])
            out.append(dq + _dot(ds.astype(k.dtype), k))
        return tuple(out)

    init = tuple(jnp.zeros(q.shape, jnp.float32) for q in qs)
    res = lax.fori_loop(0, kv_cnt_ref[qt], body, init)
    for g, dq in zip(hs, res, strict=True):
        dq_ref[_at(g)] = dq.astype(dq_ref.dtype)


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
    words: int | str | None,
    heads: int,
):
    kt = pl.program_id(0)
    k0 = pl.multiple_of(kt * block, block)
    hs = _group(heads)
    ks = [k_ref[_at(g)] for g in hs]
    vs = [v_ref[_at(g)] for g in hs]
    kkey = kkey_ref[pl.ds(k0, block)]
    wlo = wlo_ref[kt]
    whi = whi_ref[kt]

    def body(n, carry):
        qt = q_list_ref[n]
        q0 = pl.multiple_of(qt * block, block)
        rows = pl.ds(q0, block)
        tiles = [
            (q_ref[_at(g, rows)], do_ref[_at(g, rows)], lse_ref[_at(g, rows, stat=True)],
             delta_ref[_at(g, rows, stat=True)])
            for g in hs
        ]
        mask = _tile_mask(kind, qkey_ref[pl.ds(q0, block)], kkey, bits_ref, q0, wlo, whi, words)
        out = []
        for k, v, (q, do, lse, delta), (dk, dv) in zip(ks, vs, tiles, carry, strict=True):
            p = jnp.where(mask, jnp.exp(_dot_t(q, k) - lse[:, None]), 0.0)  # [Tq, Tk]
            dv = dv + _dot(p.astype(do.dtype).T, do)
            ds = p * (_dot_t(do, v) - delta[:, None])
            dk = dk + _dot(ds.astype(q.dtype).T, q)
            out.append((dk, dv))
        return tuple(out)

    init = tuple((jnp.zeros(k.shape, jnp.float32), jnp.zeros(k.shape, jnp.float32)) for k in ks)
    res = lax.fori_loop(0, q_cnt_ref[kt], body, init)
    for g, (dk, dv) in zip(hs, res, strict=True):
        dk_ref[_at(g)] = dk.astype(dk_ref.dtype)
        dv_ref[_at(g)] = dv.astype(dv_ref.dtype)


def _specs(st: BlockStructure, sp: int, block: int) -> list[pl.BlockSpec]:
    """BlockSpecs of (tile list, counts, wlo, whi, qkey, kkey, bits) for a grid (tile, batch, head group)."""
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


def _heads_dim(heads: int) -> int | None:
    """Block size of the head axis: squeezed (None) for one head per program, else the group."""
    return None if heads == 1 else heads


def _tile_spec(block: int, d: int, heads: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, block, _heads_dim(heads), d), lambda t, b, h: (b, t, h, 0))


def _full_spec(sp: int, d: int, heads: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, sp, _heads_dim(heads), d), lambda t, b, h: (b, 0, h, 0))


def _stat_tile_spec(block: int, heads: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, _heads_dim(heads), block), lambda t, b, h: (b, h, t))


def _stat_full_spec(sp: int, heads: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, _heads_dim(heads), sp), lambda t, b, h: (b, h, 0))


NO_TRITON = (f"the block-sparse kernel needs Pallas's Triton backend, which JAX {jax.__version__} does not ship "
             "(jax.experimental.pallas.triton); use 'reference' (or 'auto', which falls back to it) or a JAX that "
             "still has the backend (0.10 to 0.12)")


def triton_available() -> bool:
    """Whether this JAX still ships Pallas's Triton backend, which the compiled kernel needs."""
    return plgpu is not None


def _params(warps: int, interpret: bool) -> Any:
    """Triton's launch settings; without the backend the interpreter runs with none, a compiled launch stops."""
    if plgpu is None:
        if interpret:
            return None
        raise ConfigError("model.attention_impl", NO_TRITON)
    return plgpu.CompilerParams(num_warps=warps, num_stages=NUM_STAGES)


def _dispatch(st: BlockStructure, kind: MaskKind, call: Callable[[int | str | None], Callable], *operands,
              contiguous: bool = False):
    """`call(words)(*operands)`, with the word loop unrolled when every key tile spans few enough words.

    Row ranks are contiguous per row after the sampler's permutations, so a tile of T positions spans at most
    T consecutive ranks, i.e. at most T/32 + 1 words: the unrolled variant is the normal case. Without
    `contiguous`, arbitrary orders fall back to the dynamic loop (both variants are compiled; `lax.cond` picks one
    on the device). With it only the bit-window variant (`_window_mask`) is compiled and run, and should an input
    break the promise (a key tile whose ranks span 32 * `window_words(T)` or more) its outputs are NaN (loud,
    never silently wrong).
    """
    if kind == "column":
        return call(None)(*operands)
    block = st.kkey.shape[1] // st.wlo.shape[1]
    if contiguous:
        fits = jnp.max(st.kspan) < 32 * window_words(block)
        out = call(WINDOW)(*operands)
        return jax.tree.map(lambda x: jnp.where(fits, x, jnp.asarray(jnp.nan, x.dtype)), out)
    words = fast_words(block)
    return lax.cond(jnp.max(st.whi - st.wlo) < words, call(words), call(None), *operands)


def fast_words(block: int) -> int:
    """Words a tile of `block` consecutive ranks can touch: the unroll count of the common case."""
    return max(2, block // 32 + 1)


def _forward(q, k, v, st: BlockStructure, kind: MaskKind, block: int, launch: Launch):
    bsz, sp, h, d = q.shape
    g = launch.heads
    nt = sp // block

    def call(words: int | str | None) -> Callable:
        return pl.pallas_call(
            functools.partial(_fwd_kernel, kind=kind, block=block, words=words, heads=g),
            grid=(nt, bsz, h // g),
            in_specs=[*_specs(st, sp, block), _tile_spec(block, d, g), _full_spec(sp, d, g), _full_spec(sp, d, g)],
            out_specs=[_tile_spec(block, d, g), _stat_tile_spec(block, g)],
            out_shape=[
                jax.ShapeDtypeStruct(q.shape, v.dtype),
                jax.ShapeDtypeStruct((bsz, h, sp), jnp.float32),
            ],
            compiler_params=_params(launch.warps, launch.interpret),
            interpret=launch.interpret,
            name=f"block_sparse_fwd_{kind}",
        )

    meta = (st.kv_list, st.kv_cnt, st.wlo, st.whi, st.qkey, st.kkey, st.qbits)
    return _dispatch(st, kind, call, *meta, q, k, v, contiguous=launch.contiguous)


def _backward(q, k, v, o, lse, do, st: BlockStructure, kind: MaskKind, block: int, launch: Launch):
    """dq, dk, dv from the dQ and dK/dV kernels, and the rowsum(dO * O) ([B, H, S] FP32) they were given."""
    bsz, sp, h, d = q.shape
    g = launch.heads
    nt = sp // block
    delta = jnp.einsum("bshd,bshd->bhs", o.astype(jnp.float32), do.astype(jnp.float32))
    do = do.astype(q.dtype)

    def dq_call(words: int | str | None) -> Callable:
        return pl.pallas_call(
            functools.partial(_dq_kernel, kind=kind, block=block, words=words, heads=g),
            grid=(nt, bsz, h // g),
            in_specs=[
                *_specs(st, sp, block),
                _tile_spec(block, d, g),
                _full_spec(sp, d, g),
                _full_spec(sp, d, g),
                _tile_spec(block, d, g),
                _stat_tile_spec(block, g),
                _stat_tile_spec(block, g),
            ],
            out_specs=_tile_spec(block, d, g),
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            compiler_params=_params(launch.warps, launch.interpret),
            interpret=launch.interpret,
            name=f"block_sparse_dq_{kind}",
        )

    def dkv_call(words: int | str | None) -> Callable:
        return pl.pallas_call(
            functools.partial(_dkv_kernel, kind=kind, block=block, words=words, heads=g),
            grid=(nt, bsz, h // g),
            in_specs=[
                *_specs(st, sp, block),
                _full_spec(sp, d, g),
                _tile_spec(block, d, g),
                _tile_spec(block, d, g),
                _full_spec(sp, d, g),
                _stat_full_spec(sp, g),
                _stat_full_spec(sp, g),
            ],
            out_specs=[_tile_spec(block, d, g), _tile_spec(block, d, g)],
            out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
            compiler_params=_params(launch.warps, launch.interpret),
            interpret=launch.interpret,
            name=f"block_sparse_dkv_{kind}",
        )

    common = (st.wlo, st.whi, st.qkey, st.kkey, st.qbits, q, k, v, do, lse, delta)
    dq = _dispatch(st, kind, dq_call, st.kv_list, st.kv_cnt, *common, contiguous=launch.contiguous)
    dk, dv = _dispatch(st, kind, dkv_call, st.q_list, st.q_cnt, *common, contiguous=launch.contiguous)
    return dq, dk, dv, delta


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _attend(q, k, v, st: BlockStructure, kind: MaskKind, block: int, launch: Launch):
    return _forward(q, k, v, st, kind, block, launch)[0]


def _attend_fwd(q, k, v, st, kind, block, launch):
    o, lse = _forward(q, k, v, st, kind, block, launch)
    return o, (q, k, v, o, lse, st)


def _attend_bwd(kind, block, launch, res, do):
    q, k, v, o, lse, st = res
    dq, dk, dv, _ = _backward(q, k, v, o, lse, do, st, kind, block, launch)
    return dq, dk, dv, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def _with_sink(o, lse, sink):
    """The kernel's output and log-sum-exp with a virtual key per head (logit `sink` [H], value 0) added to each
    softmax: the sum gains exp(sink), so the output shrinks by exp(lse - lse_sink)."""
    lse_s = jnp.logaddexp(lse, sink.astype(jnp.float32)[None, :, None])
    o_s = o.astype(jnp.float32) * jnp.swapaxes(jnp.exp(lse - lse_s), 1, 2)[..., None]
    return o_s.astype(o.dtype), lse_s


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attend_sink(q, k, v, sink, st: BlockStructure, kind: MaskKind, block: int, launch: Launch):
    o, lse = _forward(q, k, v, st, kind, block, launch)
    return _with_sink(o, lse, sink)[0]


def _attend_sink_fwd(q, k, v, sink, st, kind, block, launch):
    o, lse = _with_sink(*_forward(q, k, v, st, kind, block, launch), sink)
    return o, (q, k, v, o, lse, st, sink)


def _attend_sink_bwd(kind, block, launch, res, do):
    # the kernels' gradient needs only each query's probabilities exp(logit - lse) and rowsum(dO * O): given the
    # sink's lse and output, they are the sink softmax's; the sink's own logit gets p_sink * (0 - rowsum(dO * O))
    q, k, v, o, lse, st, sink = res
    dq, dk, dv, delta = _backward(q, k, v, o, lse, do, st, kind, block, launch)
    p_sink = jnp.exp(sink.astype(jnp.float32)[None, :, None] - lse)
    return dq, dk, dv, (-jnp.sum(p_sink * delta, axis=(0, 2))).astype(sink.dtype), None


_attend_sink.defvjp(_attend_sink_fwd, _attend_sink_bwd)


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


def check_launch(heads: int, warps: int, n_heads: int | None = None) -> None:
    """Raise a ValueError saying what is wrong with a launch (`kernel_launch_problems`)."""
    problems = kernel_launch_problems(heads, warps, n_heads)
    if problems:
        raise ValueError("; ".join(problem for _, problem in problems))


def attend_block_sparse(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    kind: MaskKind,
    st: BlockStructure,
    *,
    interpret: bool | None = None,
    heads: int = DEFAULT_HEADS,
    warps: int = NUM_WARPS,
    contiguous_rows: bool = False,
    sink: jax.Array | None = None,
) -> jax.Array:
    """One sublayer's attention on a structure from `block_structure` (built once per batch and kind): q / k / v
    `[B, S, H, dh]` in the sublayer's permuted order; returns `[B, S, H, dh]` in v's dtype. `sink` ([H] logits)
    adds a zero-valued virtual key per head to each softmax (`confluence.model.attention.sink_attention`). `heads` per program
    (dividing H) and `warps` per program tune the GPU launch only: the result is the same. `contiguous_rows`
    promises that each row's cells are contiguous in the permuted order (the sampler's permutations always are):
    only the bit-window mask is compiled, and an input that breaks the promise gets NaN, not a wrong answer."""
    check_kind(kind)
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one [B, S, H, dh] shape, got {q.shape}, {k.shape}, {v.shape}")
    bsz, s, h, d = q.shape
    check_launch(heads, warps, h)
    sp = st.kkey.shape[1]
    if st.kkey.shape[0] != bsz or not 0 <= sp - s < sp // st.kv_cnt.shape[1]:
        raise ValueError(f"structure of shape {st.kkey.shape} does not fit q of shape {q.shape}")
    block = sp // st.kv_cnt.shape[1]
    if interpret is None:
        interpret = default_interpret()
    dp = max(16, pl.next_power_of_2(d))
    dtype = jnp.promote_types(q.dtype, v.dtype)
    qp, kp, vp = (_pad_to(x.astype(dtype), sp, dp) for x in (q, k, v))
    launch = Launch(heads, warps, bool(interpret), bool(contiguous_rows))
    if sink is None:
        out = _attend(qp, kp, vp, st, kind, block, launch)
    else:
        out = _attend_sink(qp, kp, vp, sink, st, kind, block, launch)
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
    heads: int = DEFAULT_HEADS,
    warps: int = NUM_WARPS,
) -> jax.Array:
    """Masked attention that skips all-empty tiles; same contract as `confluence.model.attention`.

    q / k / v `[B, S, H, dh]` in the sublayer's permuted order (logits are exactly `q . k`), ids and padding
    `[B, S]` permuted alike, `fk_adj` `[B, R, R]`. Returns `[B, S, H, dh]` in v's dtype; exactly 0 for a query with
    no visible key. Differentiable in q, k, v (custom VJP with block-sparse dQ and dK/dV kernels). `block` is the
    square tile size (a power of two, at least 16); `interpret=None` runs compiled on a GPU and through the Pallas
    interpreter elsewhere; `heads` and `warps` per program tune the GPU launch (`attend_block_sparse`).
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
    return attend_block_sparse(q, k, v, kind, st, interpret=interpret, heads=heads, warps=warps)


def block_sparse(
    block: int = DEFAULT_BLOCK, interpret: bool | None = None, heads: int = DEFAULT_HEADS, warps: int = NUM_WARPS,
    contiguous_rows: bool = True,
) -> Attention:
    """The kernel as an `Attention`: the tile structure of each kind is built once per batch (`block_structure`)
    and shared by the sublayers of every layer. The model's batches keep each row's cells contiguous in the
    outbound / inbound orders (the sampler's and the synthetic batches' permutations), so by default only the
    bit-window mask is compiled (`attend_block_sparse(contiguous_rows=True)`)."""
    _check_block(block)
    check_launch(heads, warps)
    name = f"block_sparse(block={block}, interpret={interpret})"
    if (heads, warps, contiguous_rows) != (DEFAULT_HEADS, NUM_WARPS, True):
        name = (f"block_sparse(block={block}, interpret={interpret}, heads={heads}, warps={warps}, "
                f"contiguous_rows={contiguous_rows})")
    return Attention(
        name,
        lambda kind, row_ids, col_ids, is_padding, fk_adj: block_structure(
            kind, row_ids, col_ids, is_padding, fk_adj, block),
        lambda q, k, v, kind, st, sink=None: attend_block_sparse(
            q, k, v, kind, st, interpret=interpret, heads=heads, warps=warps, contiguous_rows=contiguous_rows,
            sink=sink),
    )


BLOCK_SPARSE = block_sparse()
