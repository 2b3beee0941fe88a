"""The model with `attention_impl="block_sparse"` matches the reference model: outputs and parameter gradients."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from confluence.errors import ConfigError
from confluence.model.attention import get_attention, register_attention
from confluence.model.inputs import batch_to_inputs
from confluence.model.kernels import BLOCK_SPARSE, block_sparse
from tests.fixtures.model import TINY, tables, tiny_batch, tiny_db, tiny_model

# (loss rtol, grad rtol, grad atol relative to the largest |grad|). The CPU runs the kernel in the Pallas
# interpreter, whose FP32-accumulated products round like the reference's: tight. A GPU runs the compiled kernel
# with bf16 tensor-core products summed in another order than the reference's dense einsums: bf16 rounding
# (2^-8 relative per operand) through a few layers, measured at 1.7e-3 on the loss on an H100 (2026-11-22).
_TOLERANCES = {"cpu": (1e-4, 1e-3, 1e-5), "gpu": (1e-2, 5e-2, 1e-2)}


def test_block_sparse_is_registered():
    assert get_attention("block_sparse") is BLOCK_SPARSE and BLOCK_SPARSE.permuted


def test_kernel_launch_settings_select_a_launch():
    """`model.kernel_heads` / `kernel_warps` pick the kernel's launch; the defaults are the registered kernel."""
    a = get_attention("block_sparse", kernel_heads=2, kernel_warps=8)
    assert a is get_attention("block_sparse", kernel_heads=2, kernel_warps=8) and a is not BLOCK_SPARSE
    assert "heads=2, warps=8" in a.name
    assert get_attention("reference", kernel_heads=2) is get_attention("reference")
    with pytest.raises(ConfigError, match="kernel_heads"):
        dataclasses.replace(TINY, kernel_heads=4)  # TINY has 2 heads
    with pytest.raises(ConfigError, match="kernel_warps"):
        dataclasses.replace(TINY, kernel_warps=3)


@pytest.mark.parametrize("sink", [(), ("inbound", "column")])
def test_model_forward_and_grads_match_reference(sink):
    # tiles of 16 so that the S=40 sequences span three tiles, the last one partial
    register_attention("block_sparse_t16", block_sparse(block=16))  # tile structures built once per batch
    db = tiny_db(1)
    batch = tiny_batch(db, b=2, s=40, r=8)
    inputs = batch_to_inputs(batch)
    col, cat = tables(db)

    def loss(model, inputs):
        out = model(inputs, col, cat)
        return sum(jnp.sum(jnp.tanh(x)) for x in out if x is not None)  # cat_copy: None in the dense output

    results = []
    for impl in ("reference", "block_sparse_t16"):
        model = tiny_model(dataclasses.replace(TINY, attention_impl=impl, attention_sink=sink))
        value, grads = eqx.filter_jit(eqx.filter_value_and_grad(loss))(model, inputs)
        leaves = [np.asarray(g) for g in jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))]
        results.append((float(value), leaves))
    (v_ref, g_ref), (v_bs, g_bs) = results
    loss_rtol, grad_rtol, grad_atol = _TOLERANCES["gpu" if jax.default_backend() == "gpu" else "cpu"]
    assert np.isfinite(v_bs) and abs(v_bs - v_ref) <= loss_rtol * max(1.0, abs(v_ref))
    assert len(g_ref) == len(g_bs)
    for a, b in zip(g_ref, g_bs, strict=True):
        np.testing.assert_allclose(b, a, rtol=grad_rtol, atol=grad_atol * max(1.0, float(np.abs(a).max())))
