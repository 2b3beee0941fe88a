"""RelBench task tables: `tasks/<task>/{train,val,test}.parquet` beside a RelBench dataset's `db/` folder.

RelBench caches each task's tables in exactly this layout (relbench/base/task_base.py, `get_table`:
`Table.save(f"{cache_dir}/{split}.parquet")` with `cache_dir = <cache>/<dataset>/tasks/<task>`), written by
`Table.save` (relbench/base/table.py) with the same Parquet schema metadata as the database's tables:
`fkey_col_to_pkey_table` = {entity column: entity table}, `pkey_col` null, `time_col` the timestamp column. The
one remaining column is the target. RelBench does not record the task type in these files.

`open_source` registers every such file as a view of the DuckDB schema `relbench_tasks`
(`relbench_tasks."user-churn/train"`) so that task queries can read it. The views are never tables of the
`RawDatabase`: task rows hold labels, and labels must not become rows of the relational graph.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from confluence.errors import DataError
from confluence.sources.raw import quote_ident, quote_literal

TASK_SCHEMA = "relbench_tasks"
SPLIT_FILES = ("train", "val", "test")
_KEYS = ("fkey_col_to_pkey_table", "pkey_col", "time_col")


@dataclass(frozen=True)
class TaskFolder:
    """One folder `tasks/<name>/`: its split files and, per file, the columns and the RelBench metadata."""

    name: str
    folder: Path
    files: dict[str, Path] = field(default_factory=dict)  # split -> file, for the splits present
    columns: dict[str, list[str]] = field(default_factory=dict)  # split -> column names
    types: dict[str, dict[str, pa.DataType]] = field(default_factory=dict)  # split -> column -> Arrow type
    meta: dict[str, dict[str, object]] = field(default_factory=dict)  # split -> decoded RelBench keys


def view_name(task: str, split: str) -> str:
    """The SQL name of a task file's view: `relbench_tasks."<task>/<split>"`."""
    return f"{TASK_SCHEMA}.{quote_ident(f'{task}/{split}')}"


def tasks_dir(path: Path) -> Path | None:
    """The `tasks/` folder of a RelBench dataset folder, if it has one."""
    d = Path(path) / "tasks"
    return d if d.is_dir() else None


def _metadata(file: Path) -> tuple[pa.Schema, dict[str, object]]:
    try:
        schema = pq.read_schema(file)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{file}: not a readable Parquet file ({exc})") from None
    out: dict[str, object] = {}
    for key, value in (schema.metadata or {}).items():
        name = key.decode("utf-8", "replace")
        if name in _KEYS:
            try:
                out[name] = json.loads(value.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise DataError(f"{file}: RelBench metadata '{name}' is not valid JSON ({exc})") from None
    return schema, out


def find_task_folders(path: Path) -> list[TaskFolder]:
    """Every sub-folder of `<path>/tasks/` (sorted by name) with the split files it holds; [] without `tasks/`.
    An unreadable Parquet file is a DataError naming it."""
    root = tasks_dir(path)
    if root is None:
        return []
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files, columns, types, meta = {}, {}, {}, {}
        for split in SPLIT_FILES:
            file = folder / f"{split}.parquet"
            if file.is_file():
                schema, decoded = _metadata(file)
                files[split], columns[split], meta[split] = file, schema.names, decoded
                types[split] = {f.name: f.type for f in schema}
        out.append(TaskFolder(folder.name, folder, files, columns, types, meta))
    return out


def register_views(con: duckdb.DuckDBPyConnection, path: Path) -> list[TaskFolder]:
    """Create a view `relbench_tasks."<task>/<split>"` for every split file under `<path>/tasks/` on `con`."""
    folders = find_task_folders(path)
    if not folders:
        return folders
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {TASK_SCHEMA}")
    for task in folders:
        for split, file in task.files.items():
            try:
                con.execute(f"CREATE VIEW {view_name(task.name, split)} AS"
                            f" SELECT * FROM read_parquet({quote_literal(str(file))})")
            except duckdb.Error as exc:
                raise DataError(f"{file}: DuckDB cannot read it as Parquet ({exc})") from None
    return folders
