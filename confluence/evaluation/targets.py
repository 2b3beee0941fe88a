"""Task targets decoded back to the user's units, for metrics and baselines.

numerical -> float64 in the target's original units (z-score undone with the task's stats);
boolean -> bool; categorical -> class index 0..K-1 within the target's category block;
timestamp -> float64 epoch microseconds (the epoch component undone with the database-wide stats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from confluence.store.format import unpack_bits
from confluence.stypes import SemanticType


@dataclass
class DecodedTargets:
    stype: SemanticType
    values: np.ndarray  # [n], see module docstring; undefined where is_null
    is_null: np.ndarray  # [n] bool
    num_classes: int  # categorical K (0 otherwise)
    categories: list[str] | None  # categorical: the class strings, in block order


def task_categories(store: Any, task: Any) -> list[str]:
    """Class strings of a categorical task, in block order (derived targets have their own block)."""
    stats = task.stats or {}
    if "categories" in stats:
        return list(stats["categories"])
    col = store.columns[task.target_column_idx]
    return list(col.stats["categories"])


def decode_targets(store: Any, task_name: str, ids: np.ndarray | None = None) -> DecodedTargets:
    """Decode the targets of `task_name` for seed indices `ids` (all seeds when None)."""
    task = store.task(task_name)
    arrays = store.task_arrays(task_name)
    n = len(arrays.anchor_row)
    ids = np.arange(n) if ids is None else np.asarray(ids, dtype=np.int64)
    valid = unpack_bits(arrays.target_valid, n)[ids]
    stype = SemanticType(task.target_stype)
    raw = arrays.target_values
    k = 0
    cats = None
    if stype == SemanticType.NUMERICAL:
        mean, std = float(task.stats["mean"]), float(task.stats["std"]) or 1.0
        values = np.asarray(raw[ids], dtype=np.float64) * std + mean
    elif stype == SemanticType.BOOLEAN:
        values = unpack_bits(raw, n)[ids]
    elif stype == SemanticType.CATEGORICAL:
        values = np.asarray(raw[ids], dtype=np.int64) - int(task.cat_block_start)
        k = int(task.cat_count)
        cats = task_categories(store, task)
    elif stype == SemanticType.TIMESTAMP:
        mean, std = store.timestamp_stats
        values = np.asarray(raw[ids, 14], dtype=np.float64) * std + mean
    else:
        raise ValueError(f"task '{task_name}': target type {stype.label} cannot be a target")
    return DecodedTargets(stype=stype, values=values, is_null=~valid, num_classes=k, categories=cats)
