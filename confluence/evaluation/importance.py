"""Which columns a task's answers rely on (`evaluate --importance`): the model's and LightGBM's, side by side.

The model's: each column's cells are shuffled among the contexts of the evaluated seeds (every cell of that
column, in every context, gets the value and NULL-ness of another of its cells; the target cell never moves) and
the headline metric is measured again; a column's importance is how much the metric gets worse. Permuting within
the same contexts keeps every other input as it was, so the difference is the column's alone (Breiman's
permutation importance, on the model's own inputs). LightGBM's: the share of its total split gain that features
built from the column earned (its features are named after the column they read: `table.column`, `parent.column`,
`mean(child.column)`, ...).

Both are per column name (`table.column`); a user reads where the two disagree (a column LightGBM leans on that the
model ignores is a place its context may not hold what a feature aggregates).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from confluence.batch import TrainingBatch
from confluence.targets import decode_targets, kind

# the value tensors a cell's content lives in (its identity, position and structure stay)
VALUE_FIELDS = ("is_null", "numeric_values", "timestamp_values", "bool_values", "categorical_embed_ids",
                "text_embed_ids")


def shuffled_column(batches: list[TrainingBatch], column: int, rng: np.random.Generator) -> list[TrainingBatch]:
    """Copies of `batches` in which the non-target cells of global column `column` exchange their values (every
    value field together) at random across all the batches' contexts."""
    import dataclasses

    where = [np.nonzero((b.column_ids == column) & ~b.is_target & ~b.is_padding) for b in batches]
    counts = [w[0].size for w in where]
    total = sum(counts)
    if total < 2:
        return batches
    pooled = {f: np.concatenate([getattr(b, f)[w] for b, w in zip(batches, where, strict=True)]) for f in VALUE_FIELDS}
    order = rng.permutation(total)
    out, lo = [], 0
    for b, w, n in zip(batches, where, counts, strict=True):
        changes = {}
        for f in VALUE_FIELDS:
            arr = getattr(b, f).copy()
            arr[w] = pooled[f][order[lo:lo + n]]
            changes[f] = arr
        out.append(dataclasses.replace(b, **changes))
        lo += n
    return out


def _score(predictor: Any, task: str, batches: list[TrainingBatch], truth: np.ndarray, keep: np.ndarray,
           clip_numbers: bool) -> float:
    from confluence.evaluation.evaluate import model_point_predictions
    from confluence.inference.predictor import HeadOutputs

    parts = [predictor.forward(b) for b in batches]
    out = HeadOutputs(*(np.concatenate([getattr(p, f) for p in parts]) for f in HeadOutputs.__dataclass_fields__))
    pred = model_point_predictions(predictor, task, out, keep, clip_numbers)
    k = kind(predictor.store.task(task).target_stype)
    return float(k.metrics(truth, pred)[k.headline[0]])


def model_importance(predictor: Any, task: str, seed_ids: np.ndarray, *, context: str = "val", repeats: int = 1,
                     seed: int = 0, clip_numbers: bool = True, top: int | None = None) -> dict[str, Any]:
    """The model's permutation importance of every column its contexts of `seed_ids` show (one draw each):
    `{"metric", "higher_is_better", "base", "columns": {name: worsening of the metric, mean over `repeats`}}`,
    most important first (`top`: only that many)."""
    store = predictor.store
    ids = np.asarray(seed_ids, np.int64)
    truth_all = decode_targets(store, task, ids)
    keep = ~truth_all.is_null
    truth = truth_all.values[keep]
    k = kind(store.task(task).target_stype)
    metric, higher = k.headline
    sampler = predictor.stream.sampler
    bs = predictor.batch_size
    batches = [sampler.build(task, ids[lo:lo + bs], context=context).batch for lo in range(0, ids.size, bs)]
    base = _score(predictor, task, batches, truth, keep, clip_numbers)
    data = sampler.data[sampler.entry(task).db_idx]
    cols = sorted({int(c) for b in batches for c in np.unique(b.column_ids[~b.is_padding & ~b.is_target])})
    rng = np.random.default_rng(seed)
    scores: dict[str, float] = {}
    for c in cols:
        vals = [_score(predictor, task, shuffled_column(batches, c, rng), truth, keep, clip_numbers)
                for _ in range(repeats)]
        drop = float(np.mean([(base - v) if higher else (v - base) for v in vals]))
        name = data.column_names[c]
        scores[name] = scores.get(name, 0.0) + (drop if math.isfinite(drop) else 0.0)
    ranked = dict(sorted(scores.items(), key=lambda kv: -kv[1])[:top])
    return {"metric": metric, "higher_is_better": higher, "base": base, "seeds": int(keep.sum()), "columns": ranked}


def feature_column(feature: str) -> str | None:
    """The `table.column` a LightGBM feature reads: the last dotted piece of its name (`p:flights.tailnum->planes.year`
    -> `planes.year`; a sibling count `sib:flights.carrier<-flights.carrier:count` -> `flights.carrier`)."""
    pieces = [p for p in re.split(r"->|<-|:", feature) if "." in p]
    return pieces[-1] if pieces else None


def gbdt_importance(model: Any) -> dict[str, float]:
    """LightGBM's split gain per column (`feature_column` of each feature), as a share of its total gain, largest
    first."""
    gain = np.asarray(model.booster.feature_importance(importance_type="gain"), np.float64)
    total = float(gain.sum()) or 1.0
    out: dict[str, float] = {}
    for name, g in zip(model.feature_names, gain, strict=True):
        col = feature_column(name)
        if col is not None:
            out[col] = out.get(col, 0.0) + float(g) / total
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
