"""Task targets decoded back to the user's units, for metrics and baselines (each kind's `decode`):

numerical -> float64 in the target's original units (z-score undone with the task's stats);
boolean -> bool; categorical -> class index 0..K-1 within the target's category block;
timestamp -> float64 epoch microseconds (the epoch component undone with the database-wide stats).

`numerical_predictions` turns the numerical head's z-scores into the numbers a user receives and evaluation scores:
de-normalized, then kept inside what the train split's targets imply (`TargetRange`: clipped to their [min, max],
rounded when they are all whole numbers), so a count is never predicted negative or fractional.
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
    from confluence.targets import kind

    task = store.task(task_name)
    arrays = store.task_arrays(task_name)
    n = len(arrays.anchor_row)
    ids = np.arange(n) if ids is None else np.asarray(ids, dtype=np.int64)
    valid = unpack_bits(arrays.target_valid, n)[ids]
    stype = SemanticType(task.target_stype)
    try:
        k = kind(stype)
    except ValueError:
        raise ValueError(f"task '{task_name}': target type {stype.label} cannot be a target") from None
    values = k.decode(store, task, arrays.target_values, n, ids)
    classes = k.num_classes(store, task)
    return DecodedTargets(stype=stype, values=values, is_null=~valid, num_classes=classes,
                          categories=task_categories(store, task) if classes else None)


@dataclass(frozen=True)
class TargetRange:
    """What the train split's targets of a numerical task imply about its values: they lie in [lo, hi], and they
    are whole numbers when `integer` (a count, a number of days, a star rating)."""

    lo: float
    hi: float
    integer: bool

    def apply(self, values: np.ndarray) -> np.ndarray:
        """`values` rounded (when the targets are whole numbers) and clipped to [lo, hi]."""
        v = np.asarray(values, dtype=np.float64)
        if self.integer:
            v = np.round(v)
        return np.clip(v, self.lo, self.hi) + 0.0  # + 0.0: no -0.0 (a rounded -0.3) in a user's table


def train_target_range(store: Any, task_name: str, train_ids: np.ndarray) -> TargetRange | None:
    """The `TargetRange` of the non-null train targets of a numerical task (`train_ids`: its train split's seed
    indices); None for other target types or when the train split has no non-null target."""
    if SemanticType(store.task(task_name).target_stype) != SemanticType.NUMERICAL:
        return None
    t = decode_targets(store, task_name, train_ids)
    v = t.values[~t.is_null]
    if v.size == 0:
        return None
    # Targets are stored as float32 z-scores, so a whole number comes back within ~6e-8 |v - mean| of itself.
    tol = 1e-6 * max(1.0, float(np.max(np.abs(v - np.mean(v)))))
    integer = bool(np.all(np.abs(v - np.round(v)) <= tol))
    lo, hi = float(v.min()), float(v.max())
    if integer:
        lo, hi = float(np.round(lo)), float(np.round(hi))
    lo, hi = (0.0 if abs(x) <= tol else x for x in (lo, hi))  # a 0 that came back as -3e-8 is 0: keep the sign
    return TargetRange(lo=lo, hi=hi, integer=integer)


def numerical_predictions(store: Any, task_name: str, z: np.ndarray, train_ids: np.ndarray | None) -> np.ndarray:
    """The numerical head's outputs `z` (z-scores of the task's statistics) in the user's units, rounded and
    clipped as the train targets imply (`train_target_range`; nothing when `train_ids` is None). `predict` and
    `evaluate` both use it, so the evaluated numbers are the numbers a user receives."""
    info = store.task(task_name)
    mean, std = float(info.stats["mean"]), float(info.stats["std"]) or 1.0
    values = np.asarray(z, dtype=np.float64) * std + mean
    rng = None if train_ids is None else train_target_range(store, task_name, train_ids)
    return values if rng is None else rng.apply(values)
