"""Layers both models build from: `Linear` ([in, out] weights), zero-centered `RMSNorm`, `SwiGLU`, initializers
and the compute-dtype cast. Equinox modules holding float32 parameters."""

from __future__ import annotations

import functools
import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp

Init = Literal["xavier", "normal"]
# FP32 sums written as products must not run as TF32 products on a GPU
HIGHEST = jax.lax.Precision.HIGHEST


def xavier_uniform(key: jax.Array, fan_in: int, fan_out: int, scale: float = 1.0) -> jax.Array:
    """U(-a, a) with a = scale * sqrt(6 / (fan_in + fan_out)), shape [fan_in, fan_out], float32."""
    bound = scale * math.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(key, (fan_in, fan_out), jnp.float32, -bound, bound)


def normal_init(key: jax.Array, shape: tuple[int, ...], std: float = 0.02) -> jax.Array:
    return std * jax.random.normal(key, shape, jnp.float32)


def init_weight(key: jax.Array, fan_in: int, fan_out: int, scale: float = 1.0, init: Init = "xavier") -> jax.Array:
    """A [fan_in, fan_out] weight: Xavier-uniform (seed 000) or normal with std scale / sqrt(fan_in)."""
    if init == "xavier":
        return xavier_uniform(key, fan_in, fan_out, scale)
    return jax.random.normal(key, (fan_in, fan_out), jnp.float32) * (scale / math.sqrt(fan_in))


