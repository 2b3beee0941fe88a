"""Host-side conversion of a `TrainingBatch` (and a database's tables) into the arrays the jitted step takes.

The device batch is a flat dict of arrays: every [B, S(, ...)] tensor of seed 000 with its own dtype (the model
casts ids to int32 on the device), `fk_adj`, `text_batch_embeddings`, `seq_valid`, and the per-batch scalars
`target_stype`, `cat_block_start`, `cat_count` as int32 0-d arrays (inputs, not constants, so one compiled step
serves every task of the same shapes). int64 bookkeeping (`seed_ids`, `anchor_rows`, `obs_times`) stays on host.

Target masking is structural: the ground truth of each sequence's target cell moves to the `[B]` fields of
`TARGET_FIELDS`, which only the loss reads, and the target cell of the value tensors is blanked (value 0, not
NULL). So the model's inputs are the same whatever the target's value or nullness, and no arithmetic of the
forward pass can mix the truth in, under any XLA fusion or backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from confluence.batch import SEQ_FIELDS, TrainingBatch
from confluence.errors import ConfluenceError
from confluence.model.config import ModelConfig
from confluence.stypes import SemanticType

SCALAR_FIELDS = ("target_stype", "cat_block_start", "cat_count", "task_idx", "db_idx")
# The ground truth at each sequence's target cell (only the loss reads these): field -> the batch tensor it comes from.
TARGET_FIELDS = {"target_is_null": "is_null", "target_numeric": "numeric_values", "target_bool": "bool_values",
                 "target_timestamp": "timestamp_values", "target_category": "categorical_embed_ids"}
# Fields whose leading axis is the batch axis (sharded over the "data" mesh axis).
# [B] float32 fields the model reads beside the cells (a wait's reference and unit: `confluence.sampler.waits`)
WAIT_FIELDS = ("wait_ref", "wait_scale")
BATCH_AXIS_FIELDS = (*SEQ_FIELDS, "fk_adj", "seq_valid", *TARGET_FIELDS, *WAIT_FIELDS)


def batch_to_inputs(batch: TrainingBatch, *, min_text_rows: int = 1) -> dict[str, np.ndarray]:
    """The dict of numpy arrays the model takes. An empty text table (U = 0) gets `min_text_rows` zero rows.
    The target cells' truth goes to `TARGET_FIELDS` and is blanked in the value tensors (see the module doc)."""
    out: dict[str, np.ndarray] = split_targets({name: getattr(batch, name) for name in SEQ_FIELDS})
    out["fk_adj"] = batch.fk_adj
    out["seq_valid"] = batch.seq_valid
    for name in WAIT_FIELDS:
        out[name] = np.asarray(getattr(batch, name), np.float32)
    text = batch.text_batch_embeddings
    if text.shape[0] < min_text_rows:
        pad = np.zeros((min_text_rows - text.shape[0], text.shape[1]), np.float16)
        text = np.concatenate([text, pad], axis=0)
    out["text_batch_embeddings"] = text
    for name in SCALAR_FIELDS:
        out[name] = np.asarray(getattr(batch, name), np.int32)
    return out


