"""Sampler test helpers: an in-memory object with the `Store` reader API (docs/architecture.md).

`build_store(tables, tasks)` encodes small Python-described tables the way the store format does (packed
validity, u32 categorical / text indices, time-sorted child CSR, ...) so the sampler can be tested before and
independently of preprocessing. Import explicitly: `from tests.conftest_sampler import ...`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from confluence.stypes import SemanticType

ST = SemanticType
INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max


@dataclass
class Col:
    name: str
    stype: SemanticType
    values: np.ndarray  # numerical float (NaN null) | timestamp int64 µs (INT64_MIN null) | bool (+valid) |
    # categorical int code (-1 null) | text int id (-1 null) | identifier: FK parent local row (-1 null) / PK
    fk: str | None = None  # parent table name
    valid: np.ndarray | None = None  # explicit validity (booleans)


@dataclass
class Tab:
    name: str
    cols: list[Col]
    time: np.ndarray | None = None  # temporal value per row (INT64_MAX = NULL time)

    @property
    def n(self) -> int:
        return len(self.cols[0].values)


@dataclass
class TaskSpec:
    name: str
    table: str
    anchors: np.ndarray  # local rows of the anchor table
    obs: np.ndarray  # i64 observation times
    stype: SemanticType
    values: np.ndarray  # targets (float / int code / bool / int64 µs)
    valid: np.ndarray
    column: str | None = None  # cell masking: the anchor table's column; None: derived
    exclude: list[str] = field(default_factory=list)
    cat_count: int = 0


def ts_encode(us: np.ndarray) -> np.ndarray:
    """A deterministic stand-in for the 15-float timestamp encoding (distinct per value)."""
    x = np.asarray(us, dtype=np.float64)[:, None] / 1e12
    return np.concatenate([np.sin(x * np.arange(1, 15)), x], axis=1).astype(np.float32)


def _bits(mask: np.ndarray) -> np.ndarray:
    return np.packbits(np.asarray(mask, dtype=np.uint8), bitorder="little")


def build_store(tables: list[Tab], tasks: list[TaskSpec], d_t: int = 8, name: str = "mem", seed: int = 0):
    """An object with the `Store` attributes the sampler reads."""
    rng = np.random.default_rng(seed)
    offsets, off = {}, 0
    for t in tables:
        offsets[t.name] = off
        off += t.n
    n_rows = off
    columns, table_infos, values, validity = [], [], {}, {}
    col_idx = 0
    cat_start = 0
    n_texts = 0
    col_index = {}
    for ti, t in enumerate(tables):
        cinfos = []
        for c in t.cols:
            stats = {}
            v = np.asarray(c.values)
            if c.stype == ST.IDENTIFIER:
                valid = v >= 0 if c.fk else np.ones(t.n, bool)
                vals = None
            elif c.stype == ST.NUMERICAL:
                valid = ~np.isnan(v.astype(float))
                vals = np.where(valid, v, 0).astype(np.float32)
            elif c.stype == ST.TIMESTAMP:
                valid = v != INT64_MIN
                vals = np.where(valid[:, None], ts_encode(v), 0).astype(np.float32)
            elif c.stype == ST.BOOLEAN:
                valid = np.ones(t.n, bool) if c.valid is None else c.valid
                vals = _bits(v.astype(bool) & valid)
            elif c.stype == ST.CATEGORICAL:
                valid = v >= 0
                k = int(v.max()) + 1 if valid.any() else 1
                vals = np.where(valid, v + cat_start, 0).astype(np.uint32)
                stats = {"cat_emb_start": cat_start, "k": k}
                cat_start += k
            elif c.stype == ST.TEXT:
                valid = v >= 0
                vals = np.where(valid, v, 0).astype(np.uint32)
                n_texts = max(n_texts, int(v.max()) + 1 if valid.any() else 0)
            else:
                raise ValueError(c.stype)
            info = SimpleNamespace(column_idx=col_idx, table=t.name, task=None, name=c.name, stype=c.stype, stats=stats,
                                   foreign_key=f"{c.fk}.id" if c.fk else None)
            col_index[(t.name, c.name)] = col_idx
            col_idx += 1
            columns.append(info)
            cinfos.append(info)
            validity[(t.name, c.name)] = _bits(valid)
            values[(t.name, c.name)] = vals
        table_infos.append(SimpleNamespace(name=t.name, index=ti, num_rows=t.n, row_offset=offsets[t.name],
                                           primary_key=t.cols[0].name, temporal_column=None, columns=cinfos))
    row_time = np.full(n_rows, INT64_MIN, dtype=np.int64)
    for t in tables:
        if t.time is not None:
            row_time[offsets[t.name] : offsets[t.name] + t.n] = t.time
    par = [[] for _ in range(n_rows)]
    for t in tables:
        for c in t.cols:
            if c.fk:
                for i, p in enumerate(np.asarray(c.values)):
                    if p >= 0:
                        par[offsets[t.name] + i].append((offsets[c.fk] + int(p), col_index[(t.name, c.name)]))
    p_ptr = np.zeros(n_rows + 1, np.int64)
    p_idx, p_col = [], []
    chi = [[] for _ in range(n_rows)]
    for r in range(n_rows):
        for p, c in par[r]:
            p_idx.append(p)
            p_col.append(c)
            chi[p].append((row_time[r], r, c))
        p_ptr[r + 1] = len(p_idx)
    c_ptr = np.zeros(n_rows + 1, np.int64)
    c_idx, c_time, c_col = [], [], []
    for r in range(n_rows):
        for tm, ch, c in sorted(chi[r]):
            c_idx.append(ch)
            c_time.append(tm)
            c_col.append(c)
        c_ptr[r + 1] = len(c_idx)
    task_infos, task_arrays = [], {}
    for k, ts in enumerate(tasks):
        if ts.column is None:
            tcol = col_idx
            col_idx += 1
            columns.append(SimpleNamespace(column_idx=tcol, table=None, task=ts.name, name="target", stype=ts.stype, stats={}))
            derived = True
        else:
            tcol = col_index[(ts.table, ts.column)]
            derived = False
        v = np.asarray(ts.values)
        valid = np.asarray(ts.valid, bool)
        if ts.stype == ST.NUMERICAL:
            tv = np.where(valid, v, 0).astype(np.float32)
        elif ts.stype == ST.TIMESTAMP:
            tv = np.where(valid[:, None], ts_encode(v), 0).astype(np.float32)
        elif ts.stype == ST.BOOLEAN:
            tv = _bits(v.astype(bool) & valid)
        else:
            tv = np.where(valid, v + cat_start, 0).astype(np.uint32)
        cbs = cat_start if ts.stype == ST.CATEGORICAL else 0
        if ts.stype == ST.CATEGORICAL:
            cat_start += ts.cat_count
        order = np.lexsort((np.asarray(ts.obs), np.asarray(ts.anchors)))
        anchors = (offsets[ts.table] + np.asarray(ts.anchors, np.int64))[order]
        task_arrays[ts.name] = SimpleNamespace(
            anchor_row=anchors, obs_time=np.asarray(ts.obs, np.int64)[order],
            target_values=tv[order] if ts.stype != ST.BOOLEAN else _bits((v.astype(bool) & valid)[order]),
            target_valid=_bits(valid[order]),
        )
        task_infos.append(SimpleNamespace(
            name=ts.name, index=k, anchor_table=ts.table, target_stype=ts.stype, target_column_idx=tcol,
            is_derived=derived, exclude_column_idxs=[col_index[(ts.table, e)] for e in ts.exclude],
            cat_block_start=cbs, cat_count=ts.cat_count, num_seeds=len(anchors), stats={}))
    # one child-count column per foreign-key column, as preprocessing registers them
    for t in tables:
        for c in t.cols:
            if c.fk:
                columns.append(SimpleNamespace(
                    column_idx=col_idx, table=None, task=None, name=f"number of {t.name} rows by {c.name}",
                    stype=ST.NUMERICAL, stats={}, count_of={"parent_table": c.fk, "child_table": t.name,
                                                            "column": c.name, "column_idx": col_index[(t.name, c.name)]}))
                col_idx += 1
    store = SimpleNamespace(
        name=name, d_t=d_t, num_rows=n_rows, num_columns=col_idx, max_k=0, tables=table_infos, columns=columns,
        row_time=row_time, parent_indptr=p_ptr, parent_indices=np.asarray(p_idx, np.int64),
        parent_column=np.asarray(p_col, np.int32), child_indptr=c_ptr, child_indices=np.asarray(c_idx, np.int64),
        child_time=np.asarray(c_time, np.int64), child_column=np.asarray(c_col, np.int32),
        column_embeddings=rng.standard_normal((col_idx, d_t)).astype(np.float16),
        categorical_embeddings=rng.standard_normal((max(cat_start, 1), d_t)).astype(np.float16),
        text_embeddings=rng.standard_normal((n_texts, d_t)).astype(np.float16),
        tasks=task_infos,
    )
    store.values = lambda t, c: values[(t, c)]
    store.validity = lambda t, c: validity[(t, c)]
    store.task_arrays = lambda n: task_arrays[n]
    store.task = lambda n: next(x for x in task_infos if x.name == n)
    store.table = lambda n: next(x for x in table_infos if x.name == n)
    store.offsets = offsets
    return store


def bookstore(extra_orders: int = 0):
    """The bookstore of seed 000 section 4: customer 23, book 42, orders 1, 7, 12, 5 (+ a later order 99).

    Local rows: customers [23], books [42], orders [1, 7, 12, 5, 99, ...]. Order 99 (customer 23) is after order
    1's observation time, so it must never appear in order 1's context.
    """
    day = 86_400_000_000
    order_ids = [1, 7, 12, 5, 99]
    cust = [0, 0, 0, -1, 0]
    book = [0, -1, -1, 0, -1]
    times = [10 * day, 3 * day, 4 * day, 5 * day, 20 * day]
    rating = [4.0, 5.0, np.nan, 3.0, 1.0]
    for i in range(extra_orders):
        order_ids.append(1000 + i)
        cust.append(0)
        book.append(0)
        times.append((6 + (i % 4)) * day)
        rating.append(float(i % 5))
    tables = [
        Tab("customers", [Col("customer_id", ST.IDENTIFIER, np.array([23])),
                          Col("country", ST.CATEGORICAL, np.array([1])),
                          Col("bio", ST.TEXT, np.array([0]))]),
        Tab("books", [Col("book_id", ST.IDENTIFIER, np.array([42])),
                      Col("title", ST.TEXT, np.array([1])),
                      Col("price", ST.NUMERICAL, np.array([12.5]))]),
        Tab("orders", [Col("order_id", ST.IDENTIFIER, np.array(order_ids)),
                       Col("customer_id", ST.IDENTIFIER, np.array(cust), fk="customers"),
                       Col("book_id", ST.IDENTIFIER, np.array(book), fk="books"),
                       Col("ordered_at", ST.TIMESTAMP, np.array(times, np.int64)),
                       Col("rating", ST.NUMERICAL, np.array(rating)),
                       Col("gift", ST.BOOLEAN, np.arange(len(order_ids)) % 2 == 0)],
            time=np.array(times, np.int64)),
    ]
    n = len(order_ids)
    tasks = [
        TaskSpec("rating", "orders", np.arange(n), np.array(times, np.int64), ST.NUMERICAL, np.nan_to_num(rating),
                 ~np.isnan(rating), column="rating"),
        TaskSpec("will_reorder", "orders", np.arange(n), np.array(times, np.int64), ST.BOOLEAN,
                 np.arange(n) % 3 == 0, np.ones(n, bool)),
        TaskSpec("next_order_at", "orders", np.arange(n), np.array(times, np.int64), ST.TIMESTAMP,
                 np.array(times, np.int64) + day, np.arange(n) != 2),
        # predict an order's customer with its customer_id foreign key excluded: that parent edge must be cut
        TaskSpec("whose_order", "orders", np.arange(n), np.array(times, np.int64), ST.BOOLEAN,
                 np.array(cust) == 0, np.ones(n, bool), exclude=["customer_id"]),
        TaskSpec("country", "customers", np.array([0]), np.array([INT64_MAX]), ST.CATEGORICAL, np.array([1]),
                 np.array([True]), column="country", cat_count=2),
    ]
    return build_store(tables, tasks, name="bookstore")


def random_store(seed: int, n_tables: int = 4, max_rows: int = 40, with_text: bool = True):
    """A random database: tables with FKs to earlier tables, some temporal, mixed column types; one task per
    temporal-or-not table on a numerical column."""
    rng = np.random.default_rng(seed)
    tables, sizes = [], []
    for ti in range(n_tables):
        n = int(rng.integers(1, max_rows + 1))
        cols = [Col(f"id{ti}", ST.IDENTIFIER, np.arange(n))]
        for pj in range(ti):
            if rng.random() < 0.6:
                fk = rng.integers(0, sizes[pj], n)
                fk[rng.random(n) < 0.1] = -1
                cols.append(Col(f"fk{ti}_{pj}", ST.IDENTIFIER, fk, fk=f"t{pj}"))
        x = rng.standard_normal(n)
        x[rng.random(n) < 0.2] = np.nan
        cols.append(Col(f"x{ti}", ST.NUMERICAL, x))
        cols.append(Col(f"c{ti}", ST.CATEGORICAL, rng.integers(-1, 3, n)))
        if with_text:
            cols.append(Col(f"s{ti}", ST.TEXT, rng.integers(-1, 50, n)))
        time = None
        if rng.random() < 0.6:
            time = rng.integers(0, 100, n).astype(np.int64)
            time[rng.random(n) < 0.05] = INT64_MAX
            cols.append(Col(f"t{ti}", ST.TIMESTAMP, np.where(time == INT64_MAX, INT64_MIN, time)))
        tables.append(Tab(f"t{ti}", cols, time))
        sizes.append(n)
    tasks = []
    for t in tables:
        n = t.n
        obs = t.time.copy() if t.time is not None else np.full(n, INT64_MAX, np.int64)
        x = t.cols[[c.name for c in t.cols].index(f"x{t.name[1:]}")].values
        # odd tables hide their first foreign key (its parent edge from the anchor is cut)
        fks = [c.name for c in t.cols if c.fk]
        exclude = fks[:1] if int(t.name[1:]) % 2 == 1 else []
        tasks.append(TaskSpec(f"x_{t.name}", t.name, np.arange(n), obs, ST.NUMERICAL, np.nan_to_num(x),
                              ~np.isnan(x), column=f"x{t.name[1:]}", exclude=exclude))
    return build_store(tables, tasks, name=f"random{seed}")
