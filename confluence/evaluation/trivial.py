"""The trivial baselines of one task, fitted once on its train split and applied to any rows.

`evaluate` scores them beside the model (`metrics.trivial_baselines`, the constants, and a timestamp task's
`median_offset`, which reads each row's observation time). The blend (`blend.fit_blend`) compares what it would ship
with them on validation and ships the best of them where nothing else is shown better there; `predict` and `serve`
then answer new rows with it. `TrivialFit` is that fitted baseline set: the constants as one row each, and the
median offset of a "when next" task (train targets minus their observation times), so new rows, seeds or anchors
with their own observation times, get exactly the predictions the validation rows were compared with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from confluence.stypes import SemanticType
from confluence.targets import kind
from confluence.targets.timestamp import has_cutoff

MEDIAN_OFFSET = "median_offset"  # the timestamp baseline read from each row's observation time


@dataclass(frozen=True)
class TrivialFit:
    """One task's trivial baselines: `constants` (name -> the prediction of every row, in the units of
    `metrics.metrics_for`: P(true), [K] probabilities, a value, epoch µs) and `offset` (µs: the median of the train
    targets less their observation times; None where the task has no observation-time column, or a row without a
    cut-off)."""

    constants: dict[str, np.ndarray] = field(default_factory=dict)
    offset: float | None = None

    def predictions(self, n: int, obs: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Every baseline's predictions for `n` rows whose observation times are `obs` (the median offset only
        where every row has a cut-off)."""
        out = {name: np.repeat(row[None], n, axis=0) if row.ndim else np.full(n, float(row))
               for name, row in self.constants.items()}
        if self.offset is not None and obs is not None and len(obs) == n and has_cutoff(obs).all():
            out[MEDIAN_OFFSET] = np.asarray(obs, np.float64) + self.offset
        return out


def fit_trivial(store: object, task: str, train_ids: np.ndarray, num_classes: int | None = None) -> TrivialFit:
    """The trivial baselines of `task` fitted on its train seeds `train_ids` (their non-null targets);
    `num_classes`: a categorical task's width (the categories the other predictors' probabilities span)."""
    from confluence.targets import decode_targets
    from confluence.targets.timestamp import median_offset

    stype = SemanticType(int(store.task(task).target_stype))
    train = decode_targets(store, task, train_ids)
    values = train.values[~train.is_null]
    constants = {name: np.asarray(pred[0]) for name, pred in
                 kind(stype).trivial_predictions(values, 1, num_classes).items()}
    offset = median_offset(store, task, train_ids, train) if stype == SemanticType.TIMESTAMP else None
    return TrivialFit(constants=constants, offset=offset)


def seed_obs(store: object, task: str, ids: np.ndarray) -> np.ndarray:
    """The observation times of seeds `ids` of `task` (epoch µs; `NO_CUTOFF` where none)."""
    return np.asarray(store.task_arrays(task).obs_time, np.int64)[np.asarray(ids, np.int64)]
