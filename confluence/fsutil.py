"""Small filesystem helpers shared by everything that writes atomically (stores, checkpoints)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory (a directory's fsync makes a rename inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sqlite_type(t: pa.DataType) -> str:
    """The SQLite column declaration for an Arrow type (used when writing test and benchmark SQLite files)."""
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    if pa.types.is_date(t):
        return "DATE"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_integer(t):
        return "INTEGER"
    if pa.types.is_floating(t):
        return "REAL"
    return "TEXT"
