"""Writes a store into a temporary directory beside `<out>` and renames it to `<out>` at the very end.

`metadata.json` is written last, after every array is flushed and fsynced, so a directory without it (an
interrupted run) is never a loadable store. An existing store at `<out>` is moved aside, replaced, then deleted;
a directory that is not a store is never touched (`confluence.outputs`). One writer per store (`OutputLock`), and
space is reserved before an array is memory-mapped, so a full disk is an error naming the store, never a SIGBUS.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.format import open_memmap

from confluence import outputs
from confluence.fsutil import fsync_path
from confluence.store import format as fmt


class StoreWriter:
    """Creates the temporary store directory and records every array it writes (dtype and shape)."""

    def __init__(self, out: str | Path):
        self.out = Path(out).absolute()
        self.lock = outputs.OutputLock(self.out, "preprocessed")
        with outputs.writing(self.out, "the processed store"):
            self.lock.acquire()
            try:
                recover_leftovers(self.out)
                outputs.claim(self.out, "store", legacy=is_legacy_store)
                self.tmp = outputs.temp_dir(self.out, "store")
            except BaseException:
                self.lock.release()
                raise
        self.files: dict[str, dict[str, Any]] = {}
        self._open: dict[str, np.memmap] = {}

    def _register(self, rel: str, dtype: np.dtype, shape: tuple[int, ...]) -> Path:
        if rel in self.files:
            raise ValueError(f"store file '{rel}' written twice")
        dt = np.dtype(dtype)
        self.files[rel] = {"dtype": dt.str if dt.kind == "U" else dt.name,  # "<U6": names like str192 don't parse
                           "shape": [int(s) for s in shape]}
        path = self.tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def array(self, rel: str, dtype: np.dtype | type, shape: tuple[int, ...]) -> np.ndarray:
        """A writable memory-mapped `.npy` of the given dtype and shape, to be filled incrementally."""
        dtype = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
        path = self._register(rel, dtype, shape)
        if int(np.prod(shape, dtype=np.int64)) == 0:
            np.save(path, np.zeros(shape, dtype=dtype))
            return np.zeros(shape, dtype=dtype)
        with outputs.writing(self.out, f"the processed store (its array {rel})"):
            mm = open_memmap(path, mode="w+", dtype=dtype, shape=shape)
            reserve(path)
        self._open[rel] = mm
        return mm

    def save(self, rel: str, arr: np.ndarray) -> None:
        """Write a whole in-memory array."""
        arr = np.ascontiguousarray(arr)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        path = self._register(rel, arr.dtype, arr.shape)
        with outputs.writing(self.out, f"the processed store (its array {rel})"):
            np.save(path, arr, allow_pickle=False)

    def close(self, rel: str) -> None:
        """Flush and unmap an array obtained from `array` (frees its pages early)."""
        mm = self._open.pop(rel, None)
        if mm is not None:
            mm.flush()
            del mm

    def commit(self, metadata: dict[str, Any]) -> Path:
        """Flush everything, write metadata.json last, fsync, and atomically move the store into place."""
        try:
            with outputs.writing(self.out, "the processed store"):
                for rel in list(self._open):
                    self.close(rel)
                metadata = dict(metadata)
                metadata["files"] = {rel: self.files[rel] for rel in sorted(self.files)}
                outputs.mark(self.tmp, "store")
                meta_path = self.tmp / fmt.METADATA_FILE
                meta_path.write_text(json.dumps(metadata, indent=1, ensure_ascii=False, allow_nan=False) + "\n",
                                     encoding="utf-8")
                _fsync_tree(self.tmp)
                outputs.replace_dir(self.tmp, self.out, "store", legacy=is_legacy_store)
        finally:
            self.lock.release()
        return self.out

    def abort(self) -> None:
        """Remove the temporary directory (after an error) and let go of the lock."""
        self._open.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.lock.release()


def reserve(path: Path) -> None:
    """Allocate the disk blocks of a new (sparse) file now, so that a full disk is an OSError here instead of a
    SIGBUS when a page of its memory map is first written."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
                    raise
    finally:
        os.close(fd)


def is_legacy_store(path: Path) -> bool:
    """A store written before output markers: its metadata.json lists every file the directory holds (so a
    folder with anything else in it, a user's metadata.json among its files, is not one)."""
    try:
        meta = json.loads((path / fmt.METADATA_FILE).read_text(encoding="utf-8"))
        listed = set(meta["files"]) | {fmt.METADATA_FILE}
    except (OSError, ValueError, KeyError, TypeError):
        return False
    present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    return bool(meta.get("format_version")) and present <= listed


def recover_leftovers(out: Path) -> None:
    """Clean up after a killed run: remove its `<out>.tmp-<pid>`; finish or undo an interrupted swap.

    A run swaps stores by renaming `<out>` to `<out>.old-<pid>` and the new one to `<out>`. If it died between
    the two renames, `<out>` is missing and the old store is put back; if it died after both, the old copy is
    deleted. Directories of processes still alive are left alone.
    """
    if not out.parent.is_dir():
        return
    for p in sorted(out.parent.glob(f"{out.name}.*-*")):
        kind, _, pid = p.name[len(out.name) + 1:].partition("-")
        if kind not in ("tmp", "old") or not pid.isdigit() or outputs.pid_alive(int(pid)) or not p.is_dir():
            continue
        if kind == "old" and not out.exists() and (p / fmt.METADATA_FILE).is_file():
            os.replace(p, out)
        else:
            shutil.rmtree(p, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in sorted(files):
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_path(Path(dirpath))
