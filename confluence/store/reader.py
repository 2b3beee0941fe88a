"""`Store`: a processed store opened memory-mapped and read-only (the contract of docs/reference/store.md).

Opening checks the format version and that every file listed in `metadata.json` exists with the recorded dtype
and shape, so a truncated or foreign store fails with a `StoreError` naming the file at fault.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from confluence.errors import StoreError
from confluence.store import format as fmt
from confluence.stypes import SemanticType


@dataclass(frozen=True)
class ColumnInfo:
    """One global column: a table column, a derived task target or observation time, or a child-count column
    (`count_of`: the foreign key whose referencing rows it counts; see preprocess/pipeline.child_count_columns) or a
    children's-mean column (`mean_of`: the foreign key and the child column it averages; child_mean_columns)."""

    column_idx: int
    table: str | None
    task: str | None
    name: str
    stype: SemanticType
    text: str
    stats: dict[str, Any] = field(default_factory=dict)
    foreign_key: str | None = None
    count_of: dict[str, Any] | None = None
    mean_of: dict[str, Any] | None = None


@dataclass(frozen=True)
class TableInfo:
    """One table: its rows are global rows `row_offset .. row_offset + num_rows - 1`."""

    name: str
    index: int
    num_rows: int
    row_offset: int
    primary_key: str | None
    temporal_column: str | None
    null_time_rows: int
    columns: list[ColumnInfo]
    key_only_rows: int = 0  # its last rows stand for foreign-key values matching no key (preprocess's dangling_keys)

    def column(self, name: str) -> ColumnInfo:
        """The non-ignored column `name` of this table."""
        for c in self.columns:
            if c.name == name:
                return c
        raise StoreError(f"table '{self.name}' has no stored column '{name}' (ignored or unknown)")


@dataclass(frozen=True)
class TaskInfo:
    """One task; `stats` are the statistics its target is encoded with."""

    name: str
    index: int
    anchor_table: str
    target_stype: SemanticType
    target_column_idx: int
    is_derived: bool
    exclude_column_idxs: list[int]
    cat_block_start: int
    cat_count: int
    num_seeds: int
    observation_time: str
    stats: dict[str, Any]
    obs_column_idx: int = -1  # the anchor row's observation-time cell (-1: none; see preprocess/pipeline.py)


@dataclass(frozen=True)
class TaskArrays:
    """The `(anchor_row, obs_time, target)` tuples of a task, sorted by (anchor_row, obs_time)."""

    anchor_row: np.ndarray
    obs_time: np.ndarray
    target_values: np.ndarray
    target_valid: np.ndarray


@dataclass(frozen=True)
class LinkTaskInfo:
    """One link task: which rows of `target_table` an anchor of `anchor_table` links to within `horizon_us` after
    its observation time; scored on the top `k`; `split`: its val / test cut-offs (metadata's `split`)."""

    name: str
    anchor_table: str
    target_table: str
    horizon_us: int
    k: int
    split: dict[str, Any]
    num_seeds: int
    num_links: int
    target_column_idx: int  # the anchor row's question cell ("links to <target table>")
    obs_column_idx: int  # the anchor row's observation-time cell


@dataclass(frozen=True)
class LinkArrays:
    """A link task's seeds `(anchor_row, obs_time)`, sorted, and seed i's target rows
    `targets[offsets[i]:offsets[i + 1]]` (global rows of the target table, ascending)."""

    anchor_row: np.ndarray
    obs_time: np.ndarray
    offsets: np.ndarray
    targets: np.ndarray


