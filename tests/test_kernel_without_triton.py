"""A JAX without Pallas's Triton backend (deprecated since 0.11, to be removed): the model still runs.

Run in a fresh interpreter where `jax.experimental.pallas.triton` cannot be imported, as in a JAX that dropped it:
the kernel still imports and runs through the Pallas interpreter (same numbers as the reference), `auto` on a GPU
falls back to the reference attention with a warning, and asking for the compiled kernel is a clear configuration
error, not an ImportError at import time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import json, sys, warnings
sys.modules["jax.experimental.pallas.triton"] = None  # `import` of it now raises ImportError

import jax, jax.numpy as jnp, numpy as np
from confluence.errors import ConfigError
from confluence.model import attention
from confluence.model.kernels import block_sparse_attention, synthetic_structure
from confluence.model.kernels.block_sparse import attend_block_sparse, triton_available
from confluence.model.kernels.structure import block_structure

out = {"triton_available": triton_available()}
struct = tuple(jnp.asarray(x) for x in synthetic_structure(3, "inbound", 1, 40))
keys = jax.random.split(jax.random.PRNGKey(0), 3)
q, k, v = (jax.random.normal(key, (1, 40, 2, 16), jnp.float32) for key in keys)
got = block_sparse_attention(q, k, v, "inbound", *struct, block=16, interpret=True)
want = attention.reference_attention(q, k, v, "inbound", *struct)
out["interpreted_max_err"] = float(jnp.max(jnp.abs(got - want)))

st = block_structure("inbound", *struct, 16)
try:
    jax.jit(lambda q, k, v: attend_block_sparse(q, k, v, "inbound", st, interpret=False)).lower(q, k, v)
    out["compiled"] = "lowered"
except ConfigError as e:
    out["compiled"] = str(e)

out["auto_on_cpu"] = attention.get_attention("auto").name
attention.jax = type("GpuJax", (), {"default_backend": staticmethod(lambda: "gpu")})  # as on a GPU machine
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out["auto_on_gpu"] = attention.get_attention("auto").name
out["auto_warning"] = " ".join(str(w.message) for w in caught)
try:
    attention.get_attention("block_sparse")
    out["block_sparse_on_gpu"] = "accepted"
except ConfigError as e:
    out["block_sparse_on_gpu"] = str(e)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def without_triton() -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=Path(__file__).parent.parent, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_kernel_module_imports_and_interprets(without_triton):
    assert without_triton["triton_available"] is False
    assert without_triton["interpreted_max_err"] < 1e-4  # FP32, the same numbers as the reference


def test_a_compiled_launch_is_a_configuration_error(without_triton):
    for key in ("compiled", "block_sparse_on_gpu"):
        msg = without_triton[key]
        assert msg.startswith("config setting 'model.attention_impl'"), msg
        assert "Triton backend" in msg and jax_version() in msg


def test_auto_falls_back_to_the_reference_with_a_warning(without_triton):
    assert without_triton["auto_on_cpu"] == "reference"
    assert without_triton["auto_on_gpu"] == "reference"
    assert "reference attention" in without_triton["auto_warning"]
    assert "Triton backend" in without_triton["auto_warning"]


def jax_version() -> str:
    import jax

    return jax.__version__
