"""Human-readable view of one sequence: its rows, tables, cells and the three attention masks."""

from __future__ import annotations

import datetime as dt

import numpy as np

from confluence.sampler.builder import BuildResult
from confluence.sampler.data import SamplerData
from confluence.store.format import INT64_MAX
from confluence.stypes import SemanticType

_VIA = {0: "seed", 1: "parent", 2: "child"}


def _time(us: int) -> str:
    if us == INT64_MAX:
        return "no cut-off"
    return (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(us))).isoformat() + "Z"


def _value(res: BuildResult, b: int, p: int) -> str:
    x = res.batch
    if x.is_null[b, p]:
        return "NULL"
    st = SemanticType(int(x.semantic_types[b, p]))
    if st == SemanticType.IDENTIFIER:
        return "(present)"
    if st == SemanticType.NUMERICAL:
        return f"z={x.numeric_values[b, p]:.4g}"
    if st == SemanticType.TIMESTAMP:
        return f"z={x.timestamp_values[b, p, -1]:.4g}"
    if st == SemanticType.BOOLEAN:
        return str(bool(x.bool_values[b, p]))
    if st == SemanticType.CATEGORICAL:
        return f"cat#{int(x.categorical_embed_ids[b, p])}"
    return f"text#{int(x.text_embed_ids[b, p])} (batch-local)"


def _row_order(perm: np.ndarray, rows_of: np.ndarray, n: int) -> list[int]:
    return [int(r) for r in dict.fromkeys(rows_of[perm[:n]].tolist())]


def render_sequence(res: BuildResult, data: SamplerData, b: int = 0, task_name: str = "", max_cells: int | None = None) -> str:
    """Plain-text rendering of sequence `b` of a built batch: rows, cells, masks and permutation row orders."""
    x = res.batch
    n = int(res.n_real[b])
    nr = int(res.nrows[b])
    out: list[str] = []
    st = SemanticType(int(x.target_stype)).label
    out.append(
        f"sequence {b} of database {data.name!r}, task {task_name or x.task_idx} ({st} target), seed {int(x.seed_ids[b])}, "
        f"anchor row {int(x.anchor_rows[b])}, observation time {_time(int(x.obs_times[b]))}"
        + ("" if x.seq_valid[b] else "  [filler: seq_valid is False]")
    )
    out.append(f"{n} real cells + {x.seq_len - n} padding = S {x.seq_len}; {nr} rows (R padded to {x.num_rows})")
    out.append("")
    out.append("rows (sequence-local id, table, table row, reached via, from row, hops, cells)")
    cells_per_row = np.bincount(x.seq_row_ids[b, :n], minlength=nr)
    for i in range(nr):
        g = int(res.rows[b, i])
        t = data.table_of_row(g)
        src = int(res.src[b, i])
        out.append(
            f"  r{i:<4d} {data.table_names[t]:<20s} row {g - int(data.tab_row_off[t]):<8d} "
            f"{_VIA[int(res.via[b, i])]:<7s} {'' if src < 0 else f'r{src}':<6s} hops {int(res.hops[b, i]):<3d} "
            f"cells {int(cells_per_row[i])}"
        )
    out.append("")
    out.append("cells (position, row, column, type, value, flags)")
    shown = n if max_cells is None else min(n, max_cells)
    for p in range(shown):
        flags = "TARGET (value hidden from the model)" if x.is_target[b, p] else ""
        out.append(
            f"  {p:<5d} r{int(x.seq_row_ids[b, p]):<4d} {data.column_names[int(x.column_ids[b, p])]:<32s} "
            f"{SemanticType(int(x.semantic_types[b, p])).label:<12s} {_value(res, b, p):<28s} {flags}"
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
