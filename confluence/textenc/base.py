"""The frozen text-encoder interface that preprocessing depends on.

Implementations: the default static model2vec encoder shipped in the package, a sentence-transformers model
directory (optional, needs torch), and a trained LeJEPA text checkpoint (confluence.textmodel).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class TextEncoder(Protocol):
    """Maps strings to fixed-size vectors. Frozen: never trained by the relational model."""

    @property
    def dim(self) -> int:
        """Output size D_t."""
        ...

    @property
    def fingerprint(self) -> str:
        """Stable identity of the model (name + weights hash); keys the embedding cache and is recorded in stores."""
        ...

    def encode(self, texts: Sequence[str], batch_size: int = 4096) -> np.ndarray:
        """Embed `texts` into a float32 array [len(texts), dim]. Deterministic for a given fingerprint."""
        ...
