"""What every target kind answers: the interface the rest of the package asks instead of branching on a target's
semantic type.

A kind owns everything a target of its type needs beside the cell encoding: which of the sampler's target arrays
holds its stored values (and what an unknown target holds there), how a training context re-codes its answers,
decoding the stored targets into the user's units, turning the heads' outputs into predictions, its metrics (and
which one is the headline), its trivial baselines, blending two predictors, LightGBM's objective and how its raw
output is read back, the columns `predict` writes, RelBench's metrics and the plot the report draws. Cells, the
target's own cell among them, are encoded into batches by semantic type in the preprocessing, the sampler's kernels
and the model's input encoders: that is the input side, which every column has, target or not.

Predictions travel between these methods in one form per kind ("the units of the metrics"): P(true) (boolean),
[n, K] class probabilities (categorical), values (numerical), epoch microseconds (timestamp).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from confluence.stypes import D_TIME, SemanticType

# a task's target arrays as the sampler's kernels read them, by name: (dtype, shape of the one-element filler that a
# kind which does not store its values there gets)
TARGET_ARRAYS: dict[str, tuple[type, tuple[int, ...]]] = {
    "f32": (np.float32, (1,)), "ts": (np.float32, (1, D_TIME)), "u32": (np.uint32, (1,)), "bits": (np.uint8, (1,)),
}


def safe(fn: Any, *args: Any, **kwargs: Any) -> float:
    """`fn(*args)` as a float, NaN where the metric is undefined on these rows (scikit-learn's ValueError): a small
    split still reports everything else."""
    try:
        return float(fn(*args, **kwargs))
    except ValueError:
        return math.nan


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in float64 (probabilities from logits)."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def log_odds(p: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """log(p / (1 - p)) in float64, p kept within [eps, 1 - eps] (a probability's changes near 0 or 1 read as
    changes of evidence, not as vanishing differences)."""
    q = np.clip(np.asarray(p, dtype=np.float64), eps, 1.0 - eps)
    return np.log(q) - np.log1p(-q)


def softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (class probabilities from [n, K] logits; K = 0 stays empty)."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] == 0:
        return x
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class TargetKind(ABC):
    """One kind of target. Subclasses set the class attributes and implement the methods; `confluence.targets.kind`
    finds the kind of a semantic type."""

    stype: ClassVar[SemanticType]
    headline: ClassVar[tuple[str, bool]]  # (metric name, higher is better)
    # the report's plot: "predicted_vs_actual" (its dates variant "predicted_vs_actual_dates"), "calibration" or
    # "confusion"
    plot: ClassVar[str]
    relbench_type: ClassVar[str | None] = None  # RelBench's task type, None when RelBench has none for this kind
    has_classes: ClassVar[bool] = False  # predictions are [n, K] class probabilities
    classifies: ClassVar[bool] = False  # the target is a class (boolean or categorical), not a quantity
    # which of a task's four target arrays (`TARGET_ARRAYS`: what the sampler's kernels read) holds its stored
    # values; the others hold a one-element filler
    storage: ClassVar[str]

    @property
    def label(self) -> str:
        return self.stype.label

    # -- stored targets -> the sampler's target arrays
    def target_arrays(self, values: np.ndarray) -> dict[str, np.ndarray]:
        """A task's four target arrays (`TARGET_ARRAYS`) with its stored `values` in this kind's one."""
        out = {name: np.zeros(shape, dtype) for name, (dtype, shape) in TARGET_ARRAYS.items()}
        out[self.storage] = np.asarray(values)
        return out

    def unknown_targets(self, n: int, cat_block_start: int) -> dict[str, np.ndarray]:
        """The target arrays of `n` anchors whose targets are not known (NULL; an ad-hoc anchor task): zeros of the
        stored layout (a categorical's ids at its block's first class, a valid id)."""
        dtype, shape = TARGET_ARRAYS[self.storage]
        packed = self.storage == "bits"
        values = np.zeros(((n + 7) // 8 if packed else n,) + shape[1:], dtype)
        return self.target_arrays(values)

    @abstractmethod
    def recode(self, out: dict[str, np.ndarray], b: int, task: Any, rng: np.random.Generator) -> None:
        """Re-code, in place, the answers of sequence `b` of a batch's cell tensors `out` the same way in every
        cell of the task's own column (`confluence.sampler.relabel`; asked only where `recodes`)."""

    recodes: ClassVar[bool] = False

    # -- stored targets -> the user's units
    @abstractmethod
    def decode(self, store: Any, task: Any, raw: np.ndarray, n: int, ids: np.ndarray) -> np.ndarray:
        """The stored targets `raw` of a task's `n` seeds, at `ids`, in the units of the metrics."""

    def num_classes(self, store: Any, task: Any) -> int:
        """K of a categorical target; 0 otherwise."""
        return 0

    # -- heads -> predictions
    @abstractmethod
    def model_predictions(self, store: Any, task: str, out: Any, keep: np.ndarray,
                          train_ids: np.ndarray | None) -> np.ndarray:
        """The heads' outputs `out` (`inference.HeadOutputs`) on rows `keep`, in the units of the metrics;
        `train_ids`: the train seeds whose targets bound a number (None: not bounded)."""

    def empty_predictions(self, num_classes: int) -> np.ndarray:
        """Predictions of no rows, shaped as this kind's."""
        return np.zeros(0)

    # -- metrics
    @abstractmethod
    def metrics(self, y: np.ndarray, pred: np.ndarray, target_std: float | None = None) -> dict[str, float]:
        """Every metric of one predictor on the non-null targets `y` (a flat `{metric: float}`, NaN where a metric
        is undefined on these rows, plus `n`)."""

    def per_row_scores(self, y: np.ndarray, pred: np.ndarray) -> np.ndarray | None:
        """Per-row terms whose mean is the headline metric; None when it does not decompose (AUROC)."""
        return None

    def target_std(self, train_values: np.ndarray) -> float | None:
        """The scale that normalizes the headline error (numerical targets: the train targets' std), or None."""
        return None

    # -- baselines and blends
    @abstractmethod
    def trivial_predictions(self, train: np.ndarray, n: int, num_classes: int | None) -> dict[str, np.ndarray]:
        """The constant predictors fitted on the train targets, for `n` rows, by name."""

    def row_baselines(self, store: Any, task: str, train_ids: np.ndarray, eval_ids: np.ndarray, train: Any,
                      evaluated: Any) -> dict[str, np.ndarray]:
        """Baselines that read each evaluated row (not constants), on its non-null rows, by name: a timestamp
        task's `median_offset`. `train` / `evaluated`: `decode_targets` of the two id sets."""
        return {}

    def blend(self, model: np.ndarray, gbdt: np.ndarray, weight: float, target_range: Any = None) -> np.ndarray:
        """`weight * model + (1 - weight) * gbdt` row by row (`target_range` bounds a number as `predict` does)."""
        return weight * np.asarray(model, np.float64) + (1.0 - weight) * np.asarray(gbdt, np.float64)

    # -- LightGBM
    @abstractmethod
    def gbdt_target(self, values: np.ndarray, obs: np.ndarray | None, num_classes: int
                    ) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        """The label LightGBM fits, its objective parameters, and what `gbdt_output` needs to read its raw output
        back (a scale, a reference time); `obs`: the rows' observation times (None when not built)."""

    def gbdt_output(self, raw: np.ndarray, n: int, num_classes: int, fit: dict[str, Any],
                    obs: np.ndarray | None) -> np.ndarray:
        """LightGBM's raw output of `n` rows in the units of the metrics."""
        return raw

    # -- what users receive
    @abstractmethod
    def output_columns(self, store: Any, task: Any, out: Any, p_null: np.ndarray, is_null: np.ndarray,
                       train_ids: np.ndarray | None, top_k: int) -> dict[str, pa.Array]:
        """`predict`'s columns for this kind (`prediction` first), before `p_null`."""

    @abstractmethod
    def blend_columns(self, store: Any, task: Any, gbdt: np.ndarray, blended: np.ndarray, p_null: np.ndarray,
                      is_null: np.ndarray) -> dict[str, pa.Array]:
        """`predict --blend gbdt`'s extra columns: LightGBM's and the blend's prediction (and their probability)."""

    # -- explanations
    def explained(self, pred: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """The one number per row whose changes an explanation reports (`inference.explain`), from predictions in
        the units of the metrics; `reference`: the unoccluded predictions of the same rows. Numbers as they are;
        a class as the log-odds of the class predicted in `reference` (true for a boolean)."""
        return np.asarray(pred, np.float64)

    def explained_quantity(self, store: Any, task: Any, reference: np.ndarray) -> list[str]:
        """What `explained` is, per row, in words (e.g. "log-odds of true", "log-odds of 'K1'", "dep_delay")."""
        return [self.label] * len(reference)

    def point(self, pred: np.ndarray) -> np.ndarray:
        """The answer itself of predictions in the units of the metrics (a class, true / false, the value), in the
        units `value_text` reads."""
        return np.asarray(pred)

    def value_text(self, store: Any, task: Any, value: Any) -> str:
        """One target (in the units of the metrics) as a user reads it: a number, true / false, a class's name, an
        ISO time."""
        return f"{float(value):.6g}"

    def relbench_metrics(self, y: np.ndarray, pred: np.ndarray, train_std: float | None) -> dict[str, float]:
        """RelBench's metrics of one predictor (its names and definitions)."""
        raise ValueError(f"RelBench has no task type for {self.label} targets")
