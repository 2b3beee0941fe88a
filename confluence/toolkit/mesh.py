"""Data parallelism: a 1-D device mesh with axis "data" and replicated placement of parameters / state."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from confluence.errors import ConfluenceError

DATA_AXIS = "data"


def make_mesh(num_devices: int | None = None) -> Mesh:
    """A 1-D mesh with axis "data": over every device of every process (default), or the first `num_devices`
    local devices."""
    if num_devices is None:
        return Mesh(np.asarray(jax.devices()), (DATA_AXIS,))
    local = jax.local_devices()
    if not 1 <= num_devices <= len(local):
        raise ConfluenceError(f"asked for {num_devices} devices, {len(local)} local device(s) available")
    return Mesh(np.asarray(local[:num_devices]), (DATA_AXIS,))


def replicate(tree, mesh: Mesh):
    """Place every array leaf of `tree` replicated on all devices of `mesh`."""
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: jax.device_put(x, sharding) if eqx.is_array(x) else x, tree)
