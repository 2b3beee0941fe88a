"""Re-coded answers: a share of training contexts whose task's answers are re-coded the same way in every cell.

Why: a model trained on a task can learn its answers by heart (the class that "manufacturer" usually takes, where
the z-scored delays sit) and ignore the labelled rows in its context; on a task or database it never trained on
it then answers one class for every row (measured: docs/design/decisions.md, "Re-coded answers in pretraining"). In a
re-coded context the answers mean something else than usual, consistently for the target and for every visible
cell of the task's own column (its labelled rows, and for a cell-masking task the same column of the other rows),
so only the context says what they are; the model must read it. The rule per target type:

* categorical: a random permutation of the task's K classes, applied to every category id of its block;
* boolean: true and false swapped in every cell of the task's column;
* numerical: z -> a z + b in every cell of the task's column, with |a| in [1/2, 2], a random sign and b in
  [-1, 1] (z-units);
* timestamp: left as it is (a shifted time would contradict the row ages and the rows' own times).

Drawn per sequence from (sampling seed, epoch, database, task, seed id), so batches stay deterministic; training
contexts only (`sampler.relabel`), never evaluation or prediction. A context's other columns are not touched.
"""

from __future__ import annotations

import numpy as np

from confluence.sampler.data import TaskData
from confluence.sampler.rng import hash_unit, stream_key
from confluence.targets import kind


def relabel_draw(seed: int, epoch: int, db_idx: int, task: TaskData, seed_ids: np.ndarray, share: float) -> np.ndarray:
    """Which of these sequences are re-coded ([B] bool; none for a kind that is not re-coded or share 0)."""
    if share <= 0 or not kind(task.target_stype).recodes:
        return np.zeros(seed_ids.shape[0], dtype=np.bool_)
    return hash_unit(stream_key("relabel", seed, epoch, db_idx, task.index), seed_ids) < share


def relabel(out: dict[str, np.ndarray], task: TaskData, draw: np.ndarray, seed: int, epoch: int, db_idx: int,
            seed_ids: np.ndarray) -> None:
    """Re-code, in place, the answers of the sequences `draw` marks, as the target's kind does
    (`TargetKind.recode`; the module doc says how)."""
    k = kind(task.target_stype)
    key = int(stream_key("relabel-code", seed, epoch, db_idx, task.index))
    for b in np.flatnonzero(draw):
        k.recode(out, int(b), task, np.random.default_rng([key, int(seed_ids[b]) & 0x7FFFFFFFFFFFFFFF]))
