"""Human-readable view of one sequence: its rows, tables, cells and the three attention masks.

With the store at hand (`CellDecoder`), cells show the values a user knows: numbers and counts de-normalized,
timestamps as dates, categories as their strings, rows by primary key; the model's inputs (z-scores, ids) beside."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import numpy as np

from confluence.batch import ARRIVAL_NONE, CHILD_RANK_UNKNOWN
from confluence.sampler.builder import BuildResult
from confluence.sampler.data import SamplerData
from confluence.store.format import INT64_MAX
from confluence.stypes import US_PER_DAY, SemanticType

_VIA = {0: "seed", 1: "parent", 2: "child", 3: "label"}  # 3: a labelled task row (`confluence.sampler.labels`)


def column_value(z: float, mean: float, std: float) -> str:
    """The column's value of a z-score as the data holds it: `z * std + mean` rounded to the decimals the z-score
    keeps. The store holds z in float32 (about 7 significant digits, so the value is known to |z| x std x 2^-24), and
    the digits beyond that are rounding noise: an exact 0 of the data came back as -6.145e-11 and now prints 0."""
    value = z * std + mean
    noise = abs(z * std) * 2.0 ** -24 + abs(mean) * 2.0 ** -52  # float32 z, float64 statistics
    decimals = min(15, max(0, math.floor(math.log10(0.5 / noise)))) if noise > 0 else 15  # never coarser than units
    text = f"{round(value, decimals) + 0.0:.{decimals}f}"  # + 0.0: no "-0"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _time(us: int) -> str:
    if us == INT64_MAX:
        return "no cut-off"
    return (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(us))).isoformat() + "Z"


class CellDecoder:
    """Turns a cell's model input back into the user's value, from a store's column statistics and keys."""

    def __init__(self, store: Any, data: SamplerData):
        self.store = store
        self.columns = {int(c.column_idx): c for c in store.columns}
        self.categories: dict[int, str] = {}
        for c in store.columns:
            start = c.stats.get("cat_emb_start")
            if start is not None:
                for i, name in enumerate(c.stats.get("categories", [])):
                    self.categories[int(start) + i] = str(name)
        for t in store.tasks:  # a derived categorical task has its own block
            for i, name in enumerate(t.stats.get("categories", []) if int(t.cat_count) else []):
                self.categories.setdefault(int(t.cat_block_start) + i, str(name))
        self.ts_mean, self.ts_std = store.timestamp_stats
        self.counts: dict[int, tuple[float, float]] = {}
        self.latest: set[int] = set()  # the count columns that show the days since the latest child
        if data.count_columns:
            cc = data.child_counts(True, data.count_windows or (), data.count_latest)
            self.counts = {int(c): (float(m), float(sd)) for c, m, sd in zip(cc.col, cc.mean, cc.std, strict=True)}
            self.latest = {int(c) for c, w in zip(cc.col, cc.window, strict=True) if w < 0}

    def number(self, col: int, z: float, plain: bool = False) -> str:
        """A numerical cell as the data holds it (a count as a whole number), its z-score beside (not if
        `plain`)."""
        if col in self.latest:
            m, sd = self.counts[col]
            days = f"{float(np.expm1(z * sd + m)):.1f} days"
            return days if plain else f"{days} (since the latest; z={z:.3g})"
        if col in self.counts:
            m, sd = self.counts[col]
            n = round(float(np.expm1(z * sd + m)))
            return f"{n}" if plain else f"{n} (count; z={z:.3g})"
        st = self.columns[col].stats if col in self.columns else {}
        if "mean" in st and "std" in st:
            v = column_value(z, float(st["mean"]), float(st["std"]) or 1.0)
            return v if plain else f"{v} (z={z:.3g})"
        return f"z={z:.4g}"

    def time(self, z: float, plain: bool = False) -> str:
        us = int(round((z * self.ts_std + self.ts_mean) / 1e6)) * 1_000_000  # float32 z: about a second's precision
        return _time(us)[:-1] if plain else f"{_time(us)[:-1]} (z={z:.3g})"

    def category(self, cat_id: int) -> str:
        name = self.categories.get(cat_id)
        return f"cat#{cat_id}" if name is None else repr(name)

    def row(self, table: str, local: int) -> str:
        info = self.store.table(table)
        keys = self.store.keys(table) if info.primary_key else None
        if keys is None:
            return f"row {local}"
        return f"{info.primary_key}={keys[local].as_py()!r}"