def split_targets(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`tensors` (holding `is_target` and the value tensors) with each sequence's target-cell truth moved to the
    `[B]` fields of `TARGET_FIELDS` and blanked (0 / False) in the value tensors. Inputs are not modified."""
    out = dict(tensors)
    is_target = np.asarray(tensors["is_target"])
    rows = np.arange(is_target.shape[0])
    pos = np.argmax(is_target, axis=1)  # the target position (0 where a filler sequence has none)
    has = is_target[rows, pos]
    for field, source in TARGET_FIELDS.items():
        x = np.asarray(tensors[source])
        truth = x[rows, pos].copy()
        truth[~has] = 0
        blanked = x.copy()
        blanked[rows[has], pos[has]] = 0
        out[field], out[source] = truth, blanked
    return out


def pow2_at_least(n: int, minimum: int = 64) -> int:
    """Smallest power-of-two multiple of `minimum` >= n: the padded row count of a per-database table."""
    size = minimum
    while size < n:
        size *= 2
    return size


def _pad_rows(a: np.ndarray, rows: int, dtype: Any = None) -> np.ndarray:
    """A new `[rows, D]` array: `a`'s rows (cast to `dtype`, default a's), then zero rows."""
    out = np.zeros((rows, a.shape[1]), dtype or a.dtype)
    out[: a.shape[0]] = a
    return out


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
              model_max_k: int, category_codes: float = 0.0, column_codes: float = 0.0,
              column_keys: Sequence[str] | None = None) -> DbTables:
        """Pad the tables; raises ValueError naming the database if its max_K exceeds the step's static max_K.
        `category_codes` > 0 adds that multiple of each category's identity code (keyed by its row,
        `identity_codes`). `column_codes` > 0 adds that multiple of each column's code, the `value_codes`
        code of "column:<key>" for its key in `column_keys` (one per row of the column table; `column_keys(store)`)."""
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
        col = _pad_rows(column_embeddings, pow2_at_least(c), np.float16)
        if column_codes and c:
            if column_keys is None or len(column_keys) != c:
                raise ValueError(f"database {name!r}: column codes need one key per row of the column table ({c}), "
                                 f"got {None if column_keys is None else len(column_keys)}")
            col[:c] = (column_embeddings.astype(np.float32)
                       + np.float32(column_codes) * value_codes([f"column:{k}" for k in column_keys], d_t)
                       ).astype(np.float16)
        cat = _pad_rows(categorical_embeddings, pow2_at_least(vc + model_max_k), np.float16)
        if category_codes and vc:
            cat[:vc] = (categorical_embeddings.astype(np.float32)
                        + np.float32(category_codes) * identity_codes(vc, d_t)).astype(np.float16)
        return cls(name, col, cat, c, vc, max_k)

    @classmethod
    def from_store(cls, store: Any, model_max_k: int, category_codes: float = 0.0,
                   column_codes: float = 0.0) -> DbTables:
        """The padded tables of a processed store (`confluence.store.Store`, or anything with its reader API);
        `category_codes` / `column_codes`: `ModelConfig`'s."""
        return cls.build(store.name, np.asarray(store.column_embeddings), np.asarray(store.categorical_embeddings),
                         target_max_k(store), model_max_k, category_codes, column_codes,
                         column_keys(store) if column_codes else None)

    @classmethod
    def for_model(cls, store: Any, model_max_k: int, model: ModelConfig) -> DbTables:
        """The tables of `store` as a model of `ModelConfig` `model` reads them (its category and column codes): the
        one call training, inference and scripts share, so they cannot build different inputs for one run."""
        return cls.from_store(store, model_max_k, model.category_codes, model.column_codes)


PAD_ALIKE_MIN_BYTES = 512 << 20  # pad_alike may always use this much memory in all


def pad_alike(tables: Sequence[DbTables]) -> list[DbTables]:
    """The tables of a run's databases padded to one shape (the largest column and category tables among them), so
    that the step compiles once for all of them rather than once per table-shape bucket. Padding rows are zeros that
    no id points at, so results do not change (tests/test_model_tables.py). Without it a pretraining run over 393
    databases spent its first minutes compiling (docs/design/decisions.md, "A multi-database run compiles its step once").
    Where one database's tables are far larger than the others' (the padded total would pass both
    `PAD_ALIKE_MIN_BYTES` and 4x the unpadded total) the tables stay as they are: one compile per bucket."""
    if not tables:
        return []
    c_pad = max(t.column_embeddings.shape[0] for t in tables)
    v_pad = max(t.categorical_embeddings.shape[0] for t in tables)
    now = sum(t.column_embeddings.nbytes + t.categorical_embeddings.nbytes for t in tables)
    row_bytes = tables[0].column_embeddings.shape[1] * tables[0].column_embeddings.itemsize
    if len(tables) * (c_pad + v_pad) * row_bytes > max(PAD_ALIKE_MIN_BYTES, 4 * now):
        return list(tables)

    def grow(a: np.ndarray, rows: int) -> np.ndarray:
        return a if a.shape[0] == rows else _pad_rows(a, rows)

    return [replace(t, column_embeddings=grow(t.column_embeddings, c_pad),
                    categorical_embeddings=grow(t.categorical_embeddings, v_pad)) for t in tables]


