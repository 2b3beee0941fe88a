"""Small building blocks: Linear with [in, out] weights, zero-centered RMSNorm, initializers, dtype casting."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp


def xavier_uniform(key: jax.Array, fan_in: int, fan_out: int, scale: float = 1.0) -> jax.Array:
    """U(-a, a) with a = scale * sqrt(6 / (fan_in + fan_out)), shape [fan_in, fan_out], float32."""
    bound = scale * math.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(key, (fan_in, fan_out), jnp.float32, -bound, bound)


def normal_init(key: jax.Array, shape: tuple[int, ...], std: float = 0.02) -> jax.Array:
    return std * jax.random.normal(key, shape, jnp.float32)


class Linear(eqx.Module):
    """y = x @ weight (+ bias). `weight` is [in, out]; used for the boundary layers (encoders, heads)."""

    weight: jax.Array
    bias: jax.Array | None

    def __init__(self, fan_in: int, fan_out: int, *, key: jax.Array, use_bias: bool = True, scale: float = 1.0):
        self.weight = xavier_uniform(key, fan_in, fan_out, scale)
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


def cast_floating(tree, dtype: jnp.dtype):
    """Cast every floating-point array leaf of `tree` to `dtype` (differentiable; non-float leaves untouched)."""

    def _cast(x):
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    return jax.tree.map(_cast, tree)
