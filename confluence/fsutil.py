"""Small filesystem helpers shared by everything that writes atomically (stores, checkpoints)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
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
def atomic_dir(out: Path, kind: str, *, legacy: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a temporary directory beside `out`, marked as an output of `kind`; on success its files are fsync'ed
    and it replaces `out` by a rename (an earlier output of `kind` only: never a folder confluence did not write,
    `confluence.outputs`), on failure it is removed: `out` never holds a half-written result."""
    from confluence import outputs

    outputs.claim(out, kind, legacy=legacy)
    with outputs.locked(out), outputs.writing(out, outputs.KINDS[kind]):
        tmp = outputs.temp_dir(out, kind)
        try:
            yield tmp
            for f in tmp.rglob("*"):
                if f.is_file():
                    fsync_path(f)
            outputs.replace_dir(tmp, out, kind, legacy=legacy)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
