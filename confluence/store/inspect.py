"""A readable summary of a processed store (what `confluence inspect DIR` prints)."""

from __future__ import annotations

import datetime as dt
from collections import Counter

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from confluence.store.reader import Store
from confluence.stypes import SemanticType

_SHORT = {SemanticType.IDENTIFIER: "id", SemanticType.NUMERICAL: "num", SemanticType.TIMESTAMP: "ts",
          SemanticType.BOOLEAN: "bool", SemanticType.CATEGORICAL: "cat", SemanticType.TEXT: "text"}


_EPOCH = dt.datetime(1970, 1, 1)


def _fmt(x: object) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _iso(us: object) -> str:
    if us is None:
        return "-"
    return (_EPOCH + dt.timedelta(microseconds=int(us))).isoformat(sep=" ", timespec="seconds")


def target_summary(stype: SemanticType, stats: dict) -> str:
    """One line describing a task target's statistics (timestamps as UTC dates, std in days)."""
    if stype == SemanticType.TIMESTAMP:
        mean = stats.get("mean") if stats.get("count") else None
        return (f"n={stats.get('count')} null={stats.get('null_count')} mean={_iso(mean)}"
                f" std={_fmt(float(stats.get('std', 0.0)) / 86_400e6)}d min={_iso(stats.get('min'))}"
                f" max={_iso(stats.get('max'))}")
    if stype == SemanticType.NUMERICAL:
        return (f"n={stats.get('count')} null={stats.get('null_count')} mean={_fmt(stats.get('mean'))}"
                f" std={_fmt(stats.get('std'))} min={_fmt(stats.get('min'))} max={_fmt(stats.get('max'))}")
    if stype == SemanticType.BOOLEAN:
        return f"true={stats.get('true_count')} false={stats.get('false_count')} null={stats.get('null_count')}"
    cats = stats.get("categories", [])
    head = ", ".join(cats[:5]) + (", ..." if len(cats) > 5 else "")
    return f"k={stats.get('k')} null={stats.get('null_count')} [{head}]"


def summary(store: Store) -> Group:
    """Rich renderables: header, tables, FK edges, tasks."""
    m = store.meta
    enc = m["text_encoder"]
    header = Table.grid(padding=(0, 2))
    header.add_column(style="bold")
    header.add_column(overflow="fold")
    header.add_row("store", str(store.path))
    header.add_row("database", store.name)
    header.add_row("format", f"version {m['format_version']} (confluence {m['confluence_version']})")
    header.add_row("rows / columns", f"{store.num_rows:,} rows, {store.num_columns} columns")
    header.add_row("embeddings", f"D_t={store.d_t}, {m['num_categories']:,} categories (max K {store.max_k}),"
                                 f" {m['num_texts']:,} texts; encoder {enc['kind']} {enc['fingerprint']}")
    g = m["graph"]
    kept = g.get("num_key_only_rows", 0)
    header.add_row("FK graph", f"{g['num_parent_edges']:,} edges, {g.get('num_dangling', 0):,} dangling keys dropped"
                   + (f", {kept:,} key-only rows" if kept else ""))

    # narrow tables (fit 80 columns, no ellipses in a log): per table one row, the column types in one cell
    tables = Table(title="tables", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("table", "rows", "primary key", "time column", "columns"):
        tables.add_column(col, justify="right" if col == "rows" else "left", overflow="fold")
    for t in store.tables:
        counts = Counter(c.stype for c in t.columns)
        kinds = ", ".join(f"{counts[s]} {short}" for s, short in _SHORT.items() if counts.get(s))
        time_col = t.temporal_column or "(static)"
        if t.null_time_rows:
            time_col += f" ({t.null_time_rows:,} NULL)"
        rows = f"{t.num_rows:,}" + (f" ({t.key_only_rows:,} key-only)" if t.key_only_rows else "")
        tables.add_row(t.name, rows, t.primary_key or "-", time_col, kinds)

    fks = Table(title="foreign keys", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("column", "references", "dangling"):
        fks.add_column(col, justify="right" if col == "dangling" else "left", overflow="fold")
    for c in store.columns:
        if c.foreign_key:
            fks.add_row(f"{c.table}.{c.name}", c.foreign_key, f"{g['dangling'].get(f'{c.table}.{c.name}', 0):,}")

    # tasks: a block each (name and kind, then what it predicts, then the target's statistics)
    tasks: list = []
    for k, raw in zip(store.tasks, m["tasks"], strict=True):
        target = store.columns[k.target_column_idx]
        kind = "derived" if k.is_derived else "cell masking"
        tasks.append(Text.assemble((k.name, "bold"), f" ({kind}, {k.num_seeds:,} seeds)"))
        detail = (f"predicts {target.name} ({k.target_stype.label}) of a {k.anchor_table} row; observation time: "
                  f"{k.observation_time}\n{target_summary(k.target_stype, raw.get('target_stats', k.stats))}")
        tasks.append(Padding(Text(detail), (0, 0, 0, 2)))  # wrapped lines keep the indent
    for link in store.link_tasks:
        per_seed = link.num_links / max(link.num_seeds, 1)
        tasks.append(Text.assemble((link.name, "bold"), f" (link, {link.num_seeds:,} seeds)"))
        tasks.append(Padding(Text(
            f"ranks {link.target_table} rows a {link.anchor_table} row links to within {link.horizon_us / 86_400e6:g}"
            f" days; top {link.k}; {link.num_links:,} links, {per_seed:.1f} per seed"), (0, 0, 0, 2)))
    parts = [header, tables]
    if fks.row_count:
        parts.append(fks)
    parts.append(Text("tasks", style="bold") if tasks else "no tasks")
    parts.extend(tasks)
    return Group(*parts)


def print_summary(store: Store, console: Console | None = None) -> None:
    """Print the summary of `store`."""
    (console or Console()).print(summary(store))