def cell_value(res: BuildResult, b: int, p: int, dec: CellDecoder) -> str:
    """Cell `p` of sequence `b` as the user knows the value (a number, a date, a category's string; "(text)" for
    a text, whose string the store does not keep), without the model's input beside it."""
    return _value(res, b, p, dec, plain=True)


def _value(res: BuildResult, b: int, p: int, dec: CellDecoder | None = None, plain: bool = False) -> str:
    x = res.batch
    if x.is_null[b, p]:
        return "NULL"
    st = SemanticType(int(x.semantic_types[b, p]))
    col = int(x.column_ids[b, p])
    if st == SemanticType.IDENTIFIER:
        return "(present)"
    if st == SemanticType.NUMERICAL:
        z = float(x.numeric_values[b, p])
        return dec.number(col, z, plain) if dec is not None else f"z={z:.4g}"
    if st == SemanticType.TIMESTAMP:
        z = float(x.timestamp_values[b, p, -1])
        return dec.time(z, plain) if dec is not None else f"z={z:.4g}"
    if st == SemanticType.BOOLEAN:
        return str(bool(x.bool_values[b, p]))
    if st == SemanticType.CATEGORICAL:
        cid = int(x.categorical_embed_ids[b, p])
        return dec.category(cid) if dec is not None else f"cat#{cid}"
    return "(text)" if plain else f"text#{int(x.text_embed_ids[b, p])} (embedded)"


def _row(data: SamplerData, dec: CellDecoder | None, g: int) -> str:
    t = data.table_of_row(g)
    local = g - int(data.tab_row_off[t])
    return dec.row(data.table_names[t], local) if dec is not None else f"row {local}"


def _anchor(data: SamplerData, dec: CellDecoder | None, g: int) -> str:
    if dec is None:
        return f"row {g}"
    return f"{data.table_names[data.table_of_row(g)]} {_row(data, dec, g)}"


def _row_order(perm: np.ndarray, rows_of: np.ndarray, n: int) -> list[int]:
    return [int(r) for r in dict.fromkeys(rows_of[perm[:n]].tolist())]


