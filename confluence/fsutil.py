"""Small filesystem helpers shared by everything that writes atomically (stores, checkpoints)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory (a directory's fsync makes a rename inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file beside it and a rename: `path` is the old file or the whole
    new one, never a half-written one."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


@contextmanager
def atomic_dir(out: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success its files are fsync'ed and it replaces `out` by a
    rename (an existing `out` only with `overwrite`), on failure it is removed: `out` never holds a half-written
    result."""
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                fsync_path(f)
        if out.exists() and overwrite:
            old = out.parent / f".old-{out.name}-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
        fsync_path(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
