"""Layers both models build from: `Linear` ([in, out] weights), zero-centered `RMSNorm`, `SwiGLU`, initializers
and the compute-dtype cast. Equinox modules holding float32 parameters."""

from __future__ import annotations

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp

Init = Literal["xavier", "normal"]


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


class Linear(eqx.Module):
    """y = x @ weight (+ bias), `weight` [in, out] (so the optimizer sees 2-D matrices as they are applied)."""

    weight: jax.Array
    bias: jax.Array | None

    def __init__(self, fan_in: int, fan_out: int, *, key: jax.Array, use_bias: bool = True, scale: float = 1.0,
                 init: Init = "xavier"):
        self.weight = init_weight(key, fan_in, fan_out, scale, init)
        self.bias = jnp.zeros((fan_out,), jnp.float32) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x @ self.weight.astype(x.dtype)
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
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * (1.0 + self.gamma.astype(jnp.float32))).astype(x.dtype)


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
        return self.w_down(jax.nn.silu(self.w_gate(x)) * self.w_up(x))


def cast_floating(tree, dtype: jnp.dtype):
    """Cast every floating-point array leaf of `tree` to `dtype` (differentiable; non-float leaves untouched)."""

    def _cast(x):
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    return jax.tree.map(_cast, tree)
