"""The configuration tree of a relational training run, and its recipes.

`RunConfig` holds every setting of a run, each declared once in its own section: `model` (`ModelConfig`),
`sampler` (`SamplerConfig`: batch shapes, context walk, task choice, splits), `optim` (`OptimConfig`), `loss`
(`LossConfig`), `loop` (`LoopConfig`: run length, validation, checkpoints, logs), `link` (`LinkConfig`: link
tasks) and the run's `seed`.

Recipes are TOML files in `confluence/configs/` (`small`, `base`, `demo`, ...), loaded by name; any other TOML /
JSON file works too. A file may start from a recipe (`extends = "small"`) and overrides the settings it names.
`--set section.name=VALUE` applies last. Every problem is a `ConfigError` naming the setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from confluence.errors import ConfigError
from confluence.model.config import LossConfig, ModelConfig
from confluence.sampler.config import PER_TASK_SETTINGS, SamplerConfig
from confluence.toolkit.config import overlay, read_recipe, recipe_dir, to_dict
from confluence.toolkit.optim import OptimConfig
from confluence.training.budget import check_run_length


@dataclass(frozen=True)
class LoopConfig:
    """How long a run trains and how often it validates, checkpoints and logs (section `loop`)."""

    # run length: a number of steps (0: no step, e.g. only initialise from --init-from and save nothing), "auto"
    # (from the databases' tasks and training rows) or a duration ("10m", "1h30m": the steps that fit on this
    # machine); `train` resolves it to a step count before the first step (training/budget.py)
    max_steps: int | str = 100_000
    grad_accum: int = 1  # micro-batches per optimizer step (each its own task draw)
    val_every: int = 1000  # steps between validations
    val_batches: int = 4  # validation batches per task, their seeds drawn once across the val split
    # validate on at most this many of the training databases (evenly spaced; 0: all). A corpus run validates every
    # task of every database otherwise: at 393 databases that took 141 s on the GPU machine, longer than the steps
    # between two validations. Held-out databases are always validated in full.
    val_databases: int = 0
    ckpt_every: int = 1000  # steps between checkpoints
    keep_checkpoints: int = 3  # the newest this many are kept (0: all)
    log_every: int = 10  # steps between logged training scalars
    # early stopping: stop after this many validations in a row without a better validation score (0: never);
    # the best validation's checkpoint is kept (`checkpoints/BEST`) and is what evaluate / predict / serve load
    patience: int = 0
    min_delta: float = 0.001  # relative improvement of the validation score that resets the patience

    def __post_init__(self) -> None:
        for name in ("grad_accum", "val_every", "val_batches", "ckpt_every", "log_every"):
            if not getattr(self, name) >= 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("keep_checkpoints", "val_databases", "patience"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.min_delta < 1.0:
            raise ConfigError("min_delta", f"must be in [0, 1), got {self.min_delta}")
        check_run_length(self.max_steps)


@dataclass(frozen=True)
class LinkConfig:
    """How a link task trains and ranks (section `link`; `confluence train-links`, `evaluate` on its run)."""

    # score every row of the target table, each by the transformer over its own context at the observation time,
    # besides the rows the anchor's context reaches: rows the anchor never touched (new items) can rank
    catalogue: bool = True
    negatives: int = 32  # target rows drawn uniformly per training batch as the catalogue's negatives
    positives: int = 1  # of each seed's answer, this many rows per batch as the catalogue's positives
    item_cells: int = 128  # cells of a target row's own context (the catalogue side)
    # the catalogue side's loss: "softmax" (each answer row against the batch's other rows) or "binary" (each row's
    # own cross-entropy; measured slower to learn which rows match, docs/design/decisions.md)
    loss: str = "softmax"
    # the catalogue's best this many rows per seed join the ranker's candidates (beside the context's rows and the
    # baselines' lists)
    shortlist: int = 100
    # the ranker also reads how often and how lately the anchor, and how often every anchor, linked to each
    # candidate (`targets.link.pair_counts_at`); false: the lists' places only
    pair_counts: bool = True
    # with the pair counts, each candidate's links forecast for the coming horizon from its links in this many
    # horizons before (`targets.link_forecast`); 0: none
    forecast_windows: int = 4

    def __post_init__(self) -> None:
        if self.forecast_windows < 0:
            raise ConfigError("forecast_windows", f"must be >= 0, got {self.forecast_windows}")
        for name in ("negatives", "positives", "item_cells", "shortlist"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.loss not in ("softmax", "binary"):
            raise ConfigError("loss", f"must be 'softmax' or 'binary', got {self.loss!r}")


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a relational training run (module doc). Saved with each checkpoint, so evaluation and
    prediction rebuild contexts the way training did."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    seed: int = 0  # model initialisation, task choice, seed order and the context walk

    def __post_init__(self) -> None:
        if self.model.child_rank and not self.sampler.child_rank:
            # the model reads the ranks the sampler fills: one setting turns both on
            object.__setattr__(self, "sampler", replace(self.sampler, child_rank=True))

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunConfig:
        """A tree from its dict (as saved with a checkpoint); older layouts are read too (`migrate`). A run saved
        before `sampler.perm_tile` existed keeps the row orders it was trained on (seed 000's: 0), so it resumes
        with the same batches."""
        d = migrate(d)
        seed = overlay(cls(), {"model": ModelConfig.SEED, "sampler": SamplerConfig.SEED})  # what was not named
        if isinstance(d.get("sampler"), Mapping) and "perm_tile" not in d["sampler"]:
            d["sampler"] = {**d["sampler"], "perm_tile": 0}
        return overlay(seed, d)

    def steps_or(self, default: int) -> int:
        """The run length in steps, or `default` while it is still "auto" / a duration (benches and tools that
        build a trainer without running the loop, which resolves it)."""
        return self.loop.max_steps if isinstance(self.loop.max_steps, int) else default

    def with_max_steps(self, steps: int | str) -> RunConfig:
        """The run made `steps` long (a step count, "auto" or a duration: `LoopConfig.max_steps`; the
        learning-rate schedule follows when `optim.total_steps` is unset)."""
        return overlay(self, {"loop": {"max_steps": steps}})


def _recipe_files() -> dict[str, Path]:
    return {p.stem: p for p in recipe_dir().glob("*.toml") if not p.stem.startswith("text-")}


def recipes() -> list[str]:
    """Names of the shipped recipes of the relational model."""
    return sorted(_recipe_files())


def load_config(spec: str = "small", overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """The RunConfig of a recipe name or a .toml / .json file, then `overrides` (nested dict, e.g. from `--set`)."""
    raw = read_recipe(spec, _recipe_files(), migrate)
    try:
        cfg = overlay(RunConfig(), raw)
    except ConfigError as exc:
        raise ConfigError(exc.setting, f"{exc.problem} (in --config {spec})") from None
    return overlay(cfg, migrate(dict(overrides or {})))


# Top-level settings of the layout before the configuration tree (one flat TrainConfig): where they live now.
_LEGACY = {"batch_size": "sampler", "seq_len": "sampler", "max_rows": "sampler", "grad_accum": "loop",
           "max_steps": "loop", "val_every": "loop", "val_batches": "loop", "ckpt_every": "loop",
           "keep_checkpoints": "loop", "log_every": "loop"}
_LEGACY_SAMPLER_DROPPED = ("seed", "rank", "world_size", "batches_per_epoch")  # now run-level or runtime


def migrate(d: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict of the flat layout (checkpoints and files written before the tree) in the tree's layout;
    a dict already in the tree's layout comes back unchanged."""
    out = dict(d)
    if "preset" in out:
        out["extends"] = out.pop("preset")
    moved = {k: out.pop(k) for k in list(out) if k in _LEGACY}
    weighting = out.pop("task_weighting", None)
    if not moved and weighting is None:
        return out
    sampler = {k: v for k, v in dict(out.get("sampler") or {}).items() if k not in _LEGACY_SAMPLER_DROPPED}
    loop = dict(out.get("loop") or {})
    for k, v in moved.items():
        (sampler if _LEGACY[k] == "sampler" else loop)[k] = v
    if weighting is not None:
        sampler["task_choice"] = {"db_uniform": "database_first"}.get(weighting, weighting)
    out["sampler"], out["loop"] = sampler, loop
    return out


def describe_changes(saved: RunConfig, now: RunConfig) -> list[str]:
    """Settings that differ between two trees, as "section.name: old -> new" lines."""
    a, b = _flat(saved.to_dict()), _flat(now.to_dict())
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and k not in PER_TASK_SETTINGS:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


__all__ = ["LoopConfig", "RunConfig", "describe_changes", "load_config", "migrate", "recipes"]
