"""`run_baselines`: trivial baselines and LightGBM for every task of a store, on the sampler's splits."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from confluence.errors import ConfluenceError
from confluence.evaluation import metrics as M
from confluence.evaluation.gbdt import FeatureBuilder, fit_gbdt
from confluence.sampler.config import SamplerConfig, SplitConfig
from confluence.sampler.splits import split_seed_ids, task_split
from confluence.store import Store
from confluence.stypes import SemanticType
from confluence.targets import decode_targets, kind


def split_ids(store: Store, task: str, split: str, split_config: SplitConfig | None = None) -> np.ndarray:
    """Seed indices of a split, exactly as the sampler assigns them (same hash / temporal rule; a task's own split,
    such as a RelBench task's, first)."""
    cfg = task_split(store, task, split_config or SamplerConfig().split)
    arrays = store.task_arrays(task)
    return split_seed_ids(task, np.asarray(arrays.anchor_row), np.asarray(arrays.obs_time), cfg, split, 0, 1)


def run_baselines(
    db: str | Path | Store,
    *,
    tasks: Sequence[str] | None = None,
    split: str = "test",
    max_train: int = 50_000,
    max_seeds: int | None = 5000,
    split_config: SplitConfig | None = None,
    gbdt: bool = True,
    progress: Any = None,
) -> dict[str, dict]:
    """`{task: {"baseline": best trivial, <trivial>: ..., "gbdt": ..., "info": ...}}` on the given split.
    `progress`: a `confluence.toolkit.progress.Reporter` for LightGBM's stages."""
    from confluence.sampler.splits import subsample

    store = db if isinstance(db, Store) else Store.open(db)
    names = [t.name for t in store.tasks] if not tasks else list(tasks)
    known = {t.name for t in store.tasks}
    if any(t not in known for t in names):
        raise ConfluenceError(f"task(s) {[t for t in names if t not in known]} not in store {store.name!r}")
    builder = FeatureBuilder(store, progress=progress) if gbdt else None
    out: dict[str, dict] = {}
    for task in names:
        stype = SemanticType(int(store.task(task).target_stype))
        train_ids = split_ids(store, task, "train", split_config)
        eval_ids = subsample(split_ids(store, task, split, split_config), max_seeds)
        if len(eval_ids) == 0 or len(train_ids) == 0:
            out[task] = {"info": {"stype": stype.label, "n_eval": int(len(eval_ids)), "note": "empty split"}}
            continue
        tr = decode_targets(store, task, train_ids)
        ev = decode_targets(store, task, eval_ids)
        trivial = M.trivial_baselines(stype, tr.values[~tr.is_null], ev.values[~ev.is_null],
                                      num_classes=ev.num_classes or None)
        for name, pred in kind(stype).row_baselines(store, task, train_ids, eval_ids, tr, ev).items():
            trivial[name] = M.metrics_for(stype, ev.values[~ev.is_null], pred)
        name, best = M.best_baseline(stype, trivial)
        entry: dict = {"baseline": {**best, "name": name}, **trivial}
        if builder is not None:
            entry["gbdt"] = fit_gbdt(store, task, train_ids, eval_ids, builder=builder, max_train=max_train,
                                     progress=progress).metrics
        entry["info"] = {"stype": stype.label, "split": split, "n_eval": int(len(eval_ids)), "n_train": int(len(train_ids))}
        out[task] = entry
    return out
