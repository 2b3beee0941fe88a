"""Constants and small helpers of the processed store format (docs/reference/store.md).

File names are relative to the store directory; every array is a little-endian `.npy` file and bit arrays are
`np.packbits(..., bitorder="little")`.
"""

from __future__ import annotations

import numpy as np

from confluence.stypes import SemanticType

FORMAT_VERSION = 2  # 2: tasks with an observation_time_column carry an observation-time cell
METADATA_FILE = "metadata.json"

INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max
NO_CUTOFF = INT64_MAX  # obs_time meaning "the whole database is visible"
STATIC_TIME = INT64_MIN  # row_time of a row of a table without a temporal column
NULL_TIME = INT64_MAX  # row_time of a row whose temporal value is NULL
# the windows (days) of the windowed child-count columns a store has for each foreign key of a temporal table
# (`preprocess.pipeline.child_count_columns`; the sampler shows those that `child_count_windows` names)
COUNT_WINDOWS_DAYS = (1, 7, 30, 90, 365)
# the semantic types a children's-mean column averages (`preprocess.pipeline.child_mean_columns`;
# the sampler reads the same rule to tell a store made before the mean columns)
MEAN_VALUE_STYPES = (SemanticType.NUMERICAL, SemanticType.BOOLEAN)

ROW_TIME = "graph/row_time.npy"
PARENT_INDPTR = "graph/parent_indptr.npy"
PARENT_INDICES = "graph/parent_indices.npy"
PARENT_COLUMN = "graph/parent_column.npy"
CHILD_INDPTR = "graph/child_indptr.npy"
CHILD_INDICES = "graph/child_indices.npy"
CHILD_TIME = "graph/child_time.npy"
CHILD_COLUMN = "graph/child_column.npy"
COLUMN_EMBEDDINGS = "embeddings/columns.npy"
CATEGORY_EMBEDDINGS = "embeddings/categories.npy"
TEXT_EMBEDDINGS = "embeddings/text.npy"


def values_file(table: str, column: str) -> str:
    """Relative path of a column's encoded values."""
    return f"tables/{table}/{column}.values.npy"


def keys_file(table: str) -> str:
    """Relative path of a table's primary-key values in row order (int64, or fixed-width unicode strings)."""
    return f"tables/{table}/_primary_key.npy"


def valid_file(table: str, column: str) -> str:
    """Relative path of a column's packed validity bits."""
    return f"tables/{table}/{column}.valid.npy"


def task_file(task: str, name: str) -> str:
    """Relative path of a task array: anchor_row, obs_time, target.values or target.valid."""
    return f"tasks/{task}/{name}.npy"


def num_bit_bytes(n: int) -> int:
    """Bytes of a packed bit array holding `n` bits."""
    return (n + 7) // 8


def pack_bits(mask: np.ndarray) -> np.ndarray:
    """Pack a boolean array into little-endian bit order (bit i = (a[i >> 3] >> (i & 7)) & 1)."""
    return np.packbits(np.asarray(mask, dtype=bool), bitorder="little")


def unpack_bits(bits: np.ndarray, n: int) -> np.ndarray:
    """Unpack the first `n` bits of a packed array into a bool[n] array."""
    if len(bits) < num_bit_bytes(n):
        raise ValueError(f"bit array of {len(bits)} bytes cannot hold {n} bits")
    return np.unpackbits(np.asarray(bits, dtype=np.uint8), count=n, bitorder="little").astype(bool)


def get_bit(bits: np.ndarray, i: int) -> bool:
    """Read bit `i` of a packed array."""
    return bool((int(bits[i >> 3]) >> (i & 7)) & 1)