def render_sequence(res: BuildResult, data: SamplerData, b: int = 0, task_name: str = "", max_cells: int | None = None,
                    store: Any = None) -> str:
    """Plain-text rendering of sequence `b` of a built batch: rows, cells, masks and permutation row orders.
    With `store`, values and rows are shown as the user knows them (`CellDecoder`)."""
    x = res.batch
    dec = CellDecoder(store, data) if store is not None else None
    n = int(res.n_real[b])
    nr = int(res.nrows[b])
    out: list[str] = []
    st = SemanticType(int(x.target_stype)).label
    out.append(
        f"sequence {b} of database {data.name!r}, task {task_name or x.task_idx} ({st} target), seed {int(x.seed_ids[b])}, "
        f"anchor {_anchor(data, dec, int(x.anchor_rows[b]))}, observation time {_time(int(x.obs_times[b]))}"
        + ("" if x.seq_valid[b] else "  [filler: seq_valid is False]")
    )
    out.append(f"{n} real cells + {x.seq_len - n} padding = S {x.seq_len}; {nr} rows (R padded to {x.num_rows})")
    if x.wait_scale[b] > 0:  # a "when next" task: its reference and unit (confluence.sampler.waits)
        mean, std = (float(v) for v in data.timestamp_stats)
        median = (float(x.wait_ref[b]) * std + mean - float(x.obs_times[b])) / US_PER_DAY
        out.append(f"answered as the observation time plus the train split's median wait ({median:.1f} days) plus "
                   f"a wait read in units of {float(x.wait_scale[b]) * std / US_PER_DAY:.1f} days")
    out.append("")
    out.append(f"rows (sequence-local id, table, {'primary key' if dec else 'table row'}, reached via, from row, hops, "
               "cells, recency rank among the parent's children where known: 0 = the latest, the foreign key it came in "
               "through)")
    cells_per_row = np.bincount(x.seq_row_ids[b, :n], minlength=nr)
    rank = np.full(nr, CHILD_RANK_UNKNOWN, np.int64)  # a row's cells share its rank; the target cell has none
    rank[x.seq_row_ids[b, 1:n]] = x.child_rank[b, 1:n]
    arrival = np.full(nr, ARRIVAL_NONE, np.int64)  # the foreign key each row came in through (batch.arrival_code)
    arrival[x.seq_row_ids[b, 1:n]] = x.arrival[b, 1:n]
    n_walk = nr - (int((res.labels[b] >= 0).sum()) if res.labels is not None else 0)
    for i in range(nr):
        g = int(res.rows[b, i])
        t = data.table_of_row(g)
        src = int(res.src[b, i])
        what = data.table_names[t] if i < n_walk else f"label #{int(res.labels[b, i - n_walk])}"
        who = _row(data, dec, g) if i < n_walk else f"of {_row(data, dec, g)}"
        out.append(
            f"  r{i:<4d} {what:<20s} {who:<20s} "
            f"{_VIA[int(res.via[b, i])]:<7s} {'' if src < 0 else f'r{src}':<6s} hops {int(res.hops[b, i]):<3d} "
            f"cells {int(cells_per_row[i])}" + ("" if rank[i] == CHILD_RANK_UNKNOWN else f"   rank {int(rank[i])}")
            + ("" if arrival[i] < 0 else f"   through {data.column_names[int(arrival[i]) >> 1]}")
        )
    if n_walk < nr:
        out.append(f"  (r{n_walk}.. are labelled task rows: the label # is the task's seed, the row its anchor; "
                   "each links to its anchor row when that row is in the context)")
    out.append("")
    out.append("cells (position, row, column, type, value, flags)")
    shown = n if max_cells is None else min(n, max_cells)
    for p in range(shown):
        flags = "TARGET (value hidden from the model)" if x.is_target[b, p] else (
            "LABEL (a known answer, visible)" if int(x.seq_row_ids[b, p]) >= n_walk else "")
        out.append(
            f"  {p:<5d} r{int(x.seq_row_ids[b, p]):<4d} {data.column_names[int(x.column_ids[b, p])]:<32s} "
            f"{SemanticType(int(x.semantic_types[b, p])).label:<12s} {_value(res, b, p, dec):<28s} {flags}"
        )
    if shown < n:
        out.append(f"  ... {n - shown} more cells")
    out.append("")
    adj = x.fk_adj[b]
    out.append("outbound mask (a row's cells see its own row and its parents):")
    for i in range(nr):
        seen = [i] + [j for j in range(nr) if adj[i, j]]
        out.append(f"  r{i} -> {{{', '.join(f'r{j}' for j in seen)}}}")
    out.append("inbound mask (a row's cells see its children's cells):")
    for i in range(nr):
        seen = [j for j in range(nr) if adj[j, i]]
        out.append(f"  r{i} <- {{{', '.join(f'r{j}' for j in seen)}}}")
    out.append("column mask (a cell sees the cells of its column):")
    cols = x.column_ids[b, :n]
    for c in np.unique(cols):
        out.append(f"  {data.column_names[int(c)]:<32s} {int((cols == c).sum())} cells")
    out.append("")
    out.append(f"out_perm row order: {' '.join(f'r{r}' for r in _row_order(x.out_perm[b], x.seq_row_ids[b], n))}")
    out.append(f"in_perm row order:  {' '.join(f'r{r}' for r in _row_order(x.in_perm[b], x.seq_row_ids[b], n))}")
    return "\n".join(out)