class Store:
    """A processed store, memory-mapped read-only. Use `Store.open(path)`."""

    def __init__(self, path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]):
        self.path = path
        self.meta = meta
        self._arrays = arrays
        self.name: str = meta["name"]
        self.d_t: int = int(meta["d_t"])
        self.num_rows: int = int(meta["num_rows"])
        self.num_columns: int = int(meta["num_columns"])
        self.max_k: int = int(meta["max_k"])
        self.columns: list[ColumnInfo] = [
            ColumnInfo(
                column_idx=int(c["column_idx"]), table=c["table"], task=c["task"], name=c["name"],
                stype=SemanticType.parse(c["stype"]), text=c["text"], stats=c.get("stats", {}),
                foreign_key=c.get("foreign_key"), count_of=c.get("count_of"), mean_of=c.get("mean_of"),
            )
            for c in meta["columns"]
        ]
        self.tables: list[TableInfo] = [
            TableInfo(
                name=t["name"], index=int(t["index"]), num_rows=int(t["num_rows"]),
                row_offset=int(t["row_offset"]), primary_key=t["primary_key"],
                temporal_column=t["temporal_column"], null_time_rows=int(t["null_time_rows"]),
                columns=[self.columns[int(c["column_idx"])] for c in t["columns"]],
                key_only_rows=int(t.get("key_only_rows", 0)),
            )
            for t in meta["tables"]
        ]
        self.tasks: list[TaskInfo] = [
            TaskInfo(
                name=k["name"], index=int(k["index"]), anchor_table=k["anchor_table"],
                target_stype=SemanticType.parse(k["target_stype"]), target_column_idx=int(k["target_column_idx"]),
                is_derived=bool(k["is_derived"]), exclude_column_idxs=[int(i) for i in k["exclude_column_idxs"]],
                cat_block_start=int(k["cat_block_start"]), cat_count=int(k["cat_count"]),
                num_seeds=int(k["num_seeds"]), observation_time=k["observation_time"], stats=k["stats"],
                obs_column_idx=int(k.get("obs_column_idx", -1)),
            )
            for k in meta["tasks"]
        ]
        self.link_tasks: list[LinkTaskInfo] = [
            LinkTaskInfo(name=k["name"], anchor_table=k["anchor_table"], target_table=k["target_table"],
                         horizon_us=int(k["horizon_us"]), k=int(k["k"]), split=dict(k["split"]),
                         num_seeds=int(k["num_seeds"]), num_links=int(k["num_links"]),
                         target_column_idx=int(k["target_column_idx"]), obs_column_idx=int(k["obs_column_idx"]))
            for k in meta.get("link_tasks", [])
        ]
        self._tables_by_name = {t.name: t for t in self.tables}
        self._tasks_by_name = {k.name: k for k in self.tasks}
        self._links_by_name = {k.name: k for k in self.link_tasks}

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | Path) -> Store:
        """Open a processed store read-only; raises StoreError on a missing, foreign or truncated store."""
        path = Path(path)
        meta_path = path / fmt.METADATA_FILE
        if not meta_path.is_file():
            raise StoreError(f"{path}: not a processed store (no {fmt.METADATA_FILE}; was preprocessing interrupted?)")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StoreError(f"{meta_path}: unreadable store metadata ({exc})") from None
        version = meta.get("format_version") if isinstance(meta, dict) else None
        if version != fmt.FORMAT_VERSION:
            raise StoreError(
                f"{path}: store format version {version!r}, this code reads version {fmt.FORMAT_VERSION};"
                " preprocess the database again"
            )
        for key in ("name", "d_t", "num_rows", "num_columns", "max_k", "tables", "columns", "tasks", "files"):
            if key not in meta:
                raise StoreError(f"{meta_path}: missing key '{key}'")
        arrays: dict[str, np.ndarray] = {}
        for rel, spec in meta["files"].items():
            arrays[rel] = _open_array(path, rel, spec)
        return cls(path, meta, arrays)

    # ------------------------------------------------------------------ access
    def _get(self, rel: str) -> np.ndarray:
        try:
            return self._arrays[rel]
        except KeyError:
            raise StoreError(f"{self.path}: the store has no file '{rel}'") from None

    def table(self, name: str) -> TableInfo:
        """The table called `name`."""
        try:
            return self._tables_by_name[name]
        except KeyError:
            known = ", ".join(self._tables_by_name)
            raise StoreError(f"{self.path}: no table '{name}' (tables: {known})") from None

    def task(self, name: str) -> TaskInfo:
        """The task called `name`."""
        try:
            return self._tasks_by_name[name]
        except KeyError:
            known = ", ".join(self._tasks_by_name) or "none"
            raise StoreError(f"{self.path}: no task '{name}' (tasks: {known})") from None

    def link_task(self, name: str) -> LinkTaskInfo:
        """The link task called `name`."""
        try:
            return self._links_by_name[name]
        except KeyError:
            known = ", ".join(self._links_by_name) or "none"
            raise StoreError(f"{self.path}: no link task '{name}' (link tasks: {known})") from None

    def link_arrays(self, name: str) -> LinkArrays:
        """A link task's seeds and, per seed, its target rows."""
        self.link_task(name)
        return LinkArrays(*(self._get(fmt.task_file(name, f)) for f in
                            ("anchor_row", "obs_time", "link.offsets", "link.targets")))

    def values(self, table: str, column: str) -> np.ndarray | None:
        """Encoded values of a column (see the format table); None for an identifier column."""
        col = self.table(table).column(column)
        if col.stype == SemanticType.IDENTIFIER:
            return None
        return self._get(fmt.values_file(table, column))

    def validity(self, table: str, column: str) -> np.ndarray:
        """Packed validity bits of a column (1 = non-null); unpack with `unpack_bits(bits, num_rows)`."""
        self.table(table).column(column)
        return self._get(fmt.valid_file(table, column))

    def keys(self, table: str) -> pa.Array | None:
        """Primary-key values of a table in row order (None when it has no primary key or the store predates keys)."""
        info = self.table(table)
        rel = fmt.keys_file(table)
        if info.primary_key is None or rel not in self._arrays:
            return None
        arr = self._arrays[rel]
        if arr.dtype.kind in "iu":
            return pa.array(np.asarray(arr, dtype=np.int64))
        return pa.array(np.asarray(arr).tolist(), pa.string())

    def task_arrays(self, name: str) -> TaskArrays:
        """The anchor rows, observation times and encoded targets of a task."""
        self.task(name)
        return TaskArrays(
            anchor_row=self._get(fmt.task_file(name, "anchor_row")),
            obs_time=self._get(fmt.task_file(name, "obs_time")),
            target_values=self._get(fmt.task_file(name, "target.values")),
            target_valid=self._get(fmt.task_file(name, "target.valid")),
        )

    def table_of_row(self, rows: np.ndarray) -> np.ndarray:
        """Table index of each global row."""
        offsets = np.array([t.row_offset for t in self.tables], dtype=np.int64)
        return np.searchsorted(offsets, np.asarray(rows, dtype=np.int64), side="right") - 1

    @property
    def timestamp_stats(self) -> tuple[float, float]:
        """(mean, std) in epoch µs of the database-wide z-score every timestamp of the store is encoded with."""
        ts = self.meta.get("timestamp_stats")
        if not isinstance(ts, dict) or "mean" not in ts or "std" not in ts:
            raise StoreError(f"{self.path}: metadata.json lacks timestamp_stats; preprocess the database again")
        return float(ts["mean"]), float(ts["std"]) or 1.0

    @property
    def row_time(self) -> np.ndarray:
        return self._get(fmt.ROW_TIME)

    @property
    def parent_indptr(self) -> np.ndarray:
        return self._get(fmt.PARENT_INDPTR)

    @property
    def parent_indices(self) -> np.ndarray:
        return self._get(fmt.PARENT_INDICES)

    @property
    def parent_column(self) -> np.ndarray:
        return self._get(fmt.PARENT_COLUMN)

    @property
    def child_indptr(self) -> np.ndarray:
        return self._get(fmt.CHILD_INDPTR)

    @property
    def child_indices(self) -> np.ndarray:
        return self._get(fmt.CHILD_INDICES)

    @property
    def child_time(self) -> np.ndarray:
        return self._get(fmt.CHILD_TIME)

    @property
    def child_column(self) -> np.ndarray:
        return self._get(fmt.CHILD_COLUMN)

    @property
    def column_embeddings(self) -> np.ndarray:
        return self._get(fmt.COLUMN_EMBEDDINGS)

    @property
    def categorical_embeddings(self) -> np.ndarray:
        return self._get(fmt.CATEGORY_EMBEDDINGS)

    @property
    def text_embeddings(self) -> np.ndarray:
        return self._get(fmt.TEXT_EMBEDDINGS)

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}, tables={len(self.tables)}, rows={self.num_rows}, tasks={len(self.tasks)})"


