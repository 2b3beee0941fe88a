"""Shared helpers of the kernel tests: random q/k/v and the comparison against the FP32 reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from confluence.model.attention import reference_attention
from confluence.model.kernels import block_sparse_attention


def random_qkv(seed: int, b: int, s: int, h: int, d: int, dtype=jnp.bfloat16):
    """q L2-normalised times a per-head temperature, k L2-normalised, v and an output cotangent (as the model)."""
    kq, kk, kv, kt, kd = jax.random.split(jax.random.key(seed), 5)
    q = jax.random.normal(kq, (b, s, h, d))
    k = jax.random.normal(kk, (b, s, h, d))
    temp = 2.0 + 6.0 * jax.random.uniform(kt, (h,))
    q = q / jnp.linalg.norm(q, axis=-1, keepdims=True) * temp[None, None, :, None]
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(kv, (b, s, h, d))
    do = jax.random.normal(kd, (b, s, h, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), do


def run_both(kind, struct, q, k, v, do, block: int):
    """(kernel out, kernel grads), (bf16 reference out, grads), (FP32 reference out, grads)."""
    args = tuple(jnp.asarray(x) for x in struct)

    def loss(fn, q, k, v):
        out = fn(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * do), out

    kern = jax.jit(lambda q, k, v: block_sparse_attention(q, k, v, kind, *args, block=block))
    ref = jax.jit(lambda q, k, v: reference_attention(q, k, v, kind, *args))
    results = []
    for fn, xs in (
        (kern, (q, k, v)),
        (ref, (q, k, v)),
        (ref, tuple(x.astype(jnp.float32) for x in (q, k, v))),
    ):
        (_, out), grads = jax.value_and_grad(
            lambda a, b_, c, fn=fn: loss(fn, a, b_, c), argnums=(0, 1, 2), has_aux=True
        )(*xs)
        results.append((np.asarray(out, np.float32), [np.asarray(g, np.float32) for g in grads]))
    return results


def assert_close_to_reference(results, names=("out", "dq", "dk", "dv")) -> None:
    """The kernel is as close to the FP32 reference as the bf16 reference is, up to bf16 rounding of the scale.

    The 1e-5 floor covers FP32 summation-order noise where the true value is 0 (e.g. dq of a query that sees only
    itself: the softmax is constant, so dq is 0 up to rounding).
    """
    (ko, kg), (bo, bg), (fo, fg) = results
    for name, kx, bx, fx in zip(names, [ko, *kg], [bo, *bg], [fo, *fg], strict=True):
        assert np.all(np.isfinite(kx)), f"{name}: non-finite values from the kernel"
        scale = max(float(np.max(np.abs(fx))), 1e-6)
        err_k = float(np.max(np.abs(kx - fx)))
        err_b = float(np.max(np.abs(bx - fx)))
        assert err_k <= 1.5 * err_b + 4e-3 * scale + 1e-5, (
            f"{name}: kernel err {err_k:.3g}, bf16 reference err {err_b:.3g}, scale {scale:.3g}"
        )


def random_unsorted(seed: int, b: int, s: int, r: int):
    """Arbitrary (unpermuted) ids, scattered padding, random fk_adj: no locality assumed."""
    rng = np.random.default_rng(seed)
    row = rng.integers(0, r, (b, s)).astype(np.int32)
    col = rng.integers(0, 7, (b, s)).astype(np.int32)
    pad = rng.random((b, s)) < 0.2
    adj = rng.random((b, r, r)) < 0.1
    return row, col, pad, adj
