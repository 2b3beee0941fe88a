"""A readable summary of a processed store (what `confluence inspect DIR` prints)."""

from __future__ import annotations

import datetime as dt
from collections import Counter

from rich.console import Console, Group
from rich.table import Table

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
    header.add_column()
    header.add_row("store", str(store.path))
    header.add_row("database", store.name)
    header.add_row("format", f"version {m['format_version']} (confluence {m['confluence_version']})")
    header.add_row("rows / columns", f"{store.num_rows:,} rows, {store.num_columns} columns")
    header.add_row("embeddings", f"D_t={store.d_t}, {m['num_categories']:,} categories (max K {store.max_k}),"
                                 f" {m['num_texts']:,} texts; encoder {enc['kind']} {enc['fingerprint']}")
    g = m["graph"]
    header.add_row("FK graph", f"{g['num_parent_edges']:,} edges, {g.get('num_dangling', 0):,} dangling keys dropped")

    tables = Table(title="tables", title_justify="left")
    for col in ("table", "rows", "pk", "time column", "NULL times", *_SHORT.values()):
        tables.add_column(col, justify="right" if col not in ("table", "pk", "time column") else "left")
    for t in store.tables:
        counts = Counter(c.stype for c in t.columns)
        tables.add_row(t.name, f"{t.num_rows:,}", t.primary_key or "-", t.temporal_column or "(static)",
                       str(t.null_time_rows), *(str(counts.get(s, 0)) for s in _SHORT))

    fks = Table(title="foreign keys", title_justify="left")
    for col in ("column", "references", "dangling"):
        fks.add_column(col, justify="right" if col == "dangling" else "left")
    for c in store.columns:
        if c.foreign_key:
            fks.add_row(f"{c.table}.{c.name}", c.foreign_key, f"{g['dangling'].get(f'{c.table}.{c.name}', 0):,}")

    tasks = Table(title="tasks", title_justify="left")
    for col in ("task", "anchor", "target", "kind", "seeds", "observation time", "target statistics"):
        tasks.add_column(col, justify="right" if col == "seeds" else "left")
    for k, raw in zip(store.tasks, m["tasks"], strict=True):
        target = store.columns[k.target_column_idx]
        kind = "derived" if k.is_derived else "cell masking"
        tasks.add_row(k.name, k.anchor_table, f"{target.name} ({k.target_stype.label})", kind, f"{k.num_seeds:,}",
                      k.observation_time, target_summary(k.target_stype, raw.get("target_stats", k.stats)))
    parts = [header, tables]
    if fks.row_count:
        parts.append(fks)
    parts.append(tasks if tasks.row_count else "no tasks")
    return Group(*parts)


def print_summary(store: Store, console: Console | None = None) -> None:
    """Print the summary of `store`."""
    (console or Console()).print(summary(store))
