"""The configuration tree of a LeJEPA text-model run, and its recipes (`confluence/configs/text-*.toml`).

`TextRunConfig` holds the model (`TextModelConfig`), the views (`ViewConfig`), the loss weights (`LossWeights`), the
optimizer and schedule (the toolkit's `OptimConfig`, shared with the relational model) and the loop settings.
Recipes load by name (`text-tiny`, `text-smoke`, `text-base`) or from a TOML / JSON file, with `extends` and
`--set` applied by the same rule as the relational model's (`confluence.toolkit.config.overlay`); the vocabulary
size and sequence length come from the prepared data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from confluence.errors import ConfigError
from confluence.textmodel.losses import LossWeights
from confluence.textmodel.model import TextModelConfig
from confluence.textmodel.views import ViewConfig
from confluence.toolkit.config import COMPUTE_DTYPES, merge, one_of, overlay, read_recipe, recipe_dir, to_dict
from confluence.toolkit.optim import OptimConfig


def _text_optim() -> OptimConfig:
    """The text model's optimizer: Nesterov Muon with decoupled decay, AdamW at 3e-3, 20 warmup steps."""
    return OptimConfig(lr_muon=0.02, lr_adamw=3e-3, muon_nesterov=True, weight_decay=0.01, muon_weight_decay=0.01,
                       warmup_steps=20)


@dataclass(frozen=True)
class TextRunConfig:
    """Everything a text run needs besides the data: model, views, losses, optimizer, loop."""

    model: TextModelConfig = field(default_factory=TextModelConfig)
    views: ViewConfig = field(default_factory=ViewConfig)
    weights: LossWeights = field(default_factory=LossWeights)
    optim: OptimConfig = field(default_factory=_text_optim)
    sigreg_weight: float = 0.25
    sigreg_slices: int = 256
    pred_loss: Literal["mse", "cosine"] = "mse"
    span_tokenwise: bool = False
    batch_size: int = 32  # global micro-batch (split across devices)
    grad_accum: int = 1
    max_train_steps: int | None = None  # None: one epoch
    checkpoint_every: int = 100
    keep_checkpoints: int = 3  # the newest this many are kept (0: all)
    log_every: int = 10
    seed: int = 0
    compute_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    shuffle_buffer: int = 4096
    num_devices: int | None = None  # None = all local devices

    def __post_init__(self) -> None:
        fr = self.weights.fractions()
        if self.model.predictor_n_layers == 0 and "span" in fr:
            raise ConfigError("weights.span", "a span loss weight > 0 needs a predictor (model.predictor_n_layers > 0)")
        if self.model.decoder_n_layers == 0 and "decoder" in fr:
            raise ConfigError("weights.decoder", "a decoder loss weight > 0 needs model.decoder_n_layers > 0")
        if "mlm" in fr and not self.model.mask_token_input:
            raise ConfigError("weights.mlm", "the encoder MLM loss needs model.mask_token_input: with attention "
                                             "masking the encoder holds no representation at masked positions")
        if self.views.max_decoder_span != self.model.max_decoder_span:
            raise ConfigError("views.max_decoder_span", f"{self.views.max_decoder_span} differs from "
                                                        f"model.max_decoder_span {self.model.max_decoder_span}")
        if not 0.0 <= self.sigreg_weight <= 1.0:
            raise ConfigError("sigreg_weight", f"must be in [0, 1], got {self.sigreg_weight}")
        one_of("pred_loss", self.pred_loss, ("mse", "cosine"))
        one_of("compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        for name in ("batch_size", "grad_accum", "checkpoint_every", "log_every", "sigreg_slices", "shuffle_buffer"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.max_train_steps is not None and self.max_train_steps < 1:
            raise ConfigError("max_train_steps", f"must be >= 1 (or unset: one epoch), got {self.max_train_steps}")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TextRunConfig:
        return overlay(cls(), d)

    def replace(self, **kw: Any) -> TextRunConfig:
        return replace(self, **kw)


def _text_recipe_files() -> dict[str, Path]:
    return {p.stem: p for p in recipe_dir().glob("text-*.toml")}


def text_recipes() -> list[str]:
    """Names of the shipped recipes of the text model."""
    return sorted(_text_recipe_files())


def load_text_config(spec: str, vocab_size: int, max_seq_len: int,
                     overrides: Mapping[str, Any] | None = None) -> TextRunConfig:
    """The TextRunConfig of a recipe (`text-tiny`, `text-smoke`, `text-base`) or a file, for data of this vocabulary
    and length, then `overrides` (nested, e.g. from `--set`). `views.max_decoder_span` follows the model's."""
    raw = merge(read_recipe(spec, _text_recipe_files()), dict(overrides or {}))
    model = dict(raw.get("model") or {})
    if "max_decoder_span" in model:
        raw = merge(raw, {"views": {"max_decoder_span": model["max_decoder_span"]}})
    return overlay(TextRunConfig(), merge(raw, {"model": {"vocab_size": vocab_size, "max_seq_len": max_seq_len}}))