IDENTITY_SEED = 20261123


def identity_codes(n: int, d: int) -> np.ndarray:
    """[n, d] fixed pseudo-random unit vectors, row i the code of category-table row i (the same for every database:
    row i of a longer draw equals row i of a shorter one).

    Why: a category enters the model only as the frozen text embedding of "<column> is <value>", and short codes
    ("A" / "B", "Y" / "N", one-letter flags) embed almost alike (cosine 0.999, ../shared/findings.md), so their
    classes cannot be told apart on input or at the categorical head. Adding a code that differs per category keeps
    every category of a column distinct (random vectors in d dimensions are nearly orthogonal) while the text part
    still carries what the value means. The codes carry no meaning of their own and are not learned."""
    x = np.random.default_rng(IDENTITY_SEED).standard_normal((n, d), dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def value_codes(values: Sequence[str], d: int) -> np.ndarray:
    """[len(values), d] fixed pseudo-random unit vectors, one per value *string*: the same string gets the same
    code in every column, task and database.

    Why (beside `identity_codes`' reason): a derived task's categories form their own block of the category table,
    so with row-keyed codes the channel "web" of an order and the answer "web" of "the channel of the latest order"
    carry unrelated codes and the model must learn to map one onto the other; keyed by the value, copying a visible
    cell's category is the identity. Distinct values of one column still get distinct codes."""
    return np.stack([_value_code(str(v), d) for v in values]) if len(values) else np.zeros((0, d), np.float32)


@lru_cache(maxsize=1 << 16)
def _value_code(value: str, d: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(f"{IDENTITY_SEED}:{value}".encode()).digest()[:8], "little")
    x = np.random.default_rng(seed).standard_normal(d, dtype=np.float32)
    x /= max(float(np.linalg.norm(x)), 1e-12)
    x.setflags(write=False)
    return x


def column_keys(store: Any) -> list[str]:
    """The key of each row of a store's column table that its column code is drawn from: the text its embedding was
    made from (the same text, the same code, in any database), else "<table or task>.<name>".

    Why codes for columns too: a column enters every cell of it only as the frozen embedding of its name, and
    names that differ by a character or a number embed almost alike (x1 / x2 / x3: cosine 0.91-0.95; "... in the
    last 7 days" / "... 30 days": 0.98-0.99; docs/design/decisions.md, "Column codes"), so the model must first learn to
    tell them apart before it can read the right one."""
    n = int(np.asarray(store.column_embeddings).shape[0])
    out = [f"#{i}" for i in range(n)]
    for c in store.columns:
        if 0 <= int(c.column_idx) < n:
            out[int(c.column_idx)] = str(c.text or f"{c.table or c.task}.{c.name}")
    return out


def target_max_k(store: Any) -> int:
    """Largest K among the store's categorical *task targets*: the static width the loss pads to.

    (The store's `max_k` also counts categorical input columns, which never need a loss over their block.)"""
    return max((int(t.cat_count) for t in store.tasks if int(t.target_stype) == int(SemanticType.CATEGORICAL)),
               default=0)


def fitted_max_k(max_k: int, stores: Iterable[Any]) -> int:
    """The categorical block's width for `stores`: `max_k`, doubled until every categorical task target fits (a
    TPC-H part type has 150 classes, `small` pads to 128). Training and inference widen it the same way; the width
    shapes no parameter, only the padded logits."""
    return pow2_at_least(max([max_k, *(target_max_k(s) for s in stores)]), minimum=max_k)
