"""Waits: a timestamp task with observation times ("when will this team play next?") answered as the observation
time plus a wait, read in the task's own unit.

A timestamp's epoch is a z-score over the whole database's time span: on a database of 150 years a month is 0.003
units, so errors of weeks are invisible to a loss measured in them and nothing trains the model to tell a short
wait from a long one. For such a task each sequence carries `wait_ref`, its observation time's epoch plus the
task's median wait, and `wait_scale`, the waits' mean absolute deviation from that median; the model answers
`wait_ref + wait_scale * w` (`model.heads.TimeReference`, `ModelConfig.time_wait`) and the loss reads the error
divided by `wait_scale`. Both come from the task's train split only (like a column's z-score, a statistic of the
training data), and from the observation time, which every sequence shows as a cell: they say nothing of a seed's
own answer. A task whose target is a row's own cell (`flights.dep_at`) has no wait: its observation time is the
row's own time, which may be the answer itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from confluence.sampler.data import TaskData
from confluence.store.format import NO_CUTOFF
from confluence.stypes import SemanticType

# fewer train waits than this and the task gets none (the median and its deviation would be noise)
MIN_WAITS = 8
# a deviation below this (z-units) is float32 rounding of equal waits (an epoch near 1 is spaced 1.2e-7): none
MIN_SCALE = 1e-6


def has_waits(task: TaskData) -> bool:
    """Whether `task` can have a wait: a derived timestamp task with an observation-time cell."""
    return int(task.target_stype) == int(SemanticType.TIMESTAMP) and bool(task.is_derived) and task.obs_col >= 0


def wait_stats(task: TaskData, train_ids: np.ndarray) -> tuple[float, float]:
    """(median wait, mean absolute deviation from it) in epoch z-units over the seeds `train_ids` whose target is
    known and whose observation time is a real cut-off; (0, 0) for a task without waits or too few of them."""
    if not has_waits(task):
        return 0.0, 0.0
    ids = np.asarray(train_ids, dtype=np.int64)
    valid = np.unpackbits(task.tgt_valid, count=task.num_seeds, bitorder="little").astype(bool)
    ids = ids[valid[ids] & (task.obs_time[ids] != NO_CUTOFF)]
    if ids.shape[0] < MIN_WAITS:
        return 0.0, 0.0
    waits = task.tgt_ts[ids, -1].astype(np.float64) - task.obs_ts[ids, -1].astype(np.float64)
    median = float(np.median(waits))
    scale = float(np.mean(np.abs(waits - median)))
    if not (np.isfinite(median) and np.isfinite(scale)) or scale < MIN_SCALE:
        return 0.0, 0.0
    return median, scale


def with_waits(task: TaskData, train_ids: np.ndarray) -> TaskData:
    """`task` carrying its wait statistics (`TaskData.wait_median`, `wait_scale`) from the seeds `train_ids`."""
    median, scale = wait_stats(task, train_ids)
    return dataclasses.replace(task, wait_median=median, wait_scale=scale)


def sequence_waits(task: TaskData, seed_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`wait_ref`, `wait_scale` (float32 [B]) of the sequences of these seeds: the observation time's epoch plus
    the median wait and the scale where the task has waits and the seed a real cut-off, 0 and 0 elsewhere."""
    b = np.asarray(seed_ids).shape[0]
    ref, scale = np.zeros(b, np.float32), np.zeros(b, np.float32)
    if task.wait_scale <= 0.0:  # a task without waits (`with_waits` gives only those a scale)
        return ref, scale
    ids = np.asarray(seed_ids, dtype=np.int64)
    cut = task.obs_time[ids] != NO_CUTOFF
    ref[cut] = (task.obs_ts[ids[cut], -1].astype(np.float64) + task.wait_median).astype(np.float32)
    scale[cut] = np.float32(task.wait_scale)
    return ref, scale
