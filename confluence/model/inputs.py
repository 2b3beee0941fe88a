"""Host-side conversion of a `TrainingBatch` (and a database's tables) into the arrays the jitted step takes.

The device batch is a flat dict of arrays: every [B, S(, ...)] tensor of seed 000 with its own dtype (the model
casts ids to int32 on the device), `fk_adj`, `text_batch_embeddings`, `seq_valid`, and the per-batch scalars
`target_stype`, `cat_block_start`, `cat_count` as int32 0-d arrays (inputs, not constants, so one compiled step
serves every task of the same shapes). int64 bookkeeping (`seed_ids`, `anchor_rows`, `obs_times`) stays on host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from confluence.errors import ConfluenceError
from confluence.sampler.batch import SEQ_FIELDS, TrainingBatch

SCALAR_FIELDS = ("target_stype", "cat_block_start", "cat_count", "task_idx", "db_idx")
# Fields whose leading axis is the batch axis (sharded over the "data" mesh axis).
BATCH_AXIS_FIELDS = (*SEQ_FIELDS, "fk_adj", "seq_valid")


def batch_to_inputs(batch: TrainingBatch, *, min_text_rows: int = 1) -> dict[str, np.ndarray]:
    """The dict of numpy arrays the model takes. An empty text table (U = 0) gets `min_text_rows` zero rows."""
    out: dict[str, np.ndarray] = {name: getattr(batch, name) for name in SEQ_FIELDS}
    out["fk_adj"] = batch.fk_adj
    out["seq_valid"] = batch.seq_valid
    text = batch.text_batch_embeddings
    if text.shape[0] < min_text_rows:
        pad = np.zeros((min_text_rows - text.shape[0], text.shape[1]), np.float16)
        text = np.concatenate([text, pad], axis=0)
    out["text_batch_embeddings"] = text
    for name in SCALAR_FIELDS:
        out[name] = np.asarray(getattr(batch, name), np.int32)
    return out


def bucket_size(n: int, minimum: int = 64) -> int:
    """Smallest power of two >= max(n, minimum): the padded row count of a per-database table."""
    size = minimum
    while size < n:
        size *= 2
    return size


@dataclass(frozen=True)
class DbTables:
    """One database's GPU-resident tables, padded to bucket sizes so databases of similar size share a compile."""

    name: str
    column_embeddings: np.ndarray  # f16 [C_pad, D_t]
    categorical_embeddings: np.ndarray  # f16 [Vc_pad, D_t], padded so block_start + max_K stays in bounds
    num_columns: int
    num_categories: int
    max_k: int

    @classmethod
    def build(cls, name: str, column_embeddings: np.ndarray, categorical_embeddings: np.ndarray, max_k: int,
              model_max_k: int) -> DbTables:
        """Pad the tables; raises ValueError naming the database if its max_K exceeds the step's static max_K."""
        if column_embeddings.ndim != 2 or categorical_embeddings.ndim != 2:
            raise ValueError(f"database {name!r}: embedding tables must be 2-D [rows, D_t]")
        if column_embeddings.shape[1] != categorical_embeddings.shape[1] and categorical_embeddings.shape[0]:
            raise ValueError(f"database {name!r}: column and categorical tables have different D_t")
        if max_k > model_max_k:
            raise ConfluenceError(
                f"database {name!r}: a categorical target has K={max_k} categories but the training config's "
                f"max_k is {model_max_k}; raise `max_k` in the config"
            )
        d_t = column_embeddings.shape[1]
        c, vc = column_embeddings.shape[0], categorical_embeddings.shape[0]
        col = np.zeros((bucket_size(c), d_t), np.float16)
        col[:c] = column_embeddings
        cat = np.zeros((bucket_size(vc + model_max_k), d_t), np.float16)
        cat[:vc] = categorical_embeddings
        return cls(name, col, cat, c, vc, max_k)
