"""Timestamp targets: epoch microseconds, scored by MAE in days (headline) and hours and RMSE in days; the trivial
baselines are the train targets' mean and median times (and, where the task has observation times, the
`median_offset` of `evaluation.baselines`); LightGBM regresses the offset from the observation time with an L1
objective; `predict` writes the datetime, its calendar fields and the cyclic heads' own calendar estimates."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
from sklearn import metrics as skm

from confluence.preprocess.encode import MAX_EPOCH_US, MIN_EPOCH_US, TIMESTAMP_PERIODS, calendar_fields
from confluence.store.format import NO_CUTOFF
from confluence.stypes import US_PER_DAY, SemanticType
from confluence.targets.base import TargetKind
from confluence.targets.numerical import mean_and_median, standardized

US_PER_HOUR = 3_600e6


def timestamp_metrics(t_true_us: np.ndarray, t_pred_us: np.ndarray) -> dict[str, float]:
    """MAE in days (headline) and in hours, and RMSE in days, from epoch-microsecond values."""
    t = np.asarray(t_true_us, dtype=np.float64)
    f = np.asarray(t_pred_us, dtype=np.float64)
    if t.size == 0:
        return {"mae_days": math.nan, "mae_hours": math.nan, "rmse_days": math.nan, "n": 0.0}
    mae = float(skm.mean_absolute_error(t, f))
    return {
        "mae_days": mae / US_PER_DAY,
        "mae_hours": mae / US_PER_HOUR,
        "rmse_days": float(math.sqrt(skm.mean_squared_error(t, f))) / US_PER_DAY,
        "n": float(t.size),
    }


def cyclic_fields(ts15: np.ndarray) -> dict[str, np.ndarray]:
    """The cyclic heads' own calendar estimates (docs/design/architecture.md: pairs 2..5 are hour, weekday, day of month,
    month): `est_hour_of_day` 0-23, `est_weekday` 0-6 (Monday = 0), `est_day_of_month` 1-31, `est_month` 1-12."""
    def position(pair: int) -> np.ndarray:
        period = TIMESTAMP_PERIODS[pair]
        a = np.arctan2(ts15[:, 2 * pair], ts15[:, 2 * pair + 1]) % (2 * math.pi)
        return np.round(a / (2 * math.pi) * period).astype(np.int64)

    return {
        "est_hour_of_day": position(2) % 24,
        "est_weekday": position(3) % 7,
        "est_day_of_month": position(4) % 31 + 1,
        "est_month": position(5) % 12 + 1,
    }


def timestamp_fields(us: np.ndarray) -> dict[str, np.ndarray]:
    """Calendar fields of epoch-µs times (UTC), as reported beside a predicted timestamp: `pred_hour` 0-23,
    `pred_weekday` 0-6 (Monday = 0), `pred_day_of_month` 1-31, `pred_month` 1-12."""
    cal = calendar_fields(us)
    return {
        "pred_hour": np.asarray(cal["hour"], np.int64),
        "pred_weekday": np.asarray(cal["weekday"], np.int64),
        "pred_day_of_month": np.asarray(cal["day_of_month0"], np.int64) + 1,
        "pred_month": np.asarray(cal["month0"], np.int64) + 1,
    }


def as_time_column(us: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
    """Epoch µs as a timestamp column, rounded and kept within the years 1..9999."""
    us = np.clip(np.round(np.asarray(us, np.float64)), MIN_EPOCH_US, MAX_EPOCH_US).astype(np.int64)
    return pa.array(us, pa.timestamp("us"), mask=mask)


def has_cutoff(obs: np.ndarray) -> np.ndarray:
    """Which observation times are real cut-offs (not `NO_CUTOFF`, the whole database visible)."""
    return np.asarray(obs, dtype=np.int64) != NO_CUTOFF


def reference_times(obs: np.ndarray | None, n: int, fallback: float) -> np.ndarray:
    """The times a relative timestamp prediction is added to: each row's observation time, or `fallback` for a
    row without one (or rows built without them)."""
    if obs is None:
        return np.full(n, fallback)
    obs = np.asarray(obs, dtype=np.int64)
    return np.where(has_cutoff(obs), obs.astype(np.float64), fallback)


def median_offset(store: Any, task: str, train_ids: np.ndarray, train: Any) -> float | None:
    """The median of a timestamp task's train targets less their observation times (µs): the `median_offset`
    baseline's wait. None when the task has no `observation_time_column` (a cell task's cut-off is its row's own
    time, which may be the target itself: no baseline may read it) or a train row has no cut-off. `train`:
    `decode_targets` of `train_ids`."""
    info = store.task(task)
    if info.observation_time != "observation_time_column":
        return None
    obs = np.asarray(store.task_arrays(task).obs_time, dtype=np.int64)[train_ids][~train.is_null]
    if obs.size == 0 or (obs == NO_CUTOFF).any():
        return None
    return float(np.median(train.values[~train.is_null].astype(np.float64) - obs.astype(np.float64)))


def offset_prediction(store: Any, task: str, train_ids: np.ndarray, eval_ids: np.ndarray, train: Any,
                      evaluated: Any) -> np.ndarray | None:
    """The `median_offset` baseline of a timestamp task with an observation-time column, on the non-null
    evaluated rows (epoch µs): each row's observation time plus the median offset of the train targets from theirs
    ("the next match is about 30 days after today", `median_offset`), the constant a user tries first for a "when
    next" target. None where `median_offset` is, or an evaluated row has no cut-off. Without it the trivial
    baseline of such a task is one absolute date for every row, years off. `train` / `evaluated`:
    `decode_targets` of the two id sets."""
    offset = median_offset(store, task, train_ids, train)
    if offset is None:
        return None
    obs_ev = np.asarray(store.task_arrays(task).obs_time, dtype=np.int64)[eval_ids][~evaluated.is_null]
    if (obs_ev == NO_CUTOFF).any():
        return None
    return obs_ev.astype(np.float64) + offset


class Timestamp(TargetKind):
    stype = SemanticType.TIMESTAMP
    headline = ("mae_days", False)
    plot = "predicted_vs_actual_dates"
    storage = "ts"

    def recode(self, out: dict[str, np.ndarray], b: int, task: Any, rng: np.random.Generator) -> None:
        """Not re-coded (`recodes` False): a shifted time would contradict the row ages and the rows' own times."""

    def decode(self, store: Any, task: Any, raw: np.ndarray, n: int, ids: np.ndarray) -> np.ndarray:
        mean, std = store.timestamp_stats
        return np.asarray(raw[ids, 14], dtype=np.float64) * std + mean

    def model_predictions(self, store: Any, task: str, out: Any, keep: np.ndarray,
                          train_ids: np.ndarray | None) -> np.ndarray:
        mean, std = store.timestamp_stats
        return out.ts_pred[keep, 14].astype(np.float64) * std + mean

    def metrics(self, y: np.ndarray, pred: np.ndarray, target_std: float | None = None) -> dict[str, float]:
        return timestamp_metrics(y, pred)

    def per_row_scores(self, y: np.ndarray, pred: np.ndarray) -> np.ndarray:
        return np.abs(np.asarray(pred, np.float64) - np.asarray(y, np.float64)) / US_PER_DAY

    def explained(self, pred: np.ndarray, reference: np.ndarray) -> np.ndarray:
        return np.asarray(pred, np.float64) / US_PER_DAY  # days: an effect reads "+3.2 days"

    def explained_quantity(self, store: Any, task: Any, reference: np.ndarray) -> list[str]:
        return [f"{task.name} (days)"] * len(reference)

    def value_text(self, store: Any, task: Any, value: Any) -> str:
        return str(np.datetime64(int(value), "us").astype("datetime64[s]"))

    def trivial_predictions(self, train: np.ndarray, n: int, num_classes: int | None) -> dict[str, np.ndarray]:
        return mean_and_median(train, n)

    def row_baselines(self, store: Any, task: str, train_ids: np.ndarray, eval_ids: np.ndarray, train: Any,
                      evaluated: Any) -> dict[str, np.ndarray]:
        offset = offset_prediction(store, task, train_ids, eval_ids, train, evaluated)
        return {} if offset is None else {"median_offset": offset}

    def gbdt_target(self, values: np.ndarray, obs: np.ndarray | None, num_classes: int
                    ) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        # a time is regressed as its offset from the observation time, as the model points at a context time plus
        # an offset: trees cannot predict beyond the times they were trained on, and the test split's times are
        # all later than the train split's (an absolute time regressed on 2013-2016 cannot say 2019)
        target = np.asarray(values, np.float64)
        relative, fallback = False, 0.0
        if obs is not None and target.size and has_cutoff(obs).all():
            relative, fallback = True, float(np.median(np.asarray(obs, np.float64)))
            target = target - np.asarray(obs, np.float64)
        target, scale = standardized(target)
        return target, {"objective": "regression_l1"}, {"scale": scale, "relative": relative,
                                                         "fallback_obs": fallback}

    def gbdt_output(self, raw: np.ndarray, n: int, num_classes: int, fit: dict[str, Any],
                    obs: np.ndarray | None) -> np.ndarray:
        mean, std = fit["scale"]
        value = raw * std + mean
        return value + reference_times(obs, n, fit["fallback_obs"]) if fit.get("relative") else value

    def output_columns(self, store: Any, task: Any, out: Any, p_null: np.ndarray, is_null: np.ndarray,
                       train_ids: np.ndarray | None, top_k: int) -> dict[str, pa.Array]:
        mean, std = store.timestamp_stats
        us = np.round(out.ts_pred[:, 14].astype(np.float64) * std + mean)
        us = np.clip(np.clip(us, MIN_EPOCH_US, MAX_EPOCH_US).astype(np.int64), MIN_EPOCH_US, MAX_EPOCH_US)  # 1..9999
        cols: dict[str, pa.Array] = {"prediction": pa.array(us, pa.timestamp("us"), mask=is_null)}
        for name, v in {**timestamp_fields(us), **cyclic_fields(out.ts_pred)}.items():
            cols[name] = pa.array(v, pa.int64(), mask=is_null)
        return cols

    def blend_columns(self, store: Any, task: Any, gbdt: np.ndarray, blended: np.ndarray, p_null: np.ndarray,
                      is_null: np.ndarray) -> dict[str, pa.Array]:
        return {"gbdt_prediction": as_time_column(gbdt), "blend_prediction": as_time_column(blended, is_null)}
