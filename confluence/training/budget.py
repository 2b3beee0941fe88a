"""How long a run trains when the user does not say: the run length as a number of steps, `"auto"` (from the
databases: their tasks and training rows) or a duration (`"10m"`, `"1h30m"`: the steps that fit, measured on this
machine), and early stopping on the validation losses with the best checkpoint kept.

Why: a fixed 3,000-step default was tuned on one database; real databases differ in how much they have to learn
(the development suite's validation losses were still falling at 3,000 steps), and a user with a GPU and a user
with two CPU cores need different step counts for the same wall-clock patience. Stopping when validation stops
improving makes a generous budget safe.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluence.errors import ConfigError

AUTO = "auto"
# "auto": this many steps per task, bounded below and above, and never more than this many passes over the
# training anchors (a tiny database overfits long before the per-task budget)
STEPS_PER_TASK = 1500
AUTO_MIN_STEPS, AUTO_MAX_STEPS = 2000, 24_000
AUTO_MAX_EPOCHS = 50
# a run whose length is resolved (auto or a duration) validates about this many times (early stopping's clock)
VALIDATIONS_PER_RUN = 30
# a duration's step count leaves this share of the measured step time for what the estimate does not see (the
# sampler's waits, logging, checkpoints); the run also stops at the deadline whatever the estimate said
TIME_SAFETY = 1.15

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m(?:in)?)?\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$")


def parse_duration(text: str) -> float | None:
    """Seconds of a duration such as `"90s"`, `"10m"`, `"1h30m"`, `"1.5h"` (None: not a duration)."""
    m = _DURATION.match(text.lower())
    if not m or not any(m.groups()):
        return None
    h, mins, s = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mins * 60 + s


def check_run_length(value: int | str, setting: str = "max_steps") -> None:
    """A ConfigError unless `value` is a step count >= 0, `"auto"` or a positive duration."""
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(setting, f"must be >= 0, got {value}")
        return
    if value == AUTO:
        return
    seconds = parse_duration(value)
    if seconds is None or seconds <= 0:
        raise ConfigError(setting, f"must be a number of steps, \"auto\" (from the databases) or a duration such as "
                                   f"\"10m\" or \"1h30m\", got {value!r}")


def is_resolved(value: int | str) -> bool:
    """Whether a run length is already a step count."""
    return isinstance(value, int)


def auto_steps(train_anchors: Mapping[str, int], batch_size: int) -> int:
    """The `"auto"` run length for tasks with these training-anchor counts: `STEPS_PER_TASK` per task within
    [`AUTO_MIN_STEPS`, `AUTO_MAX_STEPS`], at most `AUTO_MAX_EPOCHS` passes over the anchors, rounded to 100."""
    tasks = max(len(train_anchors), 1)
    steps = min(max(STEPS_PER_TASK * tasks, AUTO_MIN_STEPS), AUTO_MAX_STEPS)
    epochs_cap = AUTO_MAX_EPOCHS * sum(train_anchors.values()) / max(batch_size, 1)
    steps = min(steps, max(int(epochs_cap), 100))
    return max(100, int(round(steps / 100.0)) * 100)


def steps_for_duration(seconds_left: float, step_s: float, val_s: float, val_every: int) -> int:
    """Steps that fit in `seconds_left` when a step takes `step_s` (times `TIME_SAFETY`) and a validation,
    every `val_every` steps, takes `val_s`; at least 1."""
    per_step = step_s * TIME_SAFETY + val_s / max(val_every, 1)
    return max(1, int(seconds_left / max(per_step, 1e-9)))


def validation_interval(steps: int, val_every: int) -> int:
    """How often a run of a resolved length validates: the recipe's interval, or sparser so that the run
    validates about `VALIDATIONS_PER_RUN` times (rounded up to 50 steps)."""
    wanted = math.ceil(steps / VALIDATIONS_PER_RUN / 50) * 50
    return max(val_every, wanted, 1)


@dataclass
class EarlyStop:
    """Early stopping on the validation losses: the score of a validation is the mean over tasks of each task's
    loss divided by its loss at the run's first validation (tasks of other kinds and scales weigh alike); a
    validation whose score is below the best so far is the new best (its checkpoint is kept); the run stops after
    `patience` validations in a row that did not beat the best by more than `min_delta` (relative)."""

    patience: int
    min_delta: float = 0.001
    base: dict[str, float] = field(default_factory=dict)
    best_score: float = math.inf
    best_step: int = -1
    since_best: int = 0

    def score(self, losses: Mapping[str, float]) -> float | None:
        """The relative mean loss of a validation (None: no task the first validation also measured)."""
        keys = [k for k in losses if k in self.base and k.startswith("val/") and k.endswith("/loss")]
        if not keys:
            return None
        return sum(losses[k] / max(self.base[k], 1e-9) for k in keys) / len(keys)

    def update(self, step: int, losses: Mapping[str, float]) -> bool:
        """Record a validation at `step`; True when it is the best so far (the caller keeps its checkpoint)."""
        if not self.base:  # the first validation: the reference every later one is measured against
            self.base = {k: float(v) for k, v in losses.items() if k.startswith("val/") and k.endswith("/loss")}
            self.best_score, self.best_step, self.since_best = 1.0, step, 0
            return True
        s = self.score(losses)
        if s is None:
            return False
        improved_enough = s < self.best_score * (1.0 - self.min_delta)
        best = s < self.best_score
        if best:
            self.best_score, self.best_step = s, step
        self.since_best = 0 if improved_enough else self.since_best + 1
        return best

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.since_best >= self.patience

    def to_meta(self) -> dict[str, Any]:
        return {"base": self.base, "best_score": self.best_score, "best_step": self.best_step,
                "since_best": self.since_best}

    @classmethod
    def from_meta(cls, patience: int, meta: Mapping[str, Any] | None, min_delta: float = 0.001) -> EarlyStop:
        es = cls(patience, min_delta)
        if meta:
            es.base = {str(k): float(v) for k, v in dict(meta.get("base", {})).items()}
            es.best_score = float(meta.get("best_score", math.inf))
            es.best_step = int(meta.get("best_step", -1))
            es.since_best = int(meta.get("since_best", 0))
        return es


def describe_length(value: int | str) -> str:
    """A run length in words, for the console."""
    if isinstance(value, int):
        return f"{value} steps"
    if value == AUTO:
        return "auto (from the databases' tasks and training rows)"
    return f"a time budget of {value}"


def task_anchor_counts(stream: Any) -> dict[str, int]:
    """Training anchors per task of a batch stream (`auto_steps`'s input)."""
    return {e.key: int(len(stream.sampler.seed_ids("train", e.task.name, e.db_idx))) for e in stream.tasks}


__all__: Sequence[str] = ["AUTO", "EarlyStop", "auto_steps", "check_run_length", "describe_length", "is_resolved",
                          "parse_duration", "steps_for_duration", "task_anchor_counts", "validation_interval"]
