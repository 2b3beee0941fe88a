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
from confluence.stypes import SemanticType

CAT, BOOL, NUM = int(SemanticType.CATEGORICAL), int(SemanticType.BOOLEAN), int(SemanticType.NUMERICAL)


def relabel_draw(seed: int, epoch: int, db_idx: int, task: TaskData, seed_ids: np.ndarray, share: float) -> np.ndarray:
    """Which of these sequences are re-coded ([B] bool; none for a timestamp task or share 0)."""
    if share <= 0 or int(task.target_stype) not in (CAT, BOOL, NUM):
        return np.zeros(seed_ids.shape[0], dtype=np.bool_)
    return hash_unit(stream_key("relabel", seed, epoch, db_idx, task.index), seed_ids) < share


def relabel(out: dict[str, np.ndarray], task: TaskData, draw: np.ndarray, seed: int, epoch: int, db_idx: int,
            seed_ids: np.ndarray) -> None:
    """Re-code, in place, the answers of the sequences `draw` marks (the module doc says how)."""
    st = int(task.target_stype)
    key = int(stream_key("relabel-code", seed, epoch, db_idx, task.index))
    for b in np.flatnonzero(draw):
        rng = np.random.default_rng([key, int(seed_ids[b]) & 0x7FFFFFFFFFFFFFFF])
        types, valid = out["semantic_types"][b], ~out["is_null"][b]
        if st == CAT:
            k, start = int(task.cat_count), int(task.cat_block_start)
            ids = out["categorical_embed_ids"][b]
            where = (types == CAT) & valid & (ids >= start) & (ids < start + k)
            if k > 1 and where.any():
                perm = rng.permutation(k).astype(ids.dtype)
                ids[where] = perm[ids[where] - start] + start
            continue
        where = (out["column_ids"][b] == task.target_col) & (types == st) & valid
        if st == BOOL:
            out["bool_values"][b, where] = ~out["bool_values"][b, where]
        else:
            a = np.float32(np.exp(rng.uniform(np.log(0.5), np.log(2.0))) * rng.choice([-1.0, 1.0]))
            shift = np.float32(rng.uniform(-1.0, 1.0))
            out["numeric_values"][b, where] = out["numeric_values"][b, where] * a + shift
