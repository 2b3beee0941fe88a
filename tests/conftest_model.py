"""Shared fixtures of the model / training tests (imported explicitly by tests/test_model_* and test_training_*)."""

from __future__ import annotations

import jax
import numpy as np

from confluence.model.config import ModelConfig
from confluence.model.inputs import DbTables, batch_to_inputs
from confluence.model.transformer import RelationalTransformer
from confluence.training.presets import TrainConfig
from confluence.training.synthetic import SyntheticDatabase

D_T = 8
TINY = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_t=D_T, compute_dtype="float32", ffn_multiple=16)
MAX_K = 16


def tiny_train_config(**kw) -> TrainConfig:
    base = {
        "model": TINY.to_dict(),
        "optim": {"lr_muon": 0.02, "lr_adamw": 3e-3, "warmup_steps": 2, "total_steps": 50},
        "loss": {"max_k": MAX_K},
        "batch_size": 4, "seq_len": 32, "max_rows": 8, "max_steps": 6, "val_every": 3, "val_batches": 1,
        "ckpt_every": 3, "log_every": 1,
    }
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return TrainConfig.from_dict(base)


def tiny_db(seed: int = 0) -> SyntheticDatabase:
    return SyntheticDatabase(seed=seed, d_t=D_T)


def tiny_batch(db: SyntheticDatabase, task: int = 0, seed=0, b: int = 4, s: int = 32, r: int = 8):
    return db.batch(task, b, s, r, seed=seed)


def tables(db: SyntheticDatabase) -> tuple[np.ndarray, np.ndarray]:
    t = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, MAX_K)
    return t.column_embeddings, t.categorical_embeddings


def tiny_model(cfg: ModelConfig = TINY, seed: int = 0) -> RelationalTransformer:
    return RelationalTransformer(cfg, key=jax.random.key(seed))


__all__ = ["D_T", "MAX_K", "TINY", "batch_to_inputs", "tables", "tiny_batch", "tiny_db", "tiny_model",
           "tiny_train_config"]
