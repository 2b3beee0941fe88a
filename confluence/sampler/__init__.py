"""Sampler: turns task seeds into TrainingBatches (spec/sampling.md, seed 000 "Batch Structure").

`TrainingBatch` imports nothing heavy; the other names load numba lazily on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from confluence.sampler.batch import TrainingBatch

_LAZY = {
    "Sampler": "confluence.sampler.sampler",
    "SamplerConfig": "confluence.sampler.config",
    "SplitConfig": "confluence.sampler.config",
    "SamplerData": "confluence.sampler.data",
    "Prefetcher": "confluence.sampler.prefetch",
    "render_sequence": "confluence.sampler.show",
    "BuildResult": "confluence.sampler.builder",
}

__all__ = ["TrainingBatch", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'confluence.sampler' has no attribute {name!r}")