# Arrays smaller than this are read into memory (read-only) rather than memory-mapped: a memory map holds an open
# file descriptor for as long as it lives, a store has ~100-200 small files, and a corpus of a few hundred stores
# opened by one pretraining run passed the usual 1,024-20,000 descriptors a process may hold (`Too many open files`
# at 200 databases; docs/design/decisions.md, "Store arrays"). Large arrays stay mapped (pages loaded on demand).
MMAP_MIN_BYTES = 1 << 20


def _open_array(root: Path, rel: str, spec: dict[str, Any]) -> np.ndarray:
    """Open one listed file read-only (memory-mapped when at least `MMAP_MIN_BYTES`, else read into memory) and
    check it against its recorded dtype and shape."""
    file = root / rel
    if not file.is_file():
        raise StoreError(f"{root}: missing file '{rel}' listed in {fmt.METADATA_FILE}")
    want_dtype = np.dtype(spec["dtype"])
    want_shape = tuple(int(s) for s in spec["shape"])
    try:
        with open(file, "rb") as fh:
            major, minor = np.lib.format.read_magic(fh)
            if (major, minor) == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            header_len = fh.tell()
    except (ValueError, OSError) as exc:
        raise StoreError(f"{root}: file '{rel}' is not a valid .npy file ({exc})") from None
    if dtype != want_dtype or tuple(shape) != want_shape or fortran:
        raise StoreError(
            f"{root}: file '{rel}' holds {dtype}{list(shape)}, metadata says {want_dtype}{list(want_shape)}"
        )
    expected = header_len + int(np.prod(want_shape, dtype=np.int64)) * want_dtype.itemsize
    actual = file.stat().st_size
    if actual != expected:
        raise StoreError(f"{root}: file '{rel}' is truncated or padded ({actual} bytes, expected {expected})")
    if expected == header_len:  # empty arrays cannot be memory-mapped
        arr = np.zeros(want_shape, dtype=want_dtype)
        arr.flags.writeable = False
        return arr
    if expected < MMAP_MIN_BYTES:
        arr = np.load(file)
        arr.flags.writeable = False
        return arr
    try:
        return np.load(file, mmap_mode="r")
    except OSError as exc:
        if exc.errno == errno.EMFILE:
            raise StoreError(f"{root}: cannot map '{rel}': this process has too many open files ({exc.strerror}); "
                             "raise the limit (`ulimit -n`) or open fewer stores at once") from None
        raise