@jax.custom_vjp
def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x @ w` for `w` [in, out], in x's dtype, accumulated in FP32.

    The product is asked for in FP32 and rounded once to x's dtype, and both gradients are products of x's dtype
    with FP32 accumulation too (custom VJP). Asked for directly in BF16, XLA's CPU backend converts both operands
    to FP32, multiplies and converts back (measured 2.3x slower for [2048, 64] x [64, 256]), and autodiff makes the
    backward products FP32 x FP32; on a GPU the result is the same rounding of the same FP32 sums."""
    return _matmul(x, w)


def _matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.matmul(x, w.astype(x.dtype), preferred_element_type=jnp.float32).astype(x.dtype)


def _matmul_fwd(x, w):
    return _matmul(x, w), (x, w)


def _matmul_bwd(res, g):
    x, w = res
    g = g.astype(x.dtype)
    dx = jnp.matmul(g, w.astype(x.dtype).T, preferred_element_type=jnp.float32).astype(x.dtype)
    dw = jnp.matmul(x.reshape(-1, x.shape[-1]).T, g.reshape(-1, g.shape[-1]), preferred_element_type=jnp.float32)
    return dx, dw.astype(w.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def split(x: jax.Array, sizes: tuple[int, ...], axis: int = -1) -> tuple[jax.Array, ...]:
    """`x` cut along `axis` into consecutive parts of `sizes` (summing to that axis's length).

    Its gradient is one concatenation of the parts' gradients. Autodiff of the slices would pad each part's
    gradient to the full length and add the pads, which XLA's CPU backend runs as separate passes (measured: 28 ms
    of a 160 ms `small` training step; docs/design/decisions.md, "Training speed")."""
    return _split(x, sizes, axis)


def split_last(x: jax.Array, sizes: tuple[int, ...]) -> tuple[jax.Array, ...]:
    """`split` along the last axis."""
    return split(x, sizes, -1)


def _split(x: jax.Array, sizes: tuple[int, ...], axis: int) -> tuple[jax.Array, ...]:
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"split: sizes {sizes} do not add up to axis {axis}'s length {x.shape[axis]}")
    out, lo = [], 0
    for n in sizes:
        out.append(jax.lax.slice_in_dim(x, lo, lo + n, axis=axis))
        lo += n
    return tuple(out)


def _split_fwd(x, sizes, axis):
    return _split(x, sizes, axis), None


def _split_bwd(sizes, axis, _, g):
    return (jnp.concatenate(g, axis=axis),)


split.defvjp(_split_fwd, _split_bwd)


class Linear(eqx.Module):
    """y = x @ weight (+ bias), `weight` [in, out] (so the optimizer sees 2-D matrices as they are applied)."""

    weight: jax.Array
    bias: jax.Array | None

    def __init__(self, fan_in: int, fan_out: int, *, key: jax.Array, use_bias: bool = True, scale: float = 1.0,
                 init: Init = "xavier"):
        self.weight = init_weight(key, fan_in, fan_out, scale, init)
        self.bias = jnp.zeros((fan_out,), jnp.float32) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = matmul(x, self.weight)
        if self.bias is not None:
            y = y + self.bias.astype(y.dtype)
        return y


class RMSNorm(eqx.Module):
    """Zero-centered RMSNorm: (1 + gamma) * x / sqrt(mean(x^2) + eps), gamma initialised to 0; FP32 inside."""

    gamma: jax.Array
    eps: float = eqx.field(static=True)

    def __init__(self, dim: int, eps: float = 1e-6):
        self.gamma = jnp.zeros((dim,), jnp.float32)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.gamma, self.eps)


def row_mean(x: jax.Array) -> jax.Array:
    """Mean over the last axis (kept, size 1) of an FP32 array, as a product with a constant column: XLA's CPU
    backend runs this several times faster than a reduction over a short last axis (measured 0.18 against
    0.31 ms for an RMSNorm's forward and backward on [16, 128, 64])."""
    return jnp.matmul(x, jnp.full((x.shape[-1], 1), 1.0 / x.shape[-1], x.dtype), precision=HIGHEST)


def _rms_parts(x: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(row_mean(x32 * x32) + eps)
    return x32 * r, r


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x: jax.Array, gamma: jax.Array, eps: float) -> jax.Array:
    """(1 + gamma) * x / sqrt(mean(x^2) + eps) in x's dtype, FP32 inside.

    The gradient is written out: gamma's is a matrix-vector product over the positions, where autodiff's reduction
    became a windowed tree reduction on XLA's CPU backend (0.55 ms per norm of a [16, 128, 64] batch, against
    0.05 ms)."""
    y, _ = _rms_parts(x, eps)
    return (y * (1.0 + gamma.astype(jnp.float32))).astype(x.dtype)


def _rms_fwd(x, gamma, eps):
    return rms_norm(x, gamma, eps), (x, gamma)


def _rms_bwd(eps, res, g):
    x, gamma = res
    y, r = _rms_parts(x, eps)
    g32 = g.astype(jnp.float32)
    gy = g32 * (1.0 + gamma.astype(jnp.float32))
    dx = r * (gy - y * row_mean(gy * y))
    d = x.shape[-1]
    ones = jnp.ones((1, g32.size // d), jnp.float32)
    dgamma = jnp.matmul(ones, (g32 * y).reshape(-1, d), precision=HIGHEST)[0]
    return dx.astype(x.dtype), dgamma.astype(gamma.dtype)


rms_norm.defvjp(_rms_fwd, _rms_bwd)


class SwiGLU(eqx.Module):
    """w_down(SiLU(x w_gate) * (x w_up)), no biases; `out_scale` scales w_down's initialisation (seed 001:
    1 / sqrt(4 N_layers))."""

    w_gate: Linear
    w_up: Linear
    w_down: Linear

    def __init__(self, d_model: int, d_hidden: int, *, key: jax.Array, out_scale: float = 1.0,
                 init: Init = "xavier"):
        k = jax.random.split(key, 3)
        self.w_gate = Linear(d_model, d_hidden, key=k[0], use_bias=False, init=init)
        self.w_up = Linear(d_model, d_hidden, key=k[1], use_bias=False, init=init)
        self.w_down = Linear(d_hidden, d_model, key=k[2], use_bias=False, scale=out_scale, init=init)

    def __call__(self, x: jax.Array) -> jax.Array:
        # the gate and up projections as one matmul (one pass over x, one larger product)
        f = self.w_gate.weight.shape[1]
        gate, up = split_last(matmul(x, jnp.concatenate([self.w_gate.weight, self.w_up.weight], axis=1)), (f, f))
        return self.w_down(jax.nn.silu(gate) * up)


def cast_floating(tree, dtype: jnp.dtype):
    """Cast every floating-point array leaf of `tree` to `dtype` (differentiable; non-float leaves untouched)."""

    def _cast(x):
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    return jax.tree.map(_cast, tree)


def run_layers(layers: list, x: jax.Array, call, *, scan: bool = False, remat: bool = False) -> jax.Array:
    """`x = call(layer, x)` for each layer in order. `scan`: one `lax.scan` over the layers' stacked parameters, so XLA
    compiles the layer once instead of once per layer (compile time flat in depth; the parameters are stacked inside
    the step, their gradients come back per layer, checkpoints keep the list). Needs layers of one structure (the
    same static fields). `remat`: recompute each layer's activations in the backward pass."""
    step = eqx.filter_checkpoint(call) if remat else call
    if not scan or len(layers) < 2:
        for layer in layers:
            x = step(layer, x)
        return x
    if any(jax.tree.structure(layer) != jax.tree.structure(layers[0]) for layer in layers[1:]):
        raise ValueError("run_layers(scan=True) needs layers of one structure (equal static fields)")
    static = eqx.partition(layers[0], eqx.is_array)[1]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *[eqx.filter(layer, eqx.is_array) for layer in layers])

    def body(h, p):
        return step(eqx.combine(p, static), h), None

    return jax.lax.scan(body, x, stacked)[0]
