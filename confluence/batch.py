"""The `TrainingBatch`: the unit of data moved from the host to the accelerator (seed 000, "Batch Structure").
The sampler builds it and the model reads it, so it lives below both.

Every batch holds sequences of ONE task of ONE database, so its target type is homogeneous. All arrays are
NumPy arrays with exactly the dtypes of seed 000. Index spaces:

* global:          `column_ids` (ColumnIdx), `categorical_embed_ids` (CategoricalEmbeddingIdx)
* sequence-local:  `seq_row_ids`, `fk_adj` (0..R-1, per sequence)
* batch-local:     `text_embed_ids` (0..U-1 into `text_batch_embeddings`)

Fields beyond seed 000 (documented in docs/design/architecture.md): `row_age`, `child_rank`, `arrival`, `task_idx`,
`db_idx`, `cat_block_start`, `cat_count`, `seed_ids`, `anchor_rows`, `obs_times`, `wait_ref`, `wait_scale`,
`seq_valid`. They are scalars or `[B]` vectors that the loss (categorical block, a wait's scale), the model (a
wait's reference), evaluation (which seed a sequence came from) and the last partial batch of an evaluation pass
(`seq_valid`) need.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from confluence.stypes import D_TIME

ROW_AGE_UNKNOWN = -1.0  # `row_age` of a cell whose row has no time, or whose sequence has no observation time
CHILD_RANK_UNKNOWN = -1  # `child_rank` of a cell whose row was not reached as a child (or has no time)
CHILD_RANK_MAX = 32767  # ranks are clipped here (int16)
ARRIVAL_NONE = -1  # `arrival` of a cell whose row was not reached through a foreign key (the anchor, labels, padding)


def arrival_code(fk_column: int, as_child: bool) -> int:
    """The `arrival` of a row reached through the foreign-key column `fk_column` (a global column id): as a parent
    (the row it came from references it) or as a child (it references the row it came from)."""
    return 2 * fk_column + int(as_child)

@dataclass(frozen=True)
class SeqField:
    """One [B, S, ...] tensor of the batch: its dtype, its shape beyond [B, S], and the value a freshly allocated
    batch holds where no cell writes (what a padding position keeps)."""

    dtype: np.dtype
    trailing: tuple[int, ...] = ()
    fill: float = 0

    def shape(self, b: int, s: int) -> tuple[int, ...]:
        return (b, s, *self.trailing)


# The [B, S, ...] tensors, in batch order: the one specification the sampler's builder, the synthetic batches,
# the model's inputs and the checks all read.
SEQ_FIELDS: dict[str, SeqField] = {
    "semantic_types": SeqField(np.dtype(np.int8)),
    "column_ids": SeqField(np.dtype(np.int32)),
    "seq_row_ids": SeqField(np.dtype(np.uint16)),
    "is_null": SeqField(np.dtype(np.bool_)),
    "numeric_values": SeqField(np.dtype(np.float32)),
    "timestamp_values": SeqField(np.dtype(np.float32), (D_TIME,)),
    "bool_values": SeqField(np.dtype(np.bool_)),
    "categorical_embed_ids": SeqField(np.dtype(np.uint32)),
    "text_embed_ids": SeqField(np.dtype(np.uint32)),
    "is_target": SeqField(np.dtype(np.bool_)),
    "is_padding": SeqField(np.dtype(np.bool_)),
    "row_age": SeqField(np.dtype(np.float32), fill=ROW_AGE_UNKNOWN),
    "child_rank": SeqField(np.dtype(np.int16), fill=CHILD_RANK_UNKNOWN),
    "arrival": SeqField(np.dtype(np.int32), fill=ARRIVAL_NONE),
    "col_perm": SeqField(np.dtype(np.uint16)),
    "out_perm": SeqField(np.dtype(np.uint16)),
    "in_perm": SeqField(np.dtype(np.uint16)),
}


def seq_arrays(b: int, s: int, **fill: float) -> dict[str, np.ndarray]:
    """Every [B, S, ...] tensor of a batch of `b` sequences of `s` cells, holding its field's fill value (or the
    one given by name in `fill`, e.g. `is_padding=True` for a batch that writes only its real cells)."""
    unknown = set(fill) - set(SEQ_FIELDS)
    if unknown:
        raise ValueError(f"no batch field(s) {sorted(unknown)}")
    return {name: np.full(f.shape(b, s), fill.get(name, f.fill), f.dtype) for name, f in SEQ_FIELDS.items()}


@dataclass
class TrainingBatch:
    # --- [B, S] cell identity (seed 000 section 1)
    semantic_types: np.ndarray  # int8, SemanticType values; never IGNORED
    column_ids: np.ndarray  # int32, global column index
    seq_row_ids: np.ndarray  # uint16, sequence-local row index 0..R-1
    # --- [B, S(, 15)] dense per-type values (section 2); 0 where the slot does not apply
    is_null: np.ndarray  # bool
    numeric_values: np.ndarray  # float32, z-scored
    timestamp_values: np.ndarray  # float32 [B, S, 15]: 7 (sin, cos) pairs + z-scored epoch
    bool_values: np.ndarray  # bool
    categorical_embed_ids: np.ndarray  # uint32, global index into the categorical embedding table
    text_embed_ids: np.ndarray  # uint32, batch-local index into text_batch_embeddings
    # --- [B, S] validity and masking (section 3)
    is_target: np.ndarray  # bool, exactly one True per valid sequence
    is_padding: np.ndarray  # bool
    # --- [B, S] relative time (beyond seed 000): days from the cell's row time to the observation time, >= 0;
    # ROW_AGE_UNKNOWN where there is none (a static row, no cut-off, padding; every cell of a timestamp cell task)
    row_age: np.ndarray  # float32
    # --- [B, S] recency (beyond seed 000): for a row reached as a child of the row it came from, how many of that
    # row's children through the same foreign key are newer and visible at the observation time (0: the latest);
    # CHILD_RANK_UNKNOWN elsewhere (the anchor, parents, labels, rows without a time, a timestamp cell task)
    child_rank: np.ndarray  # int16
    # --- [B, S] arrival (beyond seed 000): through which foreign key the cell's row entered the context, from the
    # row the walk came from: `arrival_code(fk column, as_child)`, ARRIVAL_NONE for the anchor, labelled rows and
    # padding. It tells apart two parents of one table (a match's home and away team), whose cells are otherwise alike
    arrival: np.ndarray  # int32
    # --- structure (section 4)
    fk_adj: np.ndarray  # bool [B, R, R]; fk_adj[b, r1, r2]: row r1 has a FK pointing at row r2
    col_perm: np.ndarray  # uint16 [B, S]
    out_perm: np.ndarray  # uint16 [B, S]
    in_perm: np.ndarray  # uint16 [B, S]
    # --- text (section 6)
    text_batch_embeddings: np.ndarray  # float16 [U, D_t]
    # --- per-batch scalars
    target_stype: int  # SemanticType value of the target (1, 2, 3 or 4)
    task_idx: int  # index of the task in its store's task list
    db_idx: int  # index of the database among those the sampler serves
    cat_block_start: int  # categorical target: first global categorical index of the target's block (else 0)
    cat_count: int  # categorical target: K, number of categories of the target (else 0)
    # --- [B] per-sequence bookkeeping
    seed_ids: np.ndarray  # int64, index of the seed within the task's seed arrays
    anchor_rows: np.ndarray  # int64, global row index of the anchor (seed) row
    obs_times: np.ndarray  # int64, observation time in epoch microseconds (INT64_MAX: no cut-off)
    seq_valid: np.ndarray  # bool, False for filler sequences of a last partial batch
    # --- [B] a wait (beyond seed 000): for a timestamp task with observation times, the epoch z-score of the
    # observation time plus the task's median wait on its train split (`wait_ref`) and the train waits' mean absolute
    # deviation from that median in z-units (`wait_scale`, the unit the answer and its loss are read in); 0 and 0
    # for every other sequence (`confluence.sampler.waits`). None: zeros
    wait_ref: np.ndarray | None = None  # float32
    wait_scale: np.ndarray | None = None  # float32

    def __post_init__(self) -> None:
        b = self.semantic_types.shape[0]
        if self.wait_ref is None:
            self.wait_ref = np.zeros(b, np.float32)
        if self.wait_scale is None:
            self.wait_scale = np.zeros(b, np.float32)

    @property
    def batch_size(self) -> int:
        return int(self.semantic_types.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.semantic_types.shape[1])

    @property
    def num_rows(self) -> int:
        """R, the padded row dimension of `fk_adj`."""
        return int(self.fk_adj.shape[1])

    def validate(self) -> None:
        """Check dtypes and shapes against seed 000; raises ValueError naming the offending field."""
        b, s = self.semantic_types.shape
        for name, spec in SEQ_FIELDS.items():
            arr = getattr(self, name)
            want = spec.shape(b, s)
            if arr.dtype != spec.dtype or arr.shape != want:
                raise ValueError(f"TrainingBatch.{name}: got {arr.dtype}{arr.shape}, expected {spec.dtype}{want}")
        if self.fk_adj.dtype != np.bool_ or self.fk_adj.ndim != 3 or self.fk_adj.shape[0] != b:
            raise ValueError(f"TrainingBatch.fk_adj: got {self.fk_adj.dtype}{self.fk_adj.shape}, expected bool[B,R,R]")
        if self.fk_adj.shape[1] != self.fk_adj.shape[2]:
            raise ValueError(f"TrainingBatch.fk_adj must be square in its last two axes, got {self.fk_adj.shape}")
        if self.text_batch_embeddings.dtype != np.float16 or self.text_batch_embeddings.ndim != 2:
            raise ValueError("TrainingBatch.text_batch_embeddings must be float16 [U, D_t]")
        for name in ("seed_ids", "anchor_rows", "obs_times"):
            arr = getattr(self, name)
            if arr.dtype != np.int64 or arr.shape != (b,):
                raise ValueError(f"TrainingBatch.{name}: got {arr.dtype}{arr.shape}, expected int64[{b}]")
        if self.seq_valid.dtype != np.bool_ or self.seq_valid.shape != (b,):
            raise ValueError(f"TrainingBatch.seq_valid: expected bool[{b}]")
        for name in ("wait_ref", "wait_scale"):
            arr = getattr(self, name)
            if arr.dtype != np.float32 or arr.shape != (b,):
                raise ValueError(f"TrainingBatch.{name}: got {arr.dtype}{arr.shape}, expected float32[{b}]")

    def arrays(self) -> dict[str, np.ndarray]:
        """All array fields by name (what is shipped to the device)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), np.ndarray)}
