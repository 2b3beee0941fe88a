"""What a compiled step needs in device memory, and a clear error before a step that cannot fit runs.

XLA knows a compiled program's peak once it is compiled: its arguments, outputs (less what is donated and aliased)
and temporaries (`Compiled.memory_analysis()`). A GPU reports how much it can hold (`Device.memory_stats()`); on the
CPU the limit is the machine's physical memory (a step that needs more cannot run; one that needs less may still
meet other processes, so this refuses only the certain failures). Asking before the first step turns an
out-of-memory failure deep inside XLA (after minutes of compilation and a step that allocates half the device) into
one message that names the setting to change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import jax

from confluence.errors import ConfluenceError

GIB = 1024**3


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 1024**2:.1f} MiB"


@dataclass(frozen=True)
class StepMemory:
    """Bytes one call of a compiled program needs on each device, by part."""

    arguments: int
    outputs: int
    aliased: int  # outputs written into donated arguments (counted once)
    temporaries: int

    @property
    def peak(self) -> int:
        """Arguments + new outputs + temporaries: what must be free for the call."""
        return self.arguments + self.outputs - self.aliased + self.temporaries

    def describe(self) -> str:
        return (f"{_size(self.peak)} (arguments {_size(self.arguments)}, outputs {_size(self.outputs - self.aliased)}, "
                f"temporaries {_size(self.temporaries)})")


def step_memory(compiled: Any) -> StepMemory | None:
    """The memory of a compiled program (`jitted.lower(...).compile()`), or None where XLA does not say."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - a backend without the analysis
        return None
    if m is None:
        return None
    return StepMemory(int(m.argument_size_in_bytes), int(m.output_size_in_bytes), int(m.alias_size_in_bytes),
                      int(m.temp_size_in_bytes))


def host_memory() -> int | None:
    """The machine's physical memory in bytes, or None where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def device_limit(device: jax.Device | None = None) -> int | None:
    """Bytes the device can allocate: a GPU's allocator limit, the machine's physical memory for a CPU device, or
    None where neither is known."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory statistics
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return host_memory() if getattr(device, "platform", None) == "cpu" else None


def check_fits(compiled: Any, what: str, hint: str, device: jax.Device | None = None) -> StepMemory | None:
    """Raise ConfluenceError when the compiled program needs more memory than the device holds; returns what it
    needs (None where unknown). `hint` says which settings lower it (e.g. "lower batch_size, raise grad_accum")."""
    need = step_memory(compiled)
    limit = device_limit(device)
    if need is not None and limit is not None and need.peak > limit:
        raise ConfluenceError(
            f"{what} needs {need.describe()} per device but the device holds {_size(limit)}: {hint}")
    return need
