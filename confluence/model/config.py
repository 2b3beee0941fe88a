"""Model configuration (seeds 000 / 001 / 002 / 004)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from confluence.stypes import D_TIME


def ffn_hidden_dim(d_model: int, multiple: int = 256) -> int:
    """SwiGLU hidden size: ceil(8/3 * D) rounded up to a multiple of `multiple` (seed 001: 768 at D=256)."""
    return int(math.ceil((8.0 * d_model / 3.0) / multiple) * multiple)


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of the relational transformer. `d_t` is a property of the processed store."""

    d_model: int = 256
    n_layers: int = 12
    n_heads: int = 8
    d_t: int = 256
    d_time: int = D_TIME
    ffn_multiple: int = 256
    norm_eps: float = 1e-6
    compute_dtype: str = "bfloat16"  # activations / matmuls; parameters stay float32
    attention_impl: str = "reference"  # "reference" | "block_sparse" | "auto" (confluence.model.attention)
    remat: bool = False  # recompute each block's activations in the backward pass (less memory, ~1/3 more FLOPs)

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"model config: d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        for name in ("d_model", "n_layers", "n_heads", "d_t", "d_time", "ffn_multiple"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.compute_dtype not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"model config: compute_dtype must be bfloat16|float32|float16, got {self.compute_dtype!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return ffn_hidden_dim(self.d_model, self.ffn_multiple)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"model config: unknown field(s) {unknown}")
        return cls(**known)
