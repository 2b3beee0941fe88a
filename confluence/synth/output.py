"""Writing a generated database: Parquet tables and JSON files under a directory that appears atomically."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from confluence.errors import ConfluenceError
from confluence.fsutil import atomic_dir

Contents = tuple[dict[str, dict[str, pa.Table]], dict[str, Any]]  # ({folder: {name: table}}, {file name: JSON})


def write_generated(out: str | Path, build: Callable[[], Contents], *, overwrite: bool = False) -> Path:
    """Refuse an existing `out` unless `overwrite` (before `build` runs, so nothing is generated in vain), then
    write what `build` returns: each folder's tables as `<folder>/<name>.parquet` and each JSON file, into a
    temporary directory renamed into place (never a half-written database)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfluenceError(f"{out}: already exists; choose a new --out or pass --overwrite")
    folders, files = build()
    with atomic_dir(out, overwrite=overwrite) as tmp:
        for folder, tables in folders.items():
            (tmp / folder).mkdir()
            for name, t in tables.items():
                pq.write_table(t, tmp / folder / f"{name}.parquet")
        for name, obj in files.items():
            (tmp / name).write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    return out
