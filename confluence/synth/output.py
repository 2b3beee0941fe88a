"""Writing a generated database: Parquet tables and JSON files under a directory that appears atomically."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from confluence import outputs
from confluence.errors import ConfluenceError
from confluence.fsutil import atomic_dir

Contents = tuple[dict[str, dict[str, pa.Table]], dict[str, Any]]  # ({folder: {name: table}}, {file name: JSON})


def write_generated(out: str | Path, build: Callable[[], Contents], *, overwrite: bool = False) -> Path:
    """Refuse an existing database at `out` unless `overwrite`, and a folder of anything else always (before
    `build` runs, so nothing is generated in vain), then
    write what `build` returns: each folder's tables as `<folder>/<name>.parquet` and each JSON file, into a
    temporary directory renamed into place (never a half-written database)."""
    out = Path(out)
    if outputs.claim(out, "synthetic-database", legacy=_is_generated) == "ours" and not overwrite:
        raise ConfluenceError(f"{out}: already exists; choose a new --out or pass --overwrite")
    folders, files = build()
    with atomic_dir(out, "synthetic-database", legacy=_is_generated) as tmp:
        for folder, tables in folders.items():
            (tmp / folder).mkdir()
            for name, t in tables.items():
                pq.write_table(t, tmp / folder / f"{name}.parquet")
        for name, obj in files.items():
            (tmp / name).write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    return out


def _is_generated(path: Path) -> bool:
    """A generated database written before output markers: a raw/ folder of Parquet files and JSON files."""
    entries = list(path.iterdir())
    return (path / "raw").is_dir() and all(
        p.name in ("raw", outputs.MARKER_FILE) or (p.is_file() and p.suffix == ".json") for p in entries) and all(
        q.suffix == ".parquet" for q in (path / "raw").iterdir())
