"""Block-sparse attention kernels for the GPU (the reference in `confluence.model.attention` stays the CPU path).

`block_sparse_attention` has the signature of the attention interface; `tile_stats` reports how sparse one
sublayer's mask is at tile granularity; `synthetic_structure` makes sampler-like random structures. Importing this
package registers the kernel as `attention_impl="block_sparse"` (`confluence.model.attention.get_attention`);
`block_sparse(block, interpret)` makes it an `Attention` with other settings.
"""

from confluence.model.attention import register_attention
from confluence.model.kernels.block_sparse import (
    BLOCK_SPARSE,
    DEFAULT_BLOCK,
    attend_block_sparse,
    block_sparse,
    block_sparse_attention,
    default_interpret,
)
from confluence.model.kernels.structure import BlockStructure, block_structure, tile_stats
from confluence.model.kernels.synthetic import PermutedStructure, synthetic_structure

register_attention("block_sparse", BLOCK_SPARSE)

__all__ = [
    "BLOCK_SPARSE",
    "DEFAULT_BLOCK",
    "BlockStructure",
    "PermutedStructure",
    "attend_block_sparse",
    "block_sparse",
    "block_sparse_attention",
    "block_structure",
    "default_interpret",
    "synthetic_structure",
    "tile_stats",
]
