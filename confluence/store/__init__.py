"""The processed store: format constants and the read-only `Store` reader."""

from confluence.store.format import FORMAT_VERSION, get_bit, pack_bits, unpack_bits
from confluence.store.reader import (
    ColumnInfo,
    LinkArrays,
    LinkTaskInfo,
    Store,
    TableInfo,
    TaskArrays,
    TaskInfo,
)

__all__ = [
    "FORMAT_VERSION",
    "ColumnInfo",
    "LinkArrays",
    "LinkTaskInfo",
    "Store",
    "TableInfo",
    "TaskArrays",
    "TaskInfo",
    "get_bit",
    "pack_bits",
    "unpack_bits",
]
