"""A blend of the model and LightGBM, one weight per task chosen on the validation split (`--blend gbdt`).

For one task, given the model's and LightGBM's predictions on labelled validation rows (in the units of
`evaluate.model_point_predictions`: numbers as values, booleans as P(true), categories as [n, K] probabilities,
timestamps as epoch µs) and the truth, `fit_blend` scores every weight w of `GRID` (0, 0.05, ..., 1; w is the
model's share) by the task's headline metric (`metrics.HEADLINE`) of `w * model + (1 - w) * LightGBM`, and keeps
the best (`BlendFit.best_weight`). Exact ties (common for accuracy) go to w = 1 (the model alone), then w = 0
(LightGBM alone), then the middle of the tied weights: a blend is the best only when it scores strictly better
than both on validation, and where the data cannot tell weights apart the middle one is the farthest from where
the score drops. `blend_predictions` applies a weight to any rows (the evaluated split, `predict`'s rows); at
w = 0 it returns LightGBM's predictions exactly as LightGBM gives them (numbers not rounded or clipped).

The guard. The blend departs from LightGBM only where validation shows that the departure helps: when the best
weight is above 0, the paired bootstrap (`metrics.paired_bootstrap`, `GUARD_N_BOOT` resamples, a fixed seed,
95 %) of the blend at that weight against LightGBM on the same validation rows gives the gain and its interval
(`val_gain`, `val_ci`: oriented so that positive = better than LightGBM). Unless the whole interval is above zero
the shipped weight (`weight`) is 0, LightGBM alone, and `note` says why, with the interval (`guard` "failed");
else the best weight is shipped (`guard` "passed"). A user switching from LightGBM so gets at least LightGBM: a
gain the validation rows cannot tell from noise is not worth departing for (on a held-out database, a validation
weight of 0.05 with a gain inside the noise lost 0.004 AUROC to LightGBM on the test split, interval below zero:
docs/design/decisions.md). `fit_blend(..., guard=False)` ships the best weight whatever its interval (`guard`
"off"), the behaviour without the guard, kept to measure the guard against.

The guard's fallback is only as good as LightGBM: where LightGBM is not itself shown better than the trivial
baselines on validation (given their predictions, `trivial=`: its paired interval against the best of them not
wholly above zero), falling back to it promises nothing, and the guard is waived (`guard` "waived"): the best
weight is shipped, and `note` says why (on a held-out database LightGBM was below chance on a boolean, 0.490 AUROC
on validation and 0.378 on test, while the model, the validation's best, had 0.508: docs/design/decisions.md).

What to ship (`BlendFit.ship`) follows from the shipped weight, so from validation only, never from the evaluated
rows: "blend" when 0 < w < 1 (it beat both on validation, and LightGBM beyond the noise), else "model" (w = 1)
or "LightGBM" (w = 0).

The floor. Given the trivial baselines (`trivial=`), the choice above must itself be shown better than the best of
them on validation (the same paired interval, wholly above zero: `trivial_gain`, `trivial_ci`); else `ship` is
"trivial" (`trivial_name` says which baseline: a constant, or a "when next" task's observation time plus the median
wait), and `note` says why. Where neither the model nor LightGBM is known to beat a constant, a constant is what to
use: on a held-out database a boolean whose model and LightGBM were both below chance on test (0.458 and 0.378
AUROC) had been at 0.508 and 0.490 on validation, inside the noise of the majority's 0.5
(docs/design/decisions.md). `fit_blend(..., floor=False)` skips it (the behaviour before it).

Without labelled validation rows (or a headline metric undefined on them, such as AUROC with one class), the
weight is `DEFAULT_WEIGHT` (0.5, the equal average: not chosen on data, and the fit says so in `note`), and
`ship` is "blend", the choice that is never the worse of the two by much when neither is known to be better; there
is no interval to guard with. Everything here is deterministic: the guard's bootstrap has a fixed seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from confluence.evaluation import metrics as M
from confluence.stypes import SemanticType
from confluence.targets import TargetRange, kind

GRID: tuple[float, ...] = tuple(round(i * 0.05, 2) for i in range(21))  # the model's share, 0 .. 1
DEFAULT_WEIGHT = 0.5  # without labelled validation rows
GUARD_N_BOOT = 1000  # the guard's paired bootstrap: resamples of the validation rows ...
GUARD_SEED = 0  # ... drawn with a fixed seed ...
GUARD_LEVEL = 0.95  # ... for a 95 % interval
GUARD_STATES = ("passed", "failed", "waived", "off")  # `BlendFit.guard`; None where there was nothing to guard
SHIP_CHOICES = ("model", "LightGBM", "blend", "trivial")
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
    """The weight chosen for one task and how: `weight` (the model's share that is shipped), `n_val` (labelled
    validation rows it was chosen on), `metric` (the headline metric), `scores` (that metric on validation of
    "model", "LightGBM" and "blend", the blend at `best_weight`), `source` ("validation" or "default"), `ship` (one
    of `SHIP_CHOICES`), `note` (when the weight is the default, or the guard set it to 0).

    The guard (module docstring): `best_weight` (the best on validation, before the guard; None for the default),
    `val_gain` and `val_ci` (the blend at `best_weight` minus LightGBM on validation, with its paired 95 %
    interval, oriented so that positive = better than LightGBM; None when `best_weight` is 0 or there is no fit
    on data), `guard` (one of `GUARD_STATES`: "failed" when it set the weight to 0, "waived" when LightGBM was not
    shown better than the trivial baselines; None when there was nothing to guard).

    The floor (module docstring): `trivial_name` (the best trivial baseline on validation; its score is
    `scores["trivial"]`), `trivial_gain` and `trivial_ci` (the guarded choice minus it, positive = better; None
    without baselines)."""

    weight: float
    n_val: int
    metric: str
    scores: dict[str, float] = field(default_factory=dict)
    source: str = "validation"
    ship: str = "blend"
    note: str | None = None
    best_weight: float | None = None
    val_gain: float | None = None
    val_ci: tuple[float, float] | None = None
    guard: str | None = None
    trivial_name: str | None = None
    trivial_gain: float | None = None
    trivial_ci: tuple[float, float] | None = None

    def summary(self) -> dict[str, Any]:
        """As JSON for a task's results (`"validation"`): the metric, the validation scores, the weight shipped,
        the best one, the guard's and the floor's gains and intervals (where there were), where the weight came
        from and what to ship."""
        out: dict[str, Any] = {"metric": self.metric, **self.scores, "weight": self.weight}
        if self.best_weight is not None:
            out["best_weight"] = self.best_weight
        if self.val_gain is not None and self.val_ci is not None:
            out["val_gain"], out["val_ci"] = self.val_gain, list(self.val_ci)
        if self.guard is not None:
            out["guard"] = self.guard
        if self.trivial_name is not None:
            out["trivial_name"] = self.trivial_name
        if self.trivial_gain is not None and self.trivial_ci is not None:
            out["trivial_gain"], out["trivial_ci"] = self.trivial_gain, list(self.trivial_ci)
        out |= {"n_val": self.n_val, "weight_source": self.source, "ship": self.ship}
        if self.note:
            out["note"] = self.note
        return out


def guard_words(summary: Mapping[str, Any]) -> str:
    """The guard of a `BlendFit.summary()` in a few words, for the console, the report and the server's log: the
    best blend's gain over LightGBM on validation with its 95 % interval (positive = better) and the outcome,
    e.g. "gain over LightGBM +0.52 [+0.25, +0.8], guard passed"; "" where there was nothing to guard (the best
    weight 0, the default weight, or results written before the guard)."""
    guard, ci = summary.get("guard"), summary.get("val_ci")
    if guard is None or not ci or len(ci) != 2:
        return ""

    num = fmt_signed
    outcome = {"passed": "guard passed", "failed": "guard failed: LightGBM shipped", "off": "guard off",
               "waived": "guard waived: LightGBM not shown better than trivial"}
    return (f"gain over LightGBM {num(summary.get('val_gain'))} [{num(ci[0])}, {num(ci[1])}], "
            f"{outcome.get(guard, f'guard {guard}')}")


def choice_words(summary: Mapping[str, Any], fmt: Any) -> str:
    """What follows a ship line's validation scores of the model, LightGBM and the blend (`BlendFit.summary()`),
    for the console and the report: " at w = B" when the best weight on validation is not the one shipped, the
    best trivial baseline's score (", trivial (NAME) S"), then "; " and the guard (`guard_words`) unless it failed
    (the note says so then), and the floor's gain over that baseline unless it shipped the baseline (the note
    says so then). `fmt` writes a number."""
    best = summary.get("best_weight")
    at = f" at w = {fmt(best)}" if best is not None and best != summary.get("weight") else ""
    if summary.get("trivial_name") is not None:
        at += f", trivial ({summary['trivial_name']}) {fmt(summary.get('trivial'))}"
    words = [guard_words(summary)] if summary.get("guard") != "failed" else []
    ci = summary.get("trivial_ci")
    if ci and len(ci) == 2 and summary.get("ship") != "trivial":
        words.append(f"gain over trivial {fmt_signed(summary.get('trivial_gain'))} [{fmt_signed(ci[0])}, "
                     f"{fmt_signed(ci[1])}]")
    return at + "".join(f"; {w}" for w in words if w)


def fmt_signed(x: Any) -> str:
    """A gain as the ship lines write it: signed, three significant digits; "–" for None or NaN."""
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3g}"


def blend_predictions(stype: SemanticType, model: np.ndarray, gbdt: np.ndarray, weight: float,
                      target_range: TargetRange | None = None) -> np.ndarray:
    """`weight * model + (1 - weight) * gbdt`, row by row, in the units of `model_point_predictions`.

    Categorical probabilities of different widths are widened with zeros to the wider. `target_range` (numerical
    targets) rounds and clips the blended number as `predict` does the model's (`targets.TargetRange`), so the
    blend scored is the blend a user receives; at `weight` 0 the blend is LightGBM's predictions exactly (not
    rounded or clipped: LightGBM alone is what a user of LightGBM has)."""
    weight = float(weight)
    return kind(stype).blend(model, gbdt, weight, target_range if weight > 0.0 else None)


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
    """What to ship for a weight shipped by `fit_blend`: the model alone at 1, LightGBM alone at 0, else the
    blend (which then scored strictly better than both on validation)."""
    return "model" if weight >= 1.0 else "LightGBM" if weight <= 0.0 else "blend"


def validation_gain(stype: SemanticType, truth: np.ndarray, model: np.ndarray, gbdt: np.ndarray, weight: float,
                    target_range: TargetRange | None = None) -> tuple[float, tuple[float, float]]:
    """The blend at `weight` minus LightGBM on these rows by the headline metric, with its paired bootstrap
    interval (`GUARD_N_BOOT` resamples, `GUARD_SEED`, `GUARD_LEVEL`), oriented so that positive = the blend is
    better (an error's difference is negated). NaN where the metric or the interval is undefined."""
    _, higher = M.headline_metric(stype)
    blended = blend_predictions(stype, model, gbdt, weight, target_range)
    c = M.paired_bootstrap(stype, truth, blended, gbdt, n_boot=GUARD_N_BOOT, seed=GUARD_SEED, level=GUARD_LEVEL)
    gain, lo, hi = M.oriented_gain(c, higher) or (math.nan, math.nan, math.nan)
    return gain, (lo, hi)


def over_trivial(stype: SemanticType, truth: np.ndarray, pred: np.ndarray,
                 trivial: Mapping[str, np.ndarray]) -> tuple[str, float, float, tuple[float, float]] | None:
    """`pred` minus the best of the `trivial` baselines' predictions on these rows (the best by the headline
    metric), with its paired bootstrap interval as `validation_gain` gives it: (the baseline's name, its score,
    gain, (lo, hi)), positive = `pred` better; None without baselines or where the metric or the interval is
    undefined."""
    metric, higher = M.headline_metric(stype)
    best: tuple[str, float] | None = None
    for name, base in trivial.items():
        v = M.metrics_for(stype, truth, base).get(metric, math.nan)
        v = v if higher else -v
        if not math.isnan(v) and (best is None or v > best[1]):
            best = (name, v)
    if best is None:
        return None
    c = M.paired_bootstrap(stype, truth, pred, trivial[best[0]], n_boot=GUARD_N_BOOT, seed=GUARD_SEED,
                           level=GUARD_LEVEL)
    oriented = M.oriented_gain(c, higher)
    if oriented is None or not all(math.isfinite(x) for x in oriented):
        return None
    gain, lo, hi = oriented
    return best[0], best[1] if higher else -best[1], gain, (lo, hi)


def fit_blend(stype: SemanticType, truth: np.ndarray, model: np.ndarray, gbdt: np.ndarray,
              target_range: TargetRange | None = None, grid: tuple[float, ...] = GRID, *,
              guard: bool = True, trivial: Mapping[str, np.ndarray] | None = None, floor: bool = True) -> BlendFit:
    """Choose the weight of one task on its labelled validation rows (`truth`, and both predictors' predictions on
    them), guard it and say what to ship (module docstring). `guard=False`: the best weight is shipped whatever
    its interval against LightGBM (the interval is still reported) and nothing is compared with the trivial
    baselines. `trivial`: the trivial baselines' predictions on the same rows, by name (`trivial.TrivialFit`):
    where LightGBM is not shown better than them, the guard is waived; with `floor`, what is not shown better
    than them is not shipped: the best of them is."""
    stype = SemanticType(stype)
    metric, higher = M.headline_metric(stype)
    truth = np.asarray(truth)
    n = int(truth.shape[0])
    scores = weight_scores(stype, truth, model, gbdt, target_range, grid) if n else np.full(len(grid), math.nan)
    best = choose_weight(scores, grid)
    if best is None:
        why = "no labelled validation rows" if n == 0 else f"{metric} is undefined on the {n} validation rows"
        return BlendFit(weight=DEFAULT_WEIGHT, n_val=n, metric=metric, source="default", ship="blend",
                        scores={"model": math.nan, "LightGBM": math.nan, "blend": math.nan},
                        note=f"{why}: the weight is the equal average ({DEFAULT_WEIGHT}), not chosen on data")
    sign = 1.0 if higher else -1.0
    at = dict(zip(grid, scores, strict=True))
    val = {"model": sign * at.get(1.0, math.nan), "LightGBM": sign * at.get(0.0, math.nan),
           "blend": sign * at[best]}
    fit = BlendFit(weight=best, n_val=n, metric=metric, scores={k: float(v) for k, v in val.items()},
                   ship=ship_for(best), best_weight=best)
    if not guard:
        if best > 0.0:
            gain, ci = validation_gain(stype, truth, model, gbdt, best, target_range)
            fit = replace(fit, val_gain=gain, val_ci=ci, guard="off")
        return fit
    fit = _guarded(fit, stype, truth, model, gbdt, target_range, trivial)
    return _floored(fit, stype, truth, model, gbdt, target_range, trivial) if floor and trivial else fit


def _guarded(fit: BlendFit, stype: SemanticType, truth: np.ndarray, model: np.ndarray, gbdt: np.ndarray,
             target_range: TargetRange | None, trivial: Mapping[str, np.ndarray] | None) -> BlendFit:
    """The guard (module docstring): the best weight shipped only where validation shows it better than
    LightGBM, or LightGBM is not shown better than the trivial baselines."""
    best, n, metric = fit.weight, fit.n_val, fit.metric
    if best <= 0.0:
        return fit  # LightGBM alone already: nothing to guard
    gain, (lo, hi) = validation_gain(stype, truth, model, gbdt, best, target_range)
    fit = replace(fit, val_gain=gain, val_ci=(lo, hi))
    if lo > 0.0:  # the whole interval says better than LightGBM (NaN: not shown)
        return replace(fit, guard="passed")
    who = "the model alone (w = 1)" if best >= 1.0 else f"the blend at w = {best:g}"
    over = over_trivial(stype, truth, gbdt, trivial) if trivial else None
    if over is not None and not over[3][0] > 0.0:
        name, _, g, (glo, ghi) = over
        return replace(fit, guard="waived", note=(
            f"validation's best, {who}, is not shown better than LightGBM, but LightGBM is not shown better than the "
            f"trivial baseline ({name}) either: {g:+.3g} {metric} on {n:,} rows, 95% interval [{glo:+.3g}, "
            f"{ghi:+.3g}] (positive = better); the guard is waived"))
    return replace(fit, weight=0.0, ship=ship_for(0.0), guard="failed", note=(
        f"validation's best, {who}, gained {gain:+.3g} {metric} over LightGBM on {n:,} rows, 95% interval "
        f"[{lo:+.3g}, {hi:+.3g}] (positive = better): not shown better than LightGBM, so LightGBM alone is "
        f"shipped (w = 0)"))


def _floored(fit: BlendFit, stype: SemanticType, truth: np.ndarray, model: np.ndarray, gbdt: np.ndarray,
             target_range: TargetRange | None, trivial: Mapping[str, np.ndarray]) -> BlendFit:
    """The floor (module docstring): the guarded choice shipped only where validation shows it better than the
    best trivial baseline; else that baseline, `ship` "trivial"."""
    chosen = blend_predictions(stype, model, gbdt, fit.weight, target_range)
    over = over_trivial(stype, truth, chosen, trivial)
    if over is None:
        return fit
    name, score, gain, (lo, hi) = over
    fit = replace(fit, scores={**fit.scores, "trivial": float(score)}, trivial_name=name, trivial_gain=gain,
                  trivial_ci=(lo, hi))
    if lo > 0.0:
        return fit
    what = {"model": "the model", "LightGBM": "LightGBM", "blend": f"the blend at w = {fit.weight:g}"}[fit.ship]
    why = (f"{what} gained {gain:+.3g} {fit.metric} over the trivial baseline ({name}) on {fit.n_val:,} validation "
           f"rows, 95% interval [{lo:+.3g}, {hi:+.3g}] (positive = better): not shown better than it, so the "
           "trivial baseline is shipped")
    return replace(fit, ship="trivial", note=why)  # a waived guard's note: in the ship line's guard words
