"""The memory a compiled step needs, and the clear error before a step that cannot fit the device runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from confluence.errors import ConfluenceError
from confluence.toolkit.memory import check_fits, device_limit, host_memory, step_memory


class _Device:
    """A device whose allocator reports `limit` bytes (the shape of a GPU's `memory_stats()`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def memory_stats(self) -> dict[str, int]:
        return {"bytes_limit": self.limit, "bytes_in_use": 0}


def _compiled():
    x = jnp.ones((512, 512), jnp.float32)
    return jax.jit(lambda a: jnp.tanh(a @ a) @ a).lower(x).compile()


def test_step_memory_counts_arguments_outputs_and_temporaries():
    need = step_memory(_compiled())
    assert need is not None
    assert need.arguments == 512 * 512 * 4 and need.outputs == 512 * 512 * 4
    assert need.peak >= need.arguments + need.outputs - need.aliased
    assert "MiB" in need.describe()


def test_a_step_larger_than_the_device_is_refused_with_the_settings_to_change():
    compiled = _compiled()
    need = step_memory(compiled)
    with pytest.raises(ConfluenceError, match=r"a test step needs .* per device but the device holds .*: lower batch_size"):
        check_fits(compiled, "a test step", "lower batch_size", device=_Device(need.peak - 1))
    assert check_fits(compiled, "a test step", "lower batch_size", device=_Device(need.peak)) == need


class _Silent:
    """A device that reports no memory statistics and is no CPU."""

    platform = "tpu"

    def memory_stats(self) -> None:
        return None


def test_the_cpu_limit_is_the_machines_memory_and_a_silent_device_has_none():
    if jax.default_backend() == "cpu":
        assert device_limit() == host_memory() and host_memory() > 2**30
    assert device_limit(_Silent()) is None
    assert check_fits(_compiled(), "a test step", "-", device=_Silent()) is not None  # nothing checked: no limit
    assert check_fits(_compiled(), "a test step", "-") is not None  # a few MiB fit any machine
