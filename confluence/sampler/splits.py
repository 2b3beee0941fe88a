"""Seed splits (hash / temporal, spec/tasks.md) and round-robin sharding over ranks."""

from __future__ import annotations

from typing import Any

import numpy as np

from confluence.errors import ConfluenceError
from confluence.sampler.config import SplitConfig
from confluence.sampler.rng import hash_unit, stream_key

SPLITS = ("train", "val", "test")

def split_index(name: str) -> int:
    """0, 1, 2 for 'train', 'val', 'test'; ConfluenceError otherwise."""
    try:
        return SPLITS.index(name)
    except ValueError:
        raise ConfluenceError(f"unknown split {name!r} (expected one of: {', '.join(SPLITS)})") from None


def hash_split(task_name: str, anchor_rows: np.ndarray, seed: int, fractions: tuple[float, float, float]) -> np.ndarray:
    """Split id (0 train, 1 val, 2 test) per seed from a stable hash of (task name, split seed, anchor row).

    Independent of the sampling seed and of the process: every seed with the same anchor row of a task lands in
    the same split.
    """
    u = hash_unit(stream_key("split", task_name, seed), np.asarray(anchor_rows, dtype=np.int64))
    out = np.full(u.shape[0], 2, dtype=np.int8)
    out[u < fractions[0] + fractions[1]] = 1
    out[u < fractions[0]] = 0
    return out


def temporal_split(obs_time: np.ndarray, t_val: int, t_test: int) -> np.ndarray:
    """Split id per seed: obs <= t_val train, obs <= t_test val, later (or no cut-off) test."""
    obs = np.asarray(obs_time, dtype=np.int64)
    out = np.full(obs.shape[0], 2, dtype=np.int8)
    out[obs <= t_test] = 1
    out[obs <= t_val] = 0
    return out


def assign_splits(task_name: str, anchor_rows: np.ndarray, obs_time: np.ndarray, cfg: SplitConfig) -> np.ndarray:
    """The split id of every seed of a task under `cfg`."""
    if cfg.mode == "hash":
        return hash_split(task_name, anchor_rows, cfg.seed, cfg.fractions)
    return temporal_split(obs_time, int(cfg.t_val), int(cfg.t_test))


def own_split(split: dict[str, Any]) -> SplitConfig:
    """The temporal SplitConfig of a task's own `split` (metadata: `val_time`, `test_time`): RelBench's rule,
    observed before `val_time` train, before `test_time` val, else test. `temporal_split` puts `obs <= t_val` in
    train, so the cut-offs are the microsecond before each time."""
    from confluence.schema.metadata import epoch_us, parse_time

    val, test = (epoch_us(parse_time(str(split[k]))) for k in ("val_time", "test_time"))
    return SplitConfig(mode="temporal", t_val=val - 1, t_test=test - 1)


def task_split(store: Any, task: str, default: SplitConfig) -> SplitConfig:
    """The split of `task` in `store`: its own (the metadata's `split`, e.g. a RelBench task's, whatever the
    run's config says) when it records one, else `default` (the run's `sampler.split`). `store` is a `Store`
    or anything with its `meta` (a `SamplerData` without one gets `default`)."""
    meta = getattr(store, "meta", None)
    tasks = ((meta or {}).get("database") or {}).get("tasks") or {}
    split = (tasks.get(task) or {}).get("split")
    return own_split(split) if split else default


def shard(seed_ids: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Round-robin share of `rank`: the seeds at positions i with i % world_size == rank."""
    if not 0 <= rank < world_size:
        raise ConfluenceError(f"rank must be in 0..world_size-1, got rank={rank}, world_size={world_size}")
    return np.asarray(seed_ids)[rank::world_size]


def subsample(ids: np.ndarray, cap: int | None, seed: int = 0) -> np.ndarray:
    """At most `cap` of `ids`, drawn without replacement by a fixed seed and sorted: the same rows every time, spread
    over the whole split. Taking the first `cap` instead would pick the oldest seeds of a split that spans the
    data's time (a hash split), whose contexts have no history and no labels yet: no measure of the rest."""
    if cap is None or len(ids) <= cap:
        return ids
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(ids, size=cap, replace=False))


def split_seed_ids(
    task_name: str, anchor_rows: np.ndarray, obs_time: np.ndarray, cfg: SplitConfig, split: str, rank: int = 0,
    world_size: int = 1,
) -> np.ndarray:
    """Seed indices (ascending) of `split` for this rank."""
    ids = np.flatnonzero(assign_splits(task_name, anchor_rows, obs_time, cfg) == split_index(split)).astype(np.int64)
    return shard(ids, rank, world_size)
