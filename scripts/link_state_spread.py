"""How much the link head's inputs differ between seeds: for each run (or `pretrained:NAME`), over three training
batches of a link task, 1 - |mean|^2 / mean |x|^2 of the question states and of the catalogue rows' states (0: every
seed's state is the same vector, 1: they share no direction). A trunk whose states have collapsed ranks by
popularity alone.

    python scripts/link_state_spread.py STORE TASK CONFIG_RUN RUN [RUN ...]

CONFIG_RUN: a link run whose config.json builds the batches; each RUN is read with its own model settings.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from confluence.model.inputs import DbTables
from confluence.model.transformer import RelationalTransformer
from confluence.sampler.links import LinkSource
from confluence.store import Store
from confluence.training.config import RunConfig
from confluence.training.links import catalogue_inputs, link_inputs
from confluence.training.loop import start_params
from confluence.training.step import is_param


def spread(x: np.ndarray) -> float:
    x = np.asarray(x, np.float64)
    mu = x.mean(axis=0)
    return float(1.0 - (mu @ mu) / (x * x).sum(axis=1).mean())


def main(store_path: str, task: str, config_run: str, runs: list[str]) -> None:
    store = Store.open(store_path)
    cfg = RunConfig.from_dict(json.loads(Path(config_run, "config.json").read_text()))
    source = LinkSource(store, task, cfg)
    stream, rng = source.train_batches(cfg.seed), np.random.default_rng(0)
    batches = []
    for _ in range(3):
        epoch, ids = next(stream)
        batches.append((link_inputs(source.batch(ids, epoch)), catalogue_inputs(source, ids, rng, epoch)))
    source.close()
    tables = DbTables.for_model(store, cfg.loss.max_k, cfg.model)
    col, cat = jnp.asarray(tables.column_embeddings), jnp.asarray(tables.categorical_embeddings)
    for name in runs:
        run_cfg = cfg
        if Path(name, "config.json").exists():
            run_cfg = RunConfig.from_dict(json.loads(Path(name, "config.json").read_text()))
        run_cfg = replace(run_cfg, model=replace(run_cfg.model, link_head=True))
        params, static = eqx.partition(RelationalTransformer(run_cfg.model, key=jax.random.key(run_cfg.seed)),
                                       is_param)
        model = eqx.combine(start_params(run_cfg, name, params), static)
        q_spread, row_spread = [], []
        for inputs, items in batches:
            q, _ = model.link_states(inputs, col, cat, inputs["link_candidates"].shape[1])
            _, own = model.link_states(items, col, cat, 1)
            q_spread.append(spread(np.asarray(q)[np.asarray(inputs["seq_valid"], bool)]))
            row_spread.append(spread(np.asarray(own)[np.asarray(items["seq_valid"], bool), 0]))
        print(f"{name}: question spread {np.mean(q_spread):.4f}, catalogue-row spread {np.mean(row_spread):.4f}")


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
