"""Gradient-boosted-trees baseline: LightGBM on hand-made relational features, one model per task.

Features for a seed (anchor row `a`, observation time `t`), built with DuckDB SQL over the processed store:

* the anchor row's own columns (minus the target column of a cell-masking task and the task's
  `exclude_columns`);
* its parents' columns (one hop, per foreign key) and their parents' (two hops), NULL when the parent row belongs
  to a temporal table and was created after `t`;
* aggregates over the anchor's child rows that existed at `t` (time <= t): count, mean of each numerical column
  and the last value of each numerical / categorical / boolean column;
* the observation time's calendar features (days since the epoch, hour, weekday, day of month, month, day of
  year) for a task with an `observation_time_column`, which the model sees as a cell too;
* aggregates over the *siblings* reached through each parent (the parent's other children), restricted to
  children strictly before `t` (time < t), so neither the anchor row itself nor a row created at the same moment
  can leak the target.

Aggregates are running statistics per parent, ordered by time and looked up with an ASOF join, so the cost is
O(rows + seeds · log) rather than seeds × children. Rows of static tables (no temporal column) are always
visible, as in the sampler.

Threads: DuckDB uses the CPUs the process is given (`toolkit.threads.usable_cpus`); LightGBM as many of them as
other processes leave free when its fit starts (`toolkit.threads.free_cpus`): with more threads than free cores its
rounds were 4-8x slower beside one busy process on a 2-core box (docs/design/evaluation.md, "LightGBM beside other work").
Its results do not depend on the thread count (`deterministic`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from confluence.evaluation import metrics as M
from confluence.preprocess.encode import calendar_fields
from confluence.sampler.splits import subsample
from confluence.store.format import unpack_bits
from confluence.stypes import US_PER_DAY, SemanticType
from confluence.targets import DecodedTargets, decode_targets, kind
from confluence.toolkit.threads import free_cpus, usable_cpus

FEATURE_STYPES = (SemanticType.NUMERICAL, SemanticType.CATEGORICAL, SemanticType.BOOLEAN, SemanticType.TIMESTAMP)


def observation_time_features(obs_us: np.ndarray) -> dict[str, np.ndarray]:
    """Calendar features of observation times (epoch µs; `preprocess.encode.calendar_fields`, the fields the
    model's timestamp encoding is built from): days since the epoch, hour, weekday (Monday = 0), day of month,
    month and day of year (1-based)."""
    cal = calendar_fields(obs_us)
    return {
        "obs:days": np.asarray(obs_us, dtype=np.float64) / US_PER_DAY,
        "obs:hour": cal["hour"].astype(np.float64),
        "obs:weekday": cal["weekday"].astype(np.float64),
        "obs:day_of_month": cal["day_of_month0"].astype(np.float64) + 1,
        "obs:month": cal["month0"].astype(np.float64) + 1,
        "obs:day_of_year": cal["day_of_year0"].astype(np.float64) + 1,
    }


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass
class FeatureTable:
    """The design matrix of a set of seeds: float64 [n, f] with NaN for missing, and which columns are categorical."""

    x: np.ndarray
    names: list[str]
    categorical: list[int] = field(default_factory=list)
    obs: np.ndarray | None = None  # each row's observation time (epoch µs; NO_CUTOFF: none), for timestamp targets


@dataclass
class _Block:
    """One query of a feature table: its SQL, the features it gives, which are categorical, what it is in words
    (for progress) and the running-aggregate table it reads, built on first use (None: none)."""

    sql: str
    names: list[str]
    cats: list[bool]
    what: str
    running: tuple[int, str] | None = None  # (foreign-key column idx, child table)


class FeatureBuilder:
    """Builds GBDT features for seeds of any task of one store. Table frames are built once and reused.
    `threads`: DuckDB's threads (default: the CPUs the process may use, not DuckDB's count of the machine's);
    `progress` (a `Reporter`) sees the tables loaded into DuckDB as one step."""

    def __init__(self, store: Any, threads: int | None = None, progress: Any = None):
        self.store = store
        self.con = duckdb.connect()
        # progress is ours to show (`progress`, a Reporter): DuckDB's own bar printed through `--no-progress`
        self.con.execute("SET enable_progress_bar = false")
        self.con.execute(f"SET threads = {int(threads or usable_cpus())}")
        self._frames: dict[str, list[tuple[str, SemanticType]]] = {}
        if progress is not None:
            progress.step("LightGBM: the store's foreign keys and tables into DuckDB", 1 + len(store.tables))
        self._register_edges()
        if progress is not None:
            progress.advance(1)
        for table in store.tables:
            self._register_table(table)
            if progress is not None:
                progress.advance(1)

    # ----------------------------------------------------------------------------------------------- registration
    def _register_edges(self) -> None:
        s = self.store
        n = len(s.parent_indptr) - 1
        child = np.repeat(np.arange(n, dtype=np.int64), np.diff(np.asarray(s.parent_indptr)))
        edges = pa.table(
            {
                "child": child,
                "parent": np.asarray(s.parent_indices, dtype=np.int64),
                "col": np.asarray(s.parent_column, dtype=np.int32),
                "child_time": np.asarray(s.row_time, dtype=np.int64)[child] if n else np.zeros(0, np.int64),
            }
        )
        self.con.register("edges_arrow", edges)
        self.con.execute("CREATE TABLE edges AS SELECT * FROM edges_arrow")
        self.con.unregister("edges_arrow")

    def _register_table(self, table: Any) -> None:
        s = self.store
        n = int(table.num_rows)
        off = int(table.row_offset)
        cols: dict[str, Any] = {
            "row": np.arange(off, off + n, dtype=np.int64),
            "time": np.asarray(s.row_time[off : off + n], dtype=np.int64),
        }
        feats: list[tuple[str, SemanticType]] = []
        for col in table.columns:
            stype = SemanticType(col.stype)
            if stype not in FEATURE_STYPES:
                continue
            valid = unpack_bits(s.validity(table.name, col.name), n)
            raw = s.values(table.name, col.name)
            if stype == SemanticType.NUMERICAL:
                v = np.asarray(raw, dtype=np.float64)
            elif stype == SemanticType.TIMESTAMP:
                v = np.asarray(raw[:, 14], dtype=np.float64)
            elif stype == SemanticType.BOOLEAN:
                v = unpack_bits(raw, n).astype(np.float64)
            else:
                v = np.asarray(raw, dtype=np.float64) - float(col.stats.get("cat_emb_start", 0))
            name = f"c{col.column_idx}"
            cols[name] = pa.array(v, mask=~valid)  # SQL NULL (not NaN) so aggregates skip missing values
            feats.append((name, stype))
        self._frames[table.name] = feats
        arrow = pa.table(cols)
        self.con.register("frame_arrow", arrow)
        self.con.execute(f"CREATE TABLE {_q('t_' + table.name)} AS SELECT * FROM frame_arrow")
        self.con.unregister("frame_arrow")

    # --------------------------------------------------------------------------------------------------- features
    def _column_name(self, feat: str) -> str:
        col = self.store.columns[int(feat[1:])]
        return f"{col.table}.{col.name}"

    def _fk_columns(self, table_name: str) -> list[tuple[int, str]]:
        """(global column idx, parent table) of each foreign key of a table."""
        out = []
        meta = self.store.meta["database"]["tables"][table_name]["columns"]
        for col in self.store.table(table_name).columns:
            fk = meta.get(col.name, {}).get("foreign_key")
            if fk:
                out.append((int(col.column_idx), fk.split(".", 1)[0]))
        return out

    def _children_of(self, table_name: str) -> list[tuple[int, str]]:
        """(FK column idx, child table) of every foreign key pointing at `table_name`."""
        out = []
        for t in self.store.tables:
            for cidx, parent in self._fk_columns(t.name):
                if parent == table_name:
                    out.append((cidx, t.name))
        return out

    def build(self, task_name: str, seed_ids: np.ndarray, progress: Any = None, description: str = "") -> FeatureTable:
        """Feature matrix for the given seeds of a task (rows in the order of `seed_ids`). `progress` (a
        `Reporter`) sees one step, `description` (default "<task>: features"), of one unit per query, and a note
        naming each query's feature family (parents, siblings, children through which key) while it runs."""
        arrays = self.store.task_arrays(task_name)
        ids = np.asarray(seed_ids, dtype=np.int64)
        return self.build_anchors(task_name, np.asarray(arrays.anchor_row, dtype=np.int64)[ids],
                                  np.asarray(arrays.obs_time, dtype=np.int64)[ids], progress, description)

    def build_anchors(self, task_name: str, anchor_rows: np.ndarray, obs_times: np.ndarray, progress: Any = None,
                      description: str = "") -> FeatureTable:
        """`build` for arbitrary anchors of a task: global anchor rows and their observation times (epoch µs;
        `NO_CUTOFF` sees every row), such as `predict --anchors` resolves them. A seed of the task given as its
        (anchor row, observation time) gets the features `build` gives it."""
        task = self.store.task(task_name)
        hidden = set(int(c) for c in task.exclude_column_idxs)
        if not task.is_derived:
            hidden.add(int(task.target_column_idx))
        return self.build_rows(task.anchor_table, anchor_rows, obs_times, hidden=hidden,
                               observation_features=int(getattr(task, "obs_column_idx", -1)) >= 0,
                               progress=progress, description=description or f"{task_name}: features")

    def build_rows(self, table: str, rows: np.ndarray, obs_times: np.ndarray, *, hidden: Collection[int] = (),
                   observation_features: bool = False, progress: Any = None,
                   description: str = "") -> FeatureTable:
        """The features of any rows of `table` (global rows) at observation times (epoch µs), without a task:
        what `build_anchors` gives a task's anchors, less the columns in `hidden` (global column indices; a
        foreign key there drops its parents too); `observation_features` adds the times' calendar features. Link
        rankers use it for anchors and for candidate target rows."""
        anchor_rows = np.asarray(rows, dtype=np.int64)
        obs_times = np.asarray(obs_times, dtype=np.int64)
        seeds = pa.table(
            {
                "seed_id": np.arange(len(anchor_rows), dtype=np.int64),
                "anchor": anchor_rows,
                "obs": obs_times,
            }
        )
        con = self.con
        con.register("seeds_arrow", seeds)
        con.execute("CREATE OR REPLACE TEMP TABLE seeds AS SELECT * FROM seeds_arrow")
        con.unregister("seeds_arrow")
        anchor, skip = table, {int(c) for c in hidden}

        blocks: list[_Block] = []

        def frame_select(alias: str, table: str, prefix: str, skip: set[int] = frozenset()) -> tuple[list[str], list[str], list[bool]]:
            exprs, names, cats = [], [], []
            for feat, stype in self._frames[table]:
                if int(feat[1:]) in skip:
                    continue
                out = f"{prefix}{self._column_name(feat)}"
                exprs.append(f"{alias}.{feat} AS {_q(out)}")
                names.append(out)
                cats.append(stype == SemanticType.CATEGORICAL)
            return exprs, names, cats

        # Anchor row.
        exprs, names, cats = frame_select("a", anchor, "", skip)
        if exprs:
            blocks.append(_Block(
                f"SELECT s.seed_id, {', '.join(exprs)} FROM seeds s JOIN {_q('t_' + anchor)} a ON a.row = s.anchor",
                names, cats, f"the {anchor} row's columns",
            ))
        # Parents (one and two hops), invisible when created after the observation time.
        for c1, p1 in self._fk_columns(anchor):
            if c1 in skip:
                continue
            pre1 = f"p:{self._column_name(f'c{c1}')}->"
            exprs, names, cats = frame_select("p", p1, pre1)
            fk1 = self._column_name(f"c{c1}")
            if exprs:
                blocks.append(_Block(
                    f"SELECT s.seed_id, {', '.join(exprs)} FROM seeds s JOIN edges e ON e.child = s.anchor AND e.col = {c1} "
                    f"JOIN {_q('t_' + p1)} p ON p.row = e.parent AND p.time <= s.obs",
                    names, cats, f"the {p1} parent through {fk1}",
                ))
            for c2, p2 in self._fk_columns(p1):
                pre2 = f"{pre1}{self._column_name(f'c{c2}')}->"
                exprs, names, cats = frame_select("g", p2, pre2)
                if exprs:
                    blocks.append(_Block(
                        f"SELECT s.seed_id, {', '.join(exprs)} FROM seeds s "
                        f"JOIN edges e ON e.child = s.anchor AND e.col = {c1} "
                        f"JOIN {_q('t_' + p1)} p ON p.row = e.parent AND p.time <= s.obs "
                        f"JOIN edges e2 ON e2.child = p.row AND e2.col = {c2} "
                        f"JOIN {_q('t_' + p2)} g ON g.row = e2.parent AND g.time <= s.obs",
                        names, cats, f"the {p2} grandparent through {fk1}, {self._column_name(f'c{c2}')}",
                    ))
            # Siblings through this parent: the parent's children strictly before the observation time.
            for cc, ct in self._children_of(p1):
                pre = f"sib:{self._column_name(f'c{c1}')}<-{self._column_name(f'c{cc}')}:"
                join = (f"JOIN edges e ON e.child = s.anchor AND e.col = {c1} "
                        f"JOIN {_q('t_' + p1)} vp ON vp.row = e.parent AND vp.time <= s.obs")
                blocks.append(self._child_aggregates("e.parent", join, cc, ct, pre, strict=True,
                                                     what=f"{ct} siblings through {fk1}"))
        # The anchor's own children at the observation time.
        for cc, ct in self._children_of(anchor):
            pre = f"child:{self._column_name(f'c{cc}')}:"
            blocks.append(self._child_aggregates("s.anchor", "", cc, ct, pre, strict=False,
                                                 what=f"{ct} children through {self._column_name(f'c{cc}')}"))

        n = len(anchor_rows)
        all_names: list[str] = []
        all_cats: list[int] = []
        columns: list[np.ndarray] = []
        blocks = [b for b in blocks if b.names]
        if progress is not None:
            progress.step(description or f"{table}: features", len(blocks))
        note = getattr(progress, "note", None)
        for block in blocks:
            if block.running is not None and not self._has_table(f"cum_{block.running[0]}"):
                if note is not None:
                    fk_col, child = block.running
                    note(f"running aggregates of {child} rows per {self._column_name(f'c{fk_col}')} (built once)")
                self._build_running(*block.running)
            if note is not None:
                note(block.what)
            res = con.execute(f"SELECT * FROM ({block.sql}) ORDER BY seed_id").fetchnumpy()
            rows = np.asarray(res["seed_id"], dtype=np.int64)
            for name, is_cat in zip(block.names, block.cats, strict=True):
                col = np.full(n, np.nan)
                vals = res[name]
                vals = np.asarray(vals.filled(np.nan) if np.ma.isMaskedArray(vals) else vals, dtype=np.float64)
                col[rows] = vals  # a seed has at most one row per block (one parent per FK, one aggregate row)
                if is_cat:
                    all_cats.append(len(all_names))
                all_names.append(name)
                columns.append(col)
            if progress is not None:
                progress.advance(1)
        if observation_features:
            # the model sees the observation time as a cell (see preprocess/pipeline.py); so does LightGBM
            for name, col in observation_time_features(obs_times).items():
                all_names.append(name)
                columns.append(col)
        x = np.stack(columns, axis=1) if columns else np.zeros((n, 0))
        return FeatureTable(x=x, names=all_names, categorical=all_cats, obs=obs_times)

    def bridge_links(self, anchor_table: str, target_table: str, rows: np.ndarray,
                     obs_times: np.ndarray) -> list[tuple[str, dict[str, np.ndarray]]]:
        """Per "bridge" (a table with a foreign key to `anchor_table` and another to `target_table`, such as a
        plane's flights to airports), the target rows each of `rows` reached through its bridge rows that existed
        at its observation time (time <= T, as the child aggregates): (bridge name, {"seed": position in `rows`,
        "row": global target row, "count": bridge rows, "last": the newest one's time}), sorted by (seed, row)."""
        seeds = pa.table({"seed_id": np.arange(len(rows), dtype=np.int64),
                          "anchor": np.asarray(rows, dtype=np.int64), "obs": np.asarray(obs_times, dtype=np.int64)})
        self.con.register("bridge_seeds", seeds)
        out = []
        for ca, child in self._children_of(anchor_table):
            for cb, parent in self._fk_columns(child):
                if parent != target_table or cb == ca:
                    continue
                res = self.con.execute(
                    f"SELECT s.seed_id AS seed, e2.parent AS row, count(*) AS count, max(e1.child_time) AS last "
                    f"FROM bridge_seeds s JOIN edges e1 ON e1.parent = s.anchor AND e1.col = {ca} "
                    f"AND e1.child_time <= s.obs JOIN edges e2 ON e2.child = e1.child AND e2.col = {cb} "
                    f"GROUP BY ALL ORDER BY seed, row").fetchnumpy()
                name = f"{self._column_name(f'c{ca}')}->{self._column_name(f'c{cb}')}"
                out.append((name, {k: np.asarray(v, dtype=np.int64) for k, v in res.items()}))
        self.con.unregister("bridge_seeds")
        return out

    def _build_running(self, fk_col: int, child_table: str) -> None:
        """The table `cum_<fk_col>`: per parent and child time, the running count, means and last values of the
        child table's columns up to that time (what `_child_aggregates` looks up)."""
        feats = self._frames[child_table]
        cum = f"cum_{fk_col}"
        per_time = ", ".join(
            ["count(*) AS n"]
            + [f"sum({f}) AS s_{f}, count({f}) AS k_{f}" for f, st in feats if st == SemanticType.NUMERICAL]
            + [f"arg_max({f}, ch.row) AS l_{f}" for f, _ in feats]
        )
        running = ", ".join(
            ["sum(n) OVER w AS n"]
            + [f"sum(s_{f}) OVER w / nullif(sum(k_{f}) OVER w, 0) AS m_{f}" for f, st in feats if st == SemanticType.NUMERICAL]
            + [f"l_{f}" for f, _ in feats]
        )
        self.con.execute(
            f"CREATE TEMP TABLE {cum} AS SELECT parent, time, {running} FROM ("
            f"SELECT e.parent, ch.time, {per_time} FROM edges e JOIN {_q('t_' + child_table)} ch ON ch.row = e.child "
            f"WHERE e.col = {fk_col} GROUP BY e.parent, ch.time) "
            f"WINDOW w AS (PARTITION BY parent ORDER BY time ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
        )

    def _child_aggregates(self, key_expr: str, join: str, fk_col: int, child_table: str, prefix: str,
                          strict: bool, what: str) -> _Block:
        """Running count / mean / last value of a child table's columns per parent, ASOF-joined at the seed's time
        (the running table is built when the block first runs)."""
        feats = self._frames[child_table]
        cum = f"cum_{fk_col}"
        op = ">" if strict else ">="
        names, cats, exprs = [f"{prefix}count"], [False], [f"coalesce(c.n, 0) AS {_q(prefix + 'count')}"]
        for f, st in feats:
            cname = self._column_name(f)
            if st == SemanticType.NUMERICAL:
                exprs.append(f"c.m_{f} AS {_q(prefix + 'mean:' + cname)}")
                names.append(prefix + "mean:" + cname)
                cats.append(False)
            exprs.append(f"c.l_{f} AS {_q(prefix + 'last:' + cname)}")
            names.append(prefix + "last:" + cname)
            cats.append(st == SemanticType.CATEGORICAL)
        sql = (f"SELECT s.seed_id, {', '.join(exprs)} FROM seeds s {join} "
               f"ASOF LEFT JOIN {cum} c ON c.parent = {key_expr} AND s.obs {op} c.time")
        return _Block(sql, names, cats, what, running=(fk_col, child_table))

    def _has_table(self, name: str) -> bool:
        return bool(self.con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchall()[0][0])


# ------------------------------------------------------------------------------------------------------- training


@dataclass
class GBDTModel:
    """A fitted LightGBM of one task, able to predict any feature table of its store's `FeatureBuilder` (the
    seeds of a split, or arbitrary anchors): predictions in the units of `GBDTResult.predictions`.

    `codes`: per categorical feature column (`categorical`), the raw values coded 0..k-1 when it was fitted; a
    value outside them gets code k, one no train row had (LightGBM sends it where unseen categories go)."""

    task: str
    booster: Any
    stype: SemanticType
    num_classes: int
    categorical: list[int]
    codes: list[np.ndarray]
    feature_names: list[str]
    params: dict[str, Any] = field(default_factory=dict)
    # what the target kind needs to read the raw output back (`TargetKind.gbdt_target`): a number's or a time's
    # (mean, std) as `scale`; a time regressed as its offset from the observation time says `relative`, with
    # `fallback_obs` standing in for a row without one (the train rows' median observation time)
    fit: dict[str, Any] = field(default_factory=dict)

    def predict(self, features: FeatureTable) -> np.ndarray:
        """P(true) (boolean), [n, K] probabilities (categorical), values or epoch µs (numerical, timestamp)."""
        n = features.x.shape[0]
        target = kind(self.stype)
        if n == 0:
            return target.empty_predictions(self.num_classes)
        x = np.array(features.x, dtype=np.float64, copy=True)
        encode_categories(x, self.categorical, self.codes)
        return target.gbdt_output(self.booster.predict(x), n, self.num_classes, self.fit, features.obs)


@dataclass
class GBDTResult:
    task: str
    metrics: dict[str, float]
    predictions: np.ndarray  # raw units (see confluence.targets), or probabilities [n, K] for categorical
    feature_names: list[str]
    num_train: int
    params: dict[str, Any] = field(default_factory=dict)  # LightGBM's parameters (threads included)
    # with `fit_gbdt(val_ids=...)`: predictions on the validation seeds' non-null targets (the same units)
    val_predictions: np.ndarray | None = None
    model: GBDTModel | None = None  # the fitted model, to predict other rows


def category_codes(tables: Sequence[np.ndarray], columns: Sequence[int]) -> list[np.ndarray]:
    """Per categorical feature column, the sorted raw values (finite, >= 0) seen in any of `tables`: the values
    coded 0..k-1 (`encode_categories`)."""
    codes = []
    for j in columns:
        values = np.concatenate([t[:, j] for t in tables]) if tables else np.zeros(0)
        codes.append(np.unique(values[np.isfinite(values) & (values >= 0)]))
    return codes


def encode_categories(x: np.ndarray, columns: Sequence[int], codes: Sequence[np.ndarray]) -> None:
    """Renumber each categorical column of `x` in place to its value's position in `codes` (0..k-1); a value not
    in `codes` gets k; NaN and negatives stay missing."""
    for j, seen in zip(columns, codes, strict=True):
        col = x[:, j]
        ok = np.isfinite(col) & (col >= 0)
        pos = np.searchsorted(seen, col[ok])
        hit = pos < len(seen)
        hit[hit] = seen[pos[hit]] == col[ok][hit]
        col[ok] = np.where(hit, pos, len(seen))
        col[~ok] = np.nan


def dense_categories(x_train: np.ndarray, x_eval: np.ndarray, columns: Sequence[int]) -> None:
    """Renumber each categorical feature column, in place, to 0..k-1 over the values seen in either table (NaN and
    negatives stay missing). LightGBM wants consecutive codes: category ids of a big table are sparse, and it warns
    ("Met categorical feature which contains sparse values") and bins them worse otherwise."""
    codes = category_codes([x_train, x_eval], columns)
    for x in (x_train, x_eval):
        encode_categories(x, columns, codes)


def fit_gbdt(
    store: Any,
    task_name: str,
    train_ids: np.ndarray,
    eval_ids: np.ndarray,
    *,
    builder: FeatureBuilder | None = None,
    max_train: int = 50_000,
    num_boost_round: int = 100,
    seed: int = 0,
    progress: Any = None,
    val_ids: np.ndarray | None = None,
) -> GBDTResult:
    """Train LightGBM on the train seeds of a task and report `evaluate`'s metrics on the eval seeds.

    `val_ids`: also predict these seeds (their non-null targets; `GBDTResult.val_predictions`) with the same fit,
    e.g. the validation seeds a blend weight is chosen on: they are never trained on.
    `progress` (a `confluence.toolkit.progress.Reporter`) sees three steps: the train seeds' feature table and the
    eval seeds' (a unit per query, each named while it runs), then LightGBM's rounds (and with `val_ids` the
    validation seeds' features). LightGBM runs on the CPUs other work leaves free (`toolkit.threads.free_cpus`);
    its answers are the same on any thread count."""
    builder = builder or FeatureBuilder(store)
    train_ids = subsample(np.asarray(train_ids, dtype=np.int64), max_train, seed)
    eval_ids = np.asarray(eval_ids, dtype=np.int64)
    y_tr = decode_targets(store, task_name, train_ids)
    y_ev = decode_targets(store, task_name, eval_ids)
    keep_tr = ~y_tr.is_null
    keep_ev = ~y_ev.is_null
    f_tr = builder.build(task_name, train_ids[keep_tr], progress,
                         f"{task_name}: LightGBM features of {int(keep_tr.sum())} train seeds")
    f_ev = builder.build(task_name, eval_ids[keep_ev], progress,
                         f"{task_name}: LightGBM features of {int(keep_ev.sum())} eval seeds")
    # categories coded over the train and eval tables (as before validation rows were predicted too): the eval
    # predictions do not depend on whether `val_ids` is given
    model = train_booster(task_name, y_tr, f_tr, code_tables=[f_ev], num_boost_round=num_boost_round, seed=seed,
                          progress=progress)
    raw = model.predict(f_ev)
    truth = y_ev.values[keep_ev]
    stype = y_tr.stype
    train_std = kind(stype).target_std(y_tr.values[keep_tr]) or None
    metrics = M.metrics_for(stype, truth, raw, target_std=train_std)
    metrics = {k: (float(v) if not (isinstance(v, float) and math.isnan(v)) else math.nan) for k, v in metrics.items()}
    val_pred = None
    if val_ids is not None:
        val_pred = predict_seeds(model, builder, val_ids, progress, "validation")
    return GBDTResult(task=task_name, metrics=metrics, predictions=raw, feature_names=f_tr.names,
                      num_train=int(keep_tr.sum()), params=model.params, val_predictions=val_pred, model=model)


def predict_seeds(model: GBDTModel, builder: FeatureBuilder, seed_ids: np.ndarray, progress: Any = None,
                  what: str = "") -> np.ndarray:
    """A fitted model's predictions on the seeds of its task whose target is not null (in their order)."""
    ids = np.asarray(seed_ids, dtype=np.int64)
    keep = ~decode_targets(builder.store, model.task, ids).is_null
    f = builder.build(model.task, ids[keep], progress,
                      f"{model.task}: LightGBM features of {int(keep.sum())} {what + ' ' if what else ''}seeds")
    return model.predict(f)


def train_gbdt(
    store: Any,
    task_name: str,
    train_ids: np.ndarray,
    *,
    builder: FeatureBuilder | None = None,
    max_train: int = 50_000,
    num_boost_round: int = 100,
    seed: int = 0,
    progress: Any = None,
) -> GBDTModel:
    """`fit_gbdt`'s LightGBM, trained on the train seeds of a task (at most `max_train`, chosen as there), to
    predict any rows later (`GBDTModel.predict` of a `FeatureBuilder.build` / `build_anchors` table)."""
    builder = builder or FeatureBuilder(store)
    train_ids = subsample(np.asarray(train_ids, dtype=np.int64), max_train, seed)
    y_tr = decode_targets(store, task_name, train_ids)
    keep_tr = ~y_tr.is_null
    f_tr = builder.build(task_name, train_ids[keep_tr], progress,
                         f"{task_name}: LightGBM features of {int(keep_tr.sum())} train seeds")
    return train_booster(task_name, y_tr, f_tr, num_boost_round=num_boost_round, seed=seed, progress=progress)


def train_booster(task_name: str, y_tr: DecodedTargets, f_tr: FeatureTable, *,
                  code_tables: Sequence[FeatureTable] = (), num_boost_round: int = 100, seed: int = 0,
                  progress: Any = None) -> GBDTModel:
    """LightGBM on a train feature table (`y_tr`: the targets of its seeds, nulls included; `f_tr` the non-null
    rows' features). Categorical features are coded over `f_tr` and `code_tables` (`category_codes`)."""
    import lightgbm as lgb

    keep_tr = ~y_tr.is_null
    x_tr = np.array(f_tr.x, dtype=np.float64, copy=True)
    codes = category_codes([f_tr.x, *(t.x for t in code_tables)], f_tr.categorical)
    encode_categories(x_tr, f_tr.categorical, codes)
    stype = y_tr.stype
    params: dict[str, Any] = {
        "learning_rate": 0.05, "num_leaves": 63, "min_data_in_leaf": 20, "feature_fraction": 0.9,
        "bagging_fraction": 0.9, "bagging_freq": 1, "seed": seed, "deterministic": True, "verbose": -1,
        # the CPUs free now, not a fixed count: more threads than free cores stall every round (the answers do not
        # change: `deterministic` gives the same model on any thread count)
        "num_threads": free_cpus(),
        # LightGBM's default (1e-3) lets a multiclass leaf hold only rows it already predicts with near-certainty
        # (hessian p(1-p) ~ 0), whose Newton step is then huge: on the demo's flights.carrier, 20,000 train seeds
        # gave accuracy 0.34 and log loss 10.6 (5,000 gave 0.988). 1.0 keeps every objective stable (an L1
        # regression row weighs 1, so it changes nothing there beyond min_data_in_leaf).
        "min_sum_hessian_in_leaf": 1.0,
    }
    target, objective, fit = kind(stype).gbdt_target(y_tr.values[keep_tr], f_tr.obs, int(y_tr.num_classes))
    params.update(objective)
    ds = lgb.Dataset(x_tr, label=target, feature_name=[f"f{i}" for i in range(len(f_tr.names))],
                     categorical_feature=f_tr.categorical or "auto", free_raw_data=False, params={"verbose": -1})
    callbacks = [] if progress is None else [lambda env: progress.advance(1)]
    if progress is not None:
        progress.step(f"{task_name}: LightGBM rounds ({len(target)} rows x {len(f_tr.names)} features, "
                      f"{params['num_threads']} threads)", num_boost_round)
    booster = lgb.train(params, ds, num_boost_round=num_boost_round, callbacks=callbacks)
    return GBDTModel(task=task_name, booster=booster, stype=stype, num_classes=int(y_tr.num_classes),
                     categorical=list(f_tr.categorical), codes=codes, feature_names=list(f_tr.names), params=params,
                     fit=fit)


__all__ = ["FeatureBuilder", "FeatureTable", "GBDTModel", "GBDTResult", "fit_gbdt", "train_gbdt", "DecodedTargets"]
