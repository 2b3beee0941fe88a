"""Run configuration of LeJEPA text training and the named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from confluence.errors import ConfluenceError
from confluence.textmodel.losses import LossWeights
from confluence.textmodel.model import TextModelConfig
from confluence.textmodel.views import ViewConfig

COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs besides the data: model, views, losses, optimizer, loop."""

    model: TextModelConfig
    views: ViewConfig = field(default_factory=ViewConfig)
    weights: LossWeights = field(default_factory=LossWeights)
    sigreg_weight: float = 0.25
    sigreg_slices: int = 256
    pred_loss: str = "mse"  # "mse" | "cosine"
    span_tokenwise: bool = False
    batch_size: int = 32  # global micro-batch (split across devices)
    grad_accum: int = 1
    lr_muon: float = 0.02
    lr_adam: float = 3e-3
    weight_decay: float = 0.01
    adam_b1: float = 0.9
    adam_b2: float = 0.95
    warmup_steps: int = 20
    grad_clip: float = 1.0
    max_train_steps: int | None = None
    checkpoint_every: int = 100
    log_every: int = 10
    seed: int = 0
    compute_dtype: str = "float32"
    shuffle_buffer: int = 4096
    num_devices: int | None = None  # None = all local devices

    def check(self) -> None:
        """Raise ConfluenceError on an inconsistent configuration (names the offending setting)."""
        self.model.check()
        self.views.check()
        fr = self.weights.fractions()
        if self.model.predictor_n_layers == 0 and "span" in fr:
            raise ConfluenceError("span loss weight > 0 needs a predictor; set predictor_n_layers > 0 or the weight 0")
        if self.model.decoder_n_layers == 0 and "decoder" in fr:
            raise ConfluenceError("decoder loss weight > 0 needs decoder_n_layers > 0 (or set the weight to 0)")
        if "mlm" in fr and not self.model.mask_token_input:
            raise ConfluenceError(
                "encoder_mlm_loss needs mask_token_input: with attention masking the encoder holds no representation "
                "at masked positions, so there is nothing to unembed"
            )
        if self.views.max_decoder_span != self.model.max_decoder_span:
            raise ConfluenceError(
                f"views.max_decoder_span {self.views.max_decoder_span} != model.max_decoder_span "
                f"{self.model.max_decoder_span}"
            )
        if not 0.0 <= self.sigreg_weight <= 1.0:
            raise ConfluenceError(f"sigreg_weight must be in [0, 1], got {self.sigreg_weight}")
        if self.pred_loss not in ("mse", "cosine"):
            raise ConfluenceError(f"pred_loss must be 'mse' or 'cosine', got {self.pred_loss!r}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConfluenceError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got {self.compute_dtype!r}")
        for name in ("batch_size", "grad_accum", "checkpoint_every", "log_every", "sigreg_slices"):
            if getattr(self, name) < 1:
                raise ConfluenceError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_train_steps is not None and self.max_train_steps < 1:
            raise ConfluenceError(f"max_train_steps must be >= 1, got {self.max_train_steps}")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["views"]["global_ratio"] = list(self.views.global_ratio)
        d["views"]["local_ratio"] = list(self.views.local_ratio)
        return d

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> TrainConfig:
        raw = dict(raw)
        try:
            model = TextModelConfig.from_json(raw.pop("model"))
            v = dict(raw.pop("views", {}))
            for k in ("global_ratio", "local_ratio"):
                if k in v:
                    v[k] = tuple(v[k])
            views = ViewConfig(**v)
            weights = LossWeights(**raw.pop("weights", {}))
            return cls(model=model, views=views, weights=weights, **raw)
        except (KeyError, TypeError) as exc:
            raise ConfluenceError(f"run configuration: malformed ({exc})") from None

    def replace(self, **kw: Any) -> TrainConfig:
        return dataclasses.replace(self, **kw)


# Presets: overrides of TrainConfig fields; "model" and "views" entries override those sub-configs' fields.
PRESETS: dict[str, dict[str, Any]] = {
    # Unit tests: a few seconds per step on one CPU core.
    "tiny": {
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "mlp_ratio": 2.0, "predictor_n_layers": 1,
                  "decoder_n_layers": 1, "max_decoder_span": 8},
        "views": {"num_global": 2, "num_local": 2, "max_decoder_span": 8},
        "batch_size": 8, "sigreg_slices": 32, "warmup_steps": 2, "checkpoint_every": 1000, "log_every": 1,
        "shuffle_buffer": 256,
    },
    # CPU smoke run: trains in a few minutes on a 2-core box.
    "smoke": {
        "model": {"d_model": 128, "n_heads": 4, "n_layers": 2, "mlp_ratio": 2.0, "predictor_n_layers": 1,
                  "decoder_n_layers": 1, "max_decoder_span": 12, "drop_path_rate": 0.0},
        "views": {"num_global": 2, "num_local": 4, "max_decoder_span": 12},
        "batch_size": 32, "sigreg_slices": 128, "warmup_steps": 30, "checkpoint_every": 200, "log_every": 10,
        "shuffle_buffer": 2048,
    },
    # One GPU: the public-run settings of spec/text_base_model.md.
    "base": {
        "model": {"d_model": 512, "n_heads": 8, "n_layers": 8, "mlp_ratio": 4.0, "predictor_n_layers": 4,
                  "decoder_n_layers": 2, "max_decoder_span": 16, "drop_path_rate": 0.1},
        "views": {"num_global": 2, "num_local": 6, "max_decoder_span": 16},
        "batch_size": 128, "sigreg_slices": 256, "warmup_steps": 500, "checkpoint_every": 1000, "log_every": 50,
        "compute_dtype": "bfloat16", "lr_muon": 0.02, "lr_adam": 1e-3,
    },
}


def preset_config(name: str, vocab_size: int, max_seq_len: int, **overrides: Any) -> TrainConfig:
    """The TrainConfig of preset `name` for data of this vocabulary and length, with top-level `overrides`."""
    if name not in PRESETS:
        raise ConfluenceError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    p = dict(PRESETS[name])
    model = TextModelConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, **p.pop("model", {}))
    views = ViewConfig(**p.pop("views", {}))
    mkeys = {f.name for f in dataclasses.fields(TextModelConfig)}
    vkeys = {f.name for f in dataclasses.fields(ViewConfig)}
    m_over = {k: overrides.pop(k) for k in list(overrides) if k in mkeys}
    v_over = {k: overrides.pop(k) for k in list(overrides) if k in vkeys and k not in mkeys}
    if "max_decoder_span" in m_over:
        v_over["max_decoder_span"] = m_over["max_decoder_span"]
    model = dataclasses.replace(model, **m_over)
    views = dataclasses.replace(views, **v_over)
    p.update(overrides)
    cfg = TrainConfig(model=model, views=views, **p)
    cfg.check()
    return cfg
