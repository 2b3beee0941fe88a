"""A blend of the model and LightGBM, one weight per task chosen on the validation split (`--blend gbdt`).

For one task, given the model's and LightGBM's predictions on labelled validation rows (in the units of
`evaluate.model_point_predictions`: numbers as values, booleans as P(true), categories as [n, K] probabilities,
timestamps as epoch µs) and the truth, `fit_blend` scores every weight w of `GRID` (0, 0.05, ..., 1; w is the
model's share) by the task's headline metric (`metrics.HEADLINE`) of `w * model + (1 - w) * LightGBM`, and keeps
the best. Exact ties (common for accuracy) go to w = 1 (the model alone), then w = 0 (LightGBM alone), then the
middle of the tied weights: a blend is kept only when it scores strictly better than both on validation, and where
the data cannot tell weights apart the middle one is the farthest from where the score drops. `blend_predictions`
applies the weight to any rows (the evaluated split, `predict`'s rows).

What to ship (`BlendFit.ship`) follows from the weight, so from validation only, never from the evaluated rows:
"blend" when the blend beats both on validation (0 < w < 1), else "model" (w = 1) or "LightGBM" (w = 0).

Without labelled validation rows (or a headline metric undefined on them, such as AUROC with one class), the
weight is `DEFAULT_WEIGHT` (0.5, the equal average: not chosen on data, and the fit says so in `note`), and
`ship` is "blend", the choice that is never the worse of the two by much when neither is known to be better.
Everything here is deterministic: no sampling, no randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from confluence.evaluation import metrics as M
from confluence.stypes import SemanticType
from confluence.targets import TargetRange, kind

GRID: tuple[float, ...] = tuple(round(i * 0.05, 2) for i in range(21))  # the model's share, 0 .. 1
DEFAULT_WEIGHT = 0.5  # without labelled validation rows
SHIP_CHOICES = ("model", "LightGBM", "blend")
BLEND_CHOICES = ("gbdt",)  # what `--blend` accepts: the one partner the model is blended with


def check_blend(blend: str | None) -> str | None:
    """`blend` when it is None or one of `BLEND_CHOICES`; a ConfluenceError naming the choices otherwise."""
    from confluence.errors import ConfluenceError

    if blend is not None and blend not in BLEND_CHOICES:
        raise ConfluenceError(f"--blend {blend!r}: the model can be blended with {', '.join(BLEND_CHOICES)} "
                              "(LightGBM) only")
    return blend


@dataclass(frozen=True)
class BlendFit:
    """The weight chosen for one task and how: `weight` (the model's share), `n_val` (labelled validation rows it
    was chosen on), `metric` (the headline metric), `scores` (that metric on validation of "model", "LightGBM"
    and "blend"), `source` ("validation" or "default"), `ship` (one of `SHIP_CHOICES`), `note` (when the weight
    is the default)."""

    weight: float
    n_val: int
    metric: str
    scores: dict[str, float] = field(default_factory=dict)
    source: str = "validation"
    ship: str = "blend"
    note: str | None = None

    def summary(self) -> dict[str, Any]:
        """As JSON for a task's results (`"validation"`): the metric, the three validation scores, the weight and
        where it came from."""
        out: dict[str, Any] = {"metric": self.metric, **self.scores, "weight": self.weight, "n_val": self.n_val,
                               "weight_source": self.source}
        if self.note:
            out["note"] = self.note
        return out


def blend_predictions(stype: SemanticType, model: np.ndarray, gbdt: np.ndarray, weight: float,
                      target_range: TargetRange | None = None) -> np.ndarray:
    """`weight * model + (1 - weight) * gbdt`, row by row, in the units of `model_point_predictions`.

    Categorical probabilities of different widths are widened with zeros to the wider. `target_range` (numerical
    targets) rounds and clips the blended number as `predict` does the model's (`targets.TargetRange`), so the
    blend scored is the blend a user receives."""
    return kind(stype).blend(model, gbdt, float(weight), target_range)


def weight_scores(stype: SemanticType, truth: np.ndarray, model: np.ndarray, gbdt: np.ndarray,
                  target_range: TargetRange | None = None, grid: tuple[float, ...] = GRID) -> np.ndarray:
    """The headline metric of the blend at each weight of `grid`, oriented so that higher is better (an error is
    negated); NaN where the metric is undefined on these rows."""
    _, higher = M.headline_metric(stype)
    scores = np.array([M.headline_value(stype, truth, blend_predictions(stype, model, gbdt, w, target_range))
                       for w in grid], dtype=np.float64)
    return scores if higher else -scores


def choose_weight(scores: np.ndarray, grid: tuple[float, ...] = GRID) -> float | None:
    """The weight of the best score (higher is better), ties to 1, then 0, then the middle of the tied weights
    (the lower middle of an even count); None when every score is NaN. Scores within 1e-12 (relative) of the
    best count as tied: floating-point noise must not decide."""
    s = np.asarray(scores, dtype=np.float64)
    if not np.isfinite(s).any():
        return None
    best = float(np.nanmax(s))
    tied = [w for w, v in zip(grid, s, strict=True) if math.isfinite(v) and v >= best - 1e-12 * max(1.0, abs(best))]
    if 1.0 in tied:
        return 1.0
    if 0.0 in tied:
        return 0.0
    return float(tied[(len(tied) - 1) // 2])


def ship_for(weight: float) -> str:
    """What to ship for a weight chosen by `choose_weight`: the model alone at 1, LightGBM alone at 0, else the
    blend (which then scored strictly better than both on validation)."""
    return "model" if weight >= 1.0 else "LightGBM" if weight <= 0.0 else "blend"


def fit_blend(stype: SemanticType, truth: np.ndarray, model: np.ndarray, gbdt: np.ndarray,
              target_range: TargetRange | None = None, grid: tuple[float, ...] = GRID) -> BlendFit:
    """Choose the weight of one task on its labelled validation rows (`truth`, and both predictors' predictions on
    them) and say what to ship (module docstring)."""
    stype = SemanticType(stype)
    metric, higher = M.headline_metric(stype)
    truth = np.asarray(truth)
    n = int(truth.shape[0])
    scores = weight_scores(stype, truth, model, gbdt, target_range, grid) if n else np.full(len(grid), math.nan)
    weight = choose_weight(scores, grid)
    if weight is None:
        why = "no labelled validation rows" if n == 0 else f"{metric} is undefined on the {n} validation rows"
        return BlendFit(weight=DEFAULT_WEIGHT, n_val=n, metric=metric, source="default", ship="blend",
                        scores={"model": math.nan, "LightGBM": math.nan, "blend": math.nan},
                        note=f"{why}: the weight is the equal average ({DEFAULT_WEIGHT}), not chosen on data")
    sign = 1.0 if higher else -1.0
    at = dict(zip(grid, scores, strict=True))
    val = {"model": sign * at.get(1.0, math.nan), "LightGBM": sign * at.get(0.0, math.nan),
           "blend": sign * at[weight]}
    return BlendFit(weight=weight, n_val=n, metric=metric, scores={k: float(v) for k, v in val.items()},
                    ship=ship_for(weight))
