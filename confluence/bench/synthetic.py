"""A synthetic relational database that emits valid `TrainingBatch`es (contract of docs/design/architecture.md).

Used to build and test the model, loss, optimizer, train step, checkpoints and multi-device path independently of
the sampler and store, and by `confluence bench train`. The structure honours the contract: rows with all their
cells, FK edges child -> parent recorded in `fk_adj` between rows present in the sequence, the seed row first with
exactly one target cell, padding at the end, permutations with padding last, batch-local text ids, global
categorical ids inside each column's contiguous block. Targets are a deterministic function of another cell of the
seed row (plus noise), so a model can learn them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from confluence.batch import TrainingBatch, seq_arrays
from confluence.stypes import SemanticType

ST = SemanticType


@dataclass(frozen=True)
class SynthColumn:
    name: str
    stype: SemanticType
    column_idx: int
    cat_block_start: int = 0
    k: int = 0


@dataclass(frozen=True)
class SynthTable:
    name: str
    columns: tuple[SynthColumn, ...]
    parent: int | None  # index of the parent table (one FK), or None


@dataclass(frozen=True)
class SynthTask:
    name: str
    target_stype: SemanticType
    column: SynthColumn  # a column of table 0 (cell-masking task)


def _unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)


def _cyclic(rng: np.random.Generator, n: int) -> np.ndarray:
    ang = rng.uniform(0, 2 * np.pi, size=(n, 7))
    out = np.empty((n, 14), np.float32)
    out[:, 0::2] = np.sin(ang)
    out[:, 1::2] = np.cos(ang)
    return out


class SyntheticDatabase:
    """Three tables (seed table -> parent -> grandparent) with every semantic type, and four cell-masking tasks."""

    def __init__(self, seed: int = 0, d_t: int = 32, name: str = "synthetic", num_texts: int = 512):
        rng = np.random.default_rng([seed, 7])
        self.name, self.seed, self.d_t = name, seed, d_t
        specs = [
            ("orders", [("order_id", ST.IDENTIFIER), ("customer_id", ST.IDENTIFIER), ("amount", ST.NUMERICAL),
                        ("price", ST.NUMERICAL), ("placed_at", ST.TIMESTAMP), ("is_gift", ST.BOOLEAN),
                        ("status", ST.CATEGORICAL), ("note", ST.TEXT)], 1),
            ("customers", [("customer_id", ST.IDENTIFIER), ("region_id", ST.IDENTIFIER), ("age", ST.NUMERICAL),
                           ("segment", ST.CATEGORICAL), ("bio", ST.TEXT)], 2),
            ("regions", [("region_id", ST.IDENTIFIER), ("population", ST.NUMERICAL), ("name", ST.TEXT)], None),
        ]
        cols_all, tables, cat_start = [], [], 0
        for tname, cols, parent in specs:
            tcols = []
            for cname, st in cols:
                k = int(rng.integers(3, 9)) if st == ST.CATEGORICAL else 0
                c = SynthColumn(cname, st, len(cols_all), cat_start if k else 0, k)
                cat_start += k
                tcols.append(c)
                cols_all.append(c)
            tables.append(SynthTable(tname, tuple(tcols), parent))
        self.tables = tables
        self.columns = cols_all
        self.column_embeddings = _unit_rows(rng, len(cols_all), d_t)
        self.categorical_embeddings = _unit_rows(rng, cat_start, d_t)
        self.text_embeddings = _unit_rows(rng, num_texts, d_t)
        self.max_k = max(c.k for c in cols_all)
        t0 = {c.name: c for c in tables[0].columns}
        self.tasks = [
            SynthTask("orders.amount", ST.NUMERICAL, t0["amount"]),
            SynthTask("orders.placed_at", ST.TIMESTAMP, t0["placed_at"]),
            SynthTask("orders.is_gift", ST.BOOLEAN, t0["is_gift"]),
            SynthTask("orders.status", ST.CATEGORICAL, t0["status"]),
        ]

    # -- one row's cell values ------------------------------------------------------------------------------------
    def _row_values(self, rng: np.random.Generator, table: SynthTable) -> dict[str, tuple]:
        """name -> (is_null, value). Order targets are functions of `price`, so they are learnable from the row."""
        vals: dict[str, tuple] = {}
        price = float(rng.standard_normal())
        for c in table.columns:
            null = c.stype != ST.IDENTIFIER and rng.random() < 0.08
            if c.stype == ST.NUMERICAL:
                v = price if c.name == "price" else (0.8 * price + 0.1 * rng.standard_normal()
                                                     if c.name == "amount" else rng.standard_normal())
            elif c.stype == ST.TIMESTAMP:
                v = np.concatenate([_cyclic(rng, 1)[0], [price]]).astype(np.float32)
            elif c.stype == ST.BOOLEAN:
                v = bool(price > 0) if table.name == "orders" else bool(rng.random() < 0.5)
            elif c.stype == ST.CATEGORICAL:
                idx = int(np.clip((price + 2.0) / 4.0 * c.k, 0, c.k - 1)) if table.name == "orders" else int(
                    rng.integers(0, c.k))
                v = c.cat_block_start + idx
            elif c.stype == ST.TEXT:
                v = int(rng.integers(0, self.text_embeddings.shape[0]))
            else:
                v = None
            if c.name == "price":
                null = False
            vals[c.name] = (null, v)
        return vals

    # -- a batch --------------------------------------------------------------------------------------------------
    def batch(self, task_idx: int, batch_size: int, seq_len: int, max_rows: int, seed: int | tuple = 0,
              db_idx: int = 0) -> TrainingBatch:
        """A deterministic batch of task `task_idx` (same arguments -> same batch). R is padded to `max_rows` and U
        to a power of two >= B * max_rows (at most one text per row), so a configuration has one shape."""
        task = self.tasks[task_idx]
        rng = np.random.default_rng([self.seed, task_idx, *np.atleast_1d(seed).tolist()])
        b, s, r = batch_size, seq_len, max_rows
        a = seq_arrays(b, s, is_padding=True)
        fk_adj = np.zeros((b, r, r), bool)
        global_text = np.zeros((b, s), np.int64)
        for i in range(b):
            # Rows: the seed order, its customer, the customer's region, sibling orders of the customer.
            rows: list[tuple[int, int | None]] = [(0, None), (1, None), (2, None)]  # (table, parent row)
            rows[0] = (0, 1)
            rows[1] = (1, 2)
            n_sib = int(rng.integers(0, r))
            for _ in range(n_sib):
                rows.append((0, 1))
            pos, used_rows = 0, 0
            for row_id, (t, _parent) in enumerate(rows[:r]):
                table = self.tables[t]
                if pos + len(table.columns) > s and row_id > 0:
                    break
                vals = self._row_values(rng, table)
                for c in table.columns:
                    if pos >= s:
                        break
                    null, v = vals[c.name]
                    a["semantic_types"][i, pos] = int(c.stype)
                    a["column_ids"][i, pos] = c.column_idx
                    a["seq_row_ids"][i, pos] = row_id
                    a["is_padding"][i, pos] = False
                    a["is_null"][i, pos] = null
                    if not null:
                        if c.stype == ST.NUMERICAL:
                            a["numeric_values"][i, pos] = v
                        elif c.stype == ST.TIMESTAMP:
                            a["timestamp_values"][i, pos] = v
                        elif c.stype == ST.BOOLEAN:
                            a["bool_values"][i, pos] = v
                        elif c.stype == ST.CATEGORICAL:
                            a["categorical_embed_ids"][i, pos] = v
                        elif c.stype == ST.TEXT:
                            global_text[i, pos] = v + 1  # +1: 0 means "no text"
                    if row_id == 0 and c.column_idx == task.column.column_idx:
                        a["is_target"][i, pos] = True
                    pos += 1
                used_rows = row_id + 1
            for row_id, (_, parent) in enumerate(rows[:used_rows]):
                if parent is not None and parent < used_rows:
                    fk_adj[i, row_id, parent] = True
            n = pos
            pad_idx = np.arange(n, s)
            col = a["column_ids"][i, :n]
            a["col_perm"][i] = np.concatenate([np.argsort(col, kind="stable"), pad_idx])
            row = a["seq_row_ids"][i, :n].astype(np.int64)
            a["out_perm"][i] = np.concatenate([np.argsort(row, kind="stable"), pad_idx])
            order = rng.permutation(used_rows)  # a different row order for inbound
            a["in_perm"][i] = np.concatenate([np.argsort(order[row], kind="stable"), pad_idx])
        # Batch-wide text dedup -> batch-local ids.
        uniq = np.unique(global_text[global_text > 0])
        local = np.searchsorted(uniq, global_text)
        a["text_embed_ids"] = np.where(global_text > 0, local, 0).astype(np.uint32)
        u_pad = int(2 ** np.ceil(np.log2(b * r)))
        text = np.zeros((u_pad, self.d_t), np.float16)
        text[: len(uniq)] = self.text_embeddings[uniq - 1]
        is_cat = task.target_stype == ST.CATEGORICAL
        batch = TrainingBatch(
            **a, fk_adj=fk_adj, text_batch_embeddings=text, target_stype=int(task.target_stype),
            task_idx=task_idx, db_idx=db_idx, cat_block_start=task.column.cat_block_start if is_cat else 0,
            cat_count=task.column.k if is_cat else 0, seed_ids=np.arange(b, dtype=np.int64),
            anchor_rows=np.arange(b, dtype=np.int64), obs_times=np.full(b, np.iinfo(np.int64).max, np.int64),
            seq_valid=np.ones(b, bool),
        )
        batch.validate()
        return batch
