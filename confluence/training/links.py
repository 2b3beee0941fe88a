"""Training the link head (and the trunk under it) on a link task: "which rows of the target table will this anchor
link to within the horizon?".

Each step draws `sampler.batch_size` train seeds of the task (a fixed shuffle per epoch), builds their contexts as
for any derived task (`confluence.sampler.links`), scores every row of the target table that the context reached
and fits them to the seed's answer (`model.loss.link_loss`). With the catalogue side (`link.catalogue`, the
default) the batch's seeds share an observation time, and some target rows (part of each seed's answer, the rest
drawn uniformly) are read from their own contexts at that time and scored against every seed of the batch
(`model.loss.catalogue_loss`, a sampled softmax): what lets rows the anchor never touched rank. The optimizer, its schedule and the checkpoints are
the cell tasks' (`toolkit.optim`, `toolkit.checkpoint`); a run can start from a cell-task checkpoint or a
pretrained model (`init_from`), whose parameters all load and the link head starts fresh, or from a run of
`pretrain_links` (every link task of a corpus's databases, a database drawn per step), head included.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from confluence import outputs
from confluence.errors import ConfluenceError
from confluence.model.inputs import DbTables, batch_to_inputs, fitted_max_k, pad_alike
from confluence.model.loss import catalogue_loss, link_loss
from confluence.model.transformer import RelationalTransformer
from confluence.sampler.links import LinkBatch, LinkSource, catalogue_sample, catalogue_time
from confluence.store import Store
from confluence.toolkit.checkpoint import read_checkpoint, save_checkpoint
from confluence.toolkit.optim import make_optimizer
from confluence.training.config import RunConfig
from confluence.training.loop import prepare_run_dir, start_params
from confluence.training.step import is_param, param_labels


def link_inputs(batch: LinkBatch) -> dict[str, np.ndarray]:
    """The model's inputs of a link batch plus its candidates and positives (the link loss's truth)."""
    inputs = batch_to_inputs(batch.result.batch)
    inputs["link_candidates"] = batch.candidates
    inputs["link_positives"] = batch.positives
    return inputs


def _forward_loss(params: Any, static: Any, inputs: dict[str, jax.Array], items: dict[str, jax.Array] | None,
                  col_tab: jax.Array, cat_tab: jax.Array, kind: str = "softmax") -> jax.Array:
    model = eqx.combine(params, static)
    cand = inputs["link_candidates"]
    question, rows = model.link_states(inputs, col_tab, cat_tab, cand.shape[1])
    loss, _ = link_loss(model.link(question, rows), cand, inputs["link_positives"], inputs["seq_valid"])
    if items is None:
        return loss
    keys = model.catalogue_keys(items, col_tab, cat_tab)
    logits = model.link.catalogue(model.link_queries(question), keys)
    return loss + catalogue_loss(logits, items["catalogue_truth"], inputs["seq_valid"], items["seq_valid"], kind)


def catalogue_inputs(source: LinkSource, ids: np.ndarray, rng: np.random.Generator, epoch: int
                     ) -> dict[str, np.ndarray]:
    """The catalogue side of a training batch of seeds `ids` (one observation time): the sampled rows' own
    contexts (padded to `source.item_batch_size`) and "catalogue_truth" [batch_size, item_batch_size]."""
    link = source.link
    rows, truth = catalogue_sample(ids, source.offsets, source.targets, source.catalog, link.positives,
                                   link.negatives, rng)
    t = np.full(len(rows), catalogue_time(source.obs_time[ids[:1]])[0], dtype=np.int64)
    items = batch_to_inputs(source.item_batch(rows, t, epoch).batch)
    full = np.zeros((source.batch_size, source.item_batch_size), dtype=bool)
    full[:truth.shape[0], :truth.shape[1]] = truth
    items["catalogue_truth"] = full
    return items


def train_links(store: Store | str | Path, task: str, out_dir: str | Path, cfg: RunConfig, *, steps: int,
                init_from: str | Path | None = None, force: bool = False,
                on_step: Callable[[int, float], None] | None = None) -> Path:
    """Train the link head of `cfg`'s model (turned on here) on `task` for `steps` steps into the run directory
    `out_dir` (refused when it holds anything but a run; a run is replaced only with `force`); the checkpoint's
    path. `init_from`: a checkpoint (or `pretrained:NAME`) whose parameters start the trunk, with its model
    settings; one trained with a link head (`pretrain_links`) starts the head too."""
    store = store if isinstance(store, Store) else Store.open(store)
    store.link_task(task)  # a named error before anything is written
    return _locked(out_dir, force, init_from,
                   lambda out: _train_links([(store, task)], out, cfg, steps, init_from, on_step))


def pretrain_links(stores: Sequence[Store | str | Path], out_dir: str | Path, cfg: RunConfig, *, steps: int,
                   init_from: str | Path | None = None, force: bool = False,
                   on_step: Callable[[int, float], None] | None = None) -> Path:
    """Train the link head (and the trunk) on every link task of `stores`, a corpus's databases, for `steps` steps:
    each step draws a database (uniformly, so that big ones do not crowd out small ones), then one of its link
    tasks, and takes one batch of it as `train_links` does. Fine-tuning starts from the result with the head
    (`train_links(init_from=...)`). Databases without link tasks are skipped; none at all is a named error."""
    opened = [s if isinstance(s, Store) else Store.open(s) for s in stores]
    pairs = [(s, t.name) for s in opened for t in s.link_tasks]
    if not pairs:
        raise ConfluenceError(f"pretraining links: none of the {len(opened)} database(s) has a link task "
                              "(random databases draw them: `confluence synth random`)")
    return _locked(out_dir, force, init_from, lambda out: _train_links(pairs, out, cfg, steps, init_from, on_step))


def _locked(out_dir: str | Path, force: bool, init_from: str | Path | None, work: Callable[[Path], Path]) -> Path:
    """`work` on the run directory `out_dir`, locked and prepared; a missing or damaged `init_from` is a named
    error before anything is written."""
    if init_from is not None:
        read_checkpoint(Path(init_from))
    out = Path(out_dir)
    lock = outputs.OutputLock(out, "trained")
    with outputs.writing(out, "the training run"):
        lock.acquire()
    try:
        prepare_run_dir(out, resume=False, force=force)
        return work(out)
    finally:
        lock.release()


def _train_links(pairs: list[tuple[Store, str]], out_dir: Path, cfg: RunConfig, steps: int,
                 init_from: str | Path | None, on_step: Callable[[int, float], None] | None) -> Path:
    stores = list({id(s): s for s, _ in pairs}.values())
    d_t = {int(s.d_t) for s in stores}
    if len(d_t) > 1:
        raise ConfluenceError(f"pretraining links: the databases were encoded with texts of different widths {sorted(d_t)}"
                              " (preprocess them with one text encoder)")
    if init_from is not None:
        saved = RunConfig.from_dict(read_checkpoint(Path(init_from)).meta.get("config", {}))
        # its shapes and inputs; how the link head reads the rows shapes no parameter: this run's
        cfg = replace(cfg, model=replace(saved.model, link_values=cfg.model.link_values))
    cfg = replace(cfg, model=replace(cfg.model, link_head=True, d_t=d_t.pop()))
    cfg = replace(cfg, loss=replace(cfg.loss, max_k=fitted_max_k(cfg.loss.max_k, stores)))
    model = RelationalTransformer(cfg.model, key=jax.random.key(cfg.seed))
    params, static = eqx.partition(model, is_param)
    if init_from is not None:
        params = start_params(cfg, init_from, params)
    optim = cfg.optim.for_run(steps)
    optimizer = make_optimizer(param_labels(params), optim)
    opt_state = optimizer.init(params)

    @jax.jit
    def step_fn(params, opt_state, inputs, items, col_tab, cat_tab):
        loss, grads = jax.value_and_grad(_forward_loss)(params, static, inputs, items, col_tab, cat_tab,
                                                        cfg.link.loss)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    # one padded shape of the column and category tables for every database: the step compiles once for them
    padded = pad_alike([DbTables.for_model(s, cfg.loss.max_k, cfg.model) for s in stores])
    tables = {id(s): (jnp.asarray(t.column_embeddings), jnp.asarray(t.categorical_embeddings))
              for s, t in zip(stores, padded, strict=True)}
    by_db = [[i for i, (s, _) in enumerate(pairs) if s is db] for db in stores]
    sources: dict[int, LinkSource] = {}
    streams: dict[int, Iterator[tuple[int, np.ndarray]]] = {}
    try:
        rng = np.random.default_rng((cfg.seed, 1))  # the catalogue rows each step draws
        pick = np.random.default_rng((cfg.seed, 2))  # the database, then the task, of each step
        t0 = time.perf_counter()
        for step in range(steps):
            tasks = by_db[int(pick.integers(len(by_db)))]
            i = tasks[int(pick.integers(len(tasks)))]
            if i not in sources:  # opened when first drawn: a corpus's samplers are not all held from the start
                sources[i] = LinkSource(pairs[i][0], pairs[i][1], cfg)
                streams[i] = sources[i].train_batches(cfg.seed)
            source = sources[i]
            epoch, ids = next(streams[i])
            inputs = link_inputs(source.batch(ids, epoch))
            items = catalogue_inputs(source, ids, rng, epoch) if cfg.link.catalogue else None
            params, opt_state, loss = step_fn(params, opt_state, inputs, items, *tables[id(source.store)])
            if on_step is not None:
                on_step(step + 1, float(loss))
        names = [f"{s.name}/{t}" for s, t in pairs]
        meta = {"config": cfg.to_dict(), "link_tasks": names, "databases": [s.name for s in stores],
                "trained_tasks": names, "seconds": time.perf_counter() - t0}
        if len(pairs) == 1:
            meta["link_task"] = pairs[0][1]  # what checkpoints of one task have always said
        return save_checkpoint(out_dir, steps, params, opt_state, meta, keep=1)
    finally:
        for source in sources.values():
            source.close()
