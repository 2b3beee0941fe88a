"""Lowering for CUDA on a machine without a GPU: the GPU readiness tests and `scripts/compile_step.py --cuda`.

Since JAX 0.11 the Pallas Triton lowering asks for the GPU it compiles for; without one it needs an abstract GPU
device in the abstract mesh of the lowering (`jax.sharding.use_abstract_mesh`). JAX 0.10 lowers without it and
accepts the context too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

GPU_KIND = "NVIDIA H100"  # the GPU kind the project's figures come from (docs/design/attention_kernel.md)


@contextlib.contextmanager
def cuda_lowering(device_kind: str = GPU_KIND) -> Iterator[None]:
    """Inside: `jitted.trace(...).lower(lowering_platforms=("cuda",))` compiles the Triton kernels for `device_kind`."""
    mesh = AbstractMesh((1,), ("data",), (AxisType.Explicit,),
                        abstract_device=AbstractDevice(device_kind=device_kind, num_cores=None, platform="gpu"))
    with use_abstract_mesh(mesh):
        yield
