"""Can a Mosaic GPU attention kernel be tested on a CPU? (docs/design/training_speed.md, "JAX versions and the kernel's route")

    python scripts/mosaic_gpu_probe.py

Runs the forward pass of JAX's own Hopper flash attention (`jax.experimental.pallas.ops.gpu.attention_mgpu`, the
base a block-sparse Mosaic GPU port would start from) in Pallas's Mosaic GPU interpreter on this CPU, at B = 1,
S = 256, one head of 64, blocks of 64, and compares it with the dense reference. Prints one JSON line: the JAX
version and either the largest difference or the error that stopped the interpreter. Needs `absl-py` (the example
module imports JAX's test utilities). Exit status 0 either way: the answer is the printed line.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp


def _interpret_params():  # public from JAX 0.12, private before
    try:
        from jax.experimental.pallas.mosaic_gpu import InterpretGPUParams
    except ImportError:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    return InterpretGPUParams()


def main() -> None:
    """Run the probe and print its outcome."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    plain_kernel = am.plgpu.kernel

    def interpreted_kernel(*args, **kwargs):
        kwargs["interpret"] = _interpret_params()
        return plain_kernel(*args, **kwargs)

    am.plgpu.kernel = interpreted_kernel  # the module's only launch: run it in the interpreter
    # the forward asks the CUDA runtime's version (a causal-mask guard); there is none on a CPU
    am.cuda_versions = type("NoCuda", (), {"cuda_runtime_get_version": staticmethod(lambda: 12090)})
    b, s, h, d = 1, 256, 1, 64
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (b, s, h, d), jnp.float16) for key in (kq, kk, kv))
    result: dict[str, object] = {"jax": jax.__version__, "python": sys.version.split()[0]}
    try:
        out = am._attention_forward(q, k, v, am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2))
        ref = am.attention_reference(q, k, v)
        result["runs"] = True
        result["max_abs_diff"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
    except Exception as e:  # the outcome to report, whatever the interpreter raised
        result["runs"] = False
        lines = [ln for ln in str(e).splitlines() if ln.strip() and not ln.startswith(" ")]
        result["error"] = f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"  # a callback's cause is last
    print(json.dumps(result))


if __name__ == "__main__":
    main()
