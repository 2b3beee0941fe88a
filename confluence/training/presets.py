"""Training configuration, presets (`small`, `base`) and loading from a JSON / TOML file."""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from confluence.errors import ConfluenceError
from confluence.model.config import ModelConfig
from confluence.model.loss import LossConfig
from confluence.training.optim import OptimConfig


class ConfigError(ConfluenceError):
    """A training configuration file or preset is invalid."""


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    batch_size: int = 32
    seq_len: int = 1024
    max_rows: int = 256  # R bucket of the synthetic source / cap handed to the sampler
    grad_accum: int = 1
    max_steps: int = 100_000
    val_every: int = 1000
    val_batches: int = 4
    ckpt_every: int = 1000
    keep_checkpoints: int = 3
    log_every: int = 10
    seed: int = 0
    task_weighting: str = "uniform"  # "uniform" over tasks, or "db_uniform": a database first, then a task
    sampler: dict[str, Any] = field(default_factory=dict)  # passed to the sampler's config unchanged

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["optim"] = self.optim._asdict()
        d["loss"] = self.loss._asdict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], base: TrainConfig | None = None) -> TrainConfig:
        """Overlay the (possibly partial) dict `d` on `base` (default: the dataclass defaults)."""
        base = base or cls()
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known - {"preset"})
        if unknown:
            raise ConfigError(f"training config: unknown field(s) {unknown}; known: {sorted(known)}")
        kw: dict[str, Any] = {}
        try:
            for k, v in d.items():
                if k == "preset":
                    continue
                if k == "model":
                    kw[k] = ModelConfig.from_dict({**base.model.to_dict(), **v})
                elif k == "optim":
                    kw[k] = _overlay_tuple(base.optim, v, "optim")
                elif k == "loss":
                    kw[k] = _overlay_tuple(base.loss, v, "loss")
                else:
                    kw[k] = v
            cfg = replace(base, **kw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"training config: {exc}") from exc
        cfg.check()
        return cfg

    def check(self) -> None:
        for name in ("batch_size", "seq_len", "max_rows", "grad_accum", "max_steps", "log_every", "ckpt_every",
                     "val_every"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"training config: {name} must be positive, got {getattr(self, name)}")
        if self.task_weighting not in ("uniform", "db_uniform"):
            raise ConfigError(f"training config: task_weighting must be uniform|db_uniform, got {self.task_weighting!r}")
        if self.seq_len > 65535 or self.max_rows > 65535:
            raise ConfigError("training config: seq_len and max_rows must fit uint16 (<= 65535)")
        if self.loss.numeric_loss not in ("huber", "median"):
            raise ConfigError(f"training config: loss.numeric_loss must be huber|median, got {self.loss.numeric_loss!r}")
        if not self.loss.median_delta > 0 or not self.loss.huber_delta > 0:
            raise ConfigError("training config: loss.huber_delta and loss.median_delta must be positive")


def _overlay_tuple(base, d: dict[str, Any], where: str):
    unknown = sorted(set(d) - set(base._fields))
    if unknown:
        raise ConfigError(f"training config: unknown field(s) {unknown} in [{where}]; known: {list(base._fields)}")
    return base._replace(**d)


PRESETS: dict[str, TrainConfig] = {
    # Learns in minutes on 2 CPU cores.
    "small": TrainConfig(
        model=ModelConfig(d_model=64, n_layers=2, n_heads=4, d_t=256, compute_dtype="bfloat16"),
        optim=OptimConfig(lr_muon=0.02, lr_adamw=3e-3, warmup_steps=20, total_steps=400),
        loss=LossConfig(max_k=128),
        batch_size=16, seq_len=128, max_rows=32, max_steps=400, val_every=100, val_batches=2, ckpt_every=100,
        log_every=10,
    ),
    # The seeds' model: D = D_t = 256, 8 heads, 12 layers; B = 32, S = 1024. For a GPU.
    "base": TrainConfig(
        model=ModelConfig(d_model=256, n_layers=12, n_heads=8, d_t=256, compute_dtype="bfloat16",
                          attention_impl="auto"),
        optim=OptimConfig(lr_muon=0.02, lr_adamw=3e-4, warmup_steps=2000, total_steps=200_000),
        loss=LossConfig(max_k=256),
        batch_size=32, seq_len=1024, max_rows=256, max_steps=200_000, val_every=2000, val_batches=8,
        ckpt_every=2000, log_every=50,
    ),
}


def load_config(spec: str, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """`spec` is a preset name or a .json / .toml file (which may name a `preset` to start from)."""
    if spec in PRESETS:
        cfg = PRESETS[spec]
    else:
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"--config {spec!r}: neither a preset ({', '.join(PRESETS)}) nor an existing file")
        try:
            raw = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path}: cannot parse: {exc}") from exc
        base_name = raw.get("preset")
        if base_name is not None and base_name not in PRESETS:
            raise ConfigError(f"config file {path}: unknown preset {base_name!r}; known: {list(PRESETS)}")
        cfg = TrainConfig.from_dict(raw, PRESETS[base_name] if base_name else None)
    if overrides:
        cfg = TrainConfig.from_dict(overrides, cfg)
    return cfg
