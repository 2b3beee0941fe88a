"""`confluence bench links`: what ranking a link task's whole target table costs (docs/design/link-cost.md).

Four measurements, one table:

- **top-k latency per anchor** of the catalogue's exact top-k (`confluence.targets.link.top_k`, what
  `LinkRanker.shortlists` runs) for catalogue sizes N and key widths D: random float32 keys [N, D] and queries, the
  ms per anchor over a block of anchors and the keys' memory;
- **catalogue key throughput**: target rows per second through the transformer, each row read from its own context
  of `link.item_cells` cells at one observation time (`LinkSource.item_batch`, then the model's `catalogue_keys`, as
  `LinkRanker.catalogue_keys` does), split into building the contexts and the model; the time to key a catalogue of
  N rows is extrapolated from it;
- **the popularity forecast** of every target row at one observation time (`targets.link_forecast`, what the
  ranker's pair counts fit once per day of observation times with `link.forecast_windows`): synthetic links,
  about 0.37 a row and horizon, counted into horizons and the regression fitted and read, for catalogue sizes N;
- **training steps/s** of `train_links` (catalogue side on and off: short runs, the first steps, which compile,
  left out) beside a cell-task training step of the same store and settings (the training stream and fused step of
  `confluence train`; a store without cell tasks: synthetic batches of the same shapes, as `bench train` times
  them).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

from confluence.store import Store
from confluence.targets import link as L
from confluence.training.config import RunConfig, load_config

SIZES = (1_000, 10_000, 100_000, 1_000_000)
WIDTH_RECIPES = ("demo", "small")


def recipe_widths(recipes: Sequence[str] = WIDTH_RECIPES) -> list[int]:
    """The model width D (d_model) of each recipe, each once."""
    return sorted({load_config(r).model.d_model for r in recipes})


def topk_latency(sizes: Sequence[int], widths: Sequence[int], *, anchors: int = 256, k: int = 100, seed: int = 0,
                 min_seconds: float = 0.3, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Per (D, N): ms per anchor of `top_k` over `anchors` queries against N random float32 keys of width D (the
    median of repeated calls until `min_seconds`, at most 20 calls) and the keys' MiB."""
    rng = np.random.default_rng(seed)
    out = []
    for d in widths:
        queries = rng.standard_normal((anchors, d), dtype=np.float32)
        for n in sizes:
            keys = rng.standard_normal((n, d), dtype=np.float32)
            L.top_k(queries[:1], keys[:min(n, 1000)], k)  # first-call costs (imports, page faults) not timed
            times: list[float] = []
            while not times or (sum(times) < min_seconds and len(times) < 20):
                t0 = time.perf_counter()
                L.top_k(queries, keys, k)
                times.append(time.perf_counter() - t0)
            s = statistics.median(times)
            row = {"n": int(n), "d": int(d), "k": int(k), "anchors": int(anchors), "calls": len(times),
                   "keys_mib": keys.nbytes / 2**20, "ms_per_anchor": 1e3 * s / anchors, "anchors_per_s": anchors / s}
            out.append(row)
            if log:
                log(f"top-k N={n:,} D={d}: {row['ms_per_anchor']:.3f} ms/anchor ({len(times)} calls)")
            del keys
    return out


def forecast_cost(sizes: Sequence[int], windows: int = 4, *, seed: int = 0,
                  log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Per catalogue size N: seconds to count synthetic links into horizons (`horizon_buckets`) and to fit and read
    the forecast (`forecast_popularity`) of all N rows, once (it runs once per day of observation times)."""
    from confluence.targets.link_forecast import HISTORY, forecast_popularity, horizon_buckets

    rng = np.random.default_rng(seed)
    out = []
    n_buckets = HISTORY + windows
    for n in sizes:
        rate = rng.lognormal(-1.5, 1.0, n)  # rows' links per horizon: mean about 0.4, a long tail
        per = rng.poisson(np.broadcast_to(rate, (n_buckets, n)))
        bucket = np.repeat(np.arange(n_buckets), per.sum(axis=1))
        row = np.concatenate([np.repeat(np.arange(n), per[b]) for b in range(n_buckets)])
        time_us = np.sort(-bucket)  # bucket j: seed time -j, in (-(j + 1), -j] for horizon 1 and cutoff 0
        order = np.argsort(-bucket, kind="stable")
        t0 = time.perf_counter()
        buckets = horizon_buckets(time_us, row[order], 0, 1, n_buckets, n)
        t1 = time.perf_counter()
        forecast_popularity(buckets, windows)
        t2 = time.perf_counter()
        out.append({"n": n, "windows": windows, "history": HISTORY, "links": int(len(row)), "count_s": t1 - t0,
                    "fit_s": t2 - t1})
        if log:
            log(f"forecast N={n:,}: {t1 - t0:.2f} s counting, {t2 - t1:.2f} s fitting and reading")
    return out


def link_model_config(store: Store, cfg: RunConfig) -> RunConfig:
    """`cfg` as `train_links` trains it on `store`: the link head on, the store's D_t and label count."""
    from confluence.model.inputs import fitted_max_k

    cfg = replace(cfg, model=replace(cfg.model, link_head=True, d_t=int(store.d_t)))
    return replace(cfg, loss=replace(cfg.loss, max_k=fitted_max_k(cfg.loss.max_k, [store])))


def key_throughput(store: Store, task: str, cfg: RunConfig, *, rows: int = 512, checkpoint: str | Path | None = None,
                   log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Target rows keyed per second: `rows` rows of the target table (cycled if it has fewer), read from their own
    contexts at the task's latest observation time and run through the model's `catalogue_keys`, in the ranker's
    chunks (`LinkSource.item_batch_size`); the first chunk (compilation) is timed apart. The model is the
    checkpoint's (`checkpoint`, with its own settings) or a fresh one of `cfg`."""
    from confluence.inference.links import LinkRanker
    from confluence.inference.predictor import LoadedModel, load_model
    from confluence.model.inputs import batch_to_inputs
    from confluence.model.transformer import RelationalTransformer

    if checkpoint is not None:
        loaded = load_model(checkpoint)
    else:
        cfg = link_model_config(store, cfg)
        loaded = LoadedModel(model=RelationalTransformer(cfg.model, key=jax.random.key(cfg.seed)), config=cfg,
                             step=0, path=Path("fresh"))

    @jax.jit
    def keys_of(model, inputs, col_tab, cat_tab):
        return model.catalogue_keys(inputs, col_tab, cat_tab)

    ranker = LinkRanker(loaded, store, task)
    try:
        source = ranker.source
        first, end = source.catalog
        at = int(np.asarray(store.link_arrays(task).obs_time).max())
        bs = source.item_batch_size
        want = np.resize(np.arange(first, end, dtype=np.int64), rows + bs)  # one chunk more: the compiling one

        def chunk(lo: int) -> tuple[float, float]:
            part = want[lo:lo + bs]
            t0 = time.perf_counter()
            inputs = batch_to_inputs(source.item_batch(part, np.full(len(part), at)).batch)
            t1 = time.perf_counter()
            jax.block_until_ready(keys_of(loaded.model, inputs, ranker.col_tab, ranker.cat_tab))
            return t1 - t0, time.perf_counter() - t1

        t0 = time.perf_counter()
        chunk(0)
        compile_s = time.perf_counter() - t0
        sampling = model = 0.0
        done = 0
        for lo in range(bs, bs + rows, bs):
            s, m = chunk(lo)
            sampling, model, done = sampling + s, model + m, done + min(bs, bs + rows - lo)
    finally:
        ranker.close()
    res = {"rows": done, "chunk": bs, "item_cells": int(min(loaded.config.link.item_cells,
                                                             loaded.config.sampler.seq_len)),
           "d": int(loaded.config.model.d_model), "model": "checkpoint" if checkpoint is not None else "fresh",
           "target_rows": int(end - first), "compile_s": compile_s, "rows_per_s": done / (sampling + model),
           "sampling_rows_per_s": done / sampling, "model_rows_per_s": done / model}
    if log:
        log(f"catalogue keys: {res['rows_per_s']:.0f} rows/s ({res['sampling_rows_per_s']:.0f} building contexts, "
            f"{res['model_rows_per_s']:.0f} the model), first chunk {compile_s:.1f} s")
    return res


def _speed(stamps: list[float], warmup: int) -> dict[str, float]:
    """Steps/s over the steps after the first `warmup` (their compilation), from the time each step ended."""
    gaps = np.diff(stamps[warmup:])
    return {"steps": len(gaps), "steps_per_s": len(gaps) / float(gaps.sum()),
            "median_step_ms": 1e3 * float(np.median(gaps)), "first_steps_s": stamps[warmup] - stamps[0]}


def link_train_speed(store: Store, task: str, cfg: RunConfig, *, catalogue: bool, steps: int = 20,
                     warmup: int = 3) -> dict[str, Any]:
    """Steps/s of `train_links` (a run of `warmup + steps` steps into a temporary folder) with the catalogue side on
    or off; each step's end is when its loss is read (`on_step`), so batch building is inside the figure."""
    from confluence.training.links import train_links

    cfg = replace(cfg, link=replace(cfg.link, catalogue=catalogue))
    stamps = [time.perf_counter()]
    with tempfile.TemporaryDirectory(prefix="bench-links-") as tmp:
        train_links(store, task, Path(tmp) / "run", cfg, steps=warmup + steps,
                    on_step=lambda s, x: stamps.append(time.perf_counter()))
    s = cfg.sampler
    return {"what": f"train_links, catalogue {'on' if catalogue else 'off'}", "batch_size": s.batch_size,
            "seq_len": s.seq_len, "item_batch": (s.batch_size * cfg.link.positives + cfg.link.negatives
                                                 if catalogue else 0),
            "item_cells": min(cfg.link.item_cells, s.seq_len) if catalogue else 0, **_speed(stamps, warmup)}


def cell_train_speed(store: Store, cfg: RunConfig, *, steps: int = 20, warmup: int = 3) -> dict[str, Any]:
    """Steps/s of the cell tasks' training step on `store` with `cfg`: `confluence train`'s stream and fused step
    (each step's loss read before the next, as `link_train_speed` reads it). A store without cell tasks: synthetic
    batches of the same shapes (`bench train`), the model's step alone."""
    from confluence.model.inputs import DbTables, batch_to_inputs, pad_alike
    from confluence.model.transformer import RelationalTransformer
    from confluence.toolkit.mesh import make_mesh, replicate
    from confluence.training.loop import fit_max_k, open_stream
    from confluence.training.step import get_trainer, shard_inputs

    cfg = replace(cfg, model=replace(cfg.model, d_t=int(store.d_t)))
    s = cfg.sampler
    head = {"batch_size": s.batch_size, "seq_len": s.seq_len, "item_batch": 0, "item_cells": 0}
    if not store.tasks:
        from confluence.bench.train import bench_train

        r = bench_train(cfg, "bench links", steps=steps, windows=1)
        return {"what": "train, cell tasks (synthetic batches: the store has none)", **head, "steps": steps,
                "steps_per_s": r.steps_per_s, "median_step_ms": 1e3 * r.step_s,
                "first_steps_s": r.compile_s + r.first_step_s, "source": "synthetic"}
    stream = open_stream([Path(store.path)], cfg)
    try:
        cfg = fit_max_k(cfg, list(stream.stores))
        mesh = make_mesh()
        trainer = get_trainer(cfg.model, cfg.optim.for_run(warmup + steps), cfg.loss)
        params, opt_state = trainer.init_state(RelationalTransformer(cfg.model, key=jax.random.key(cfg.seed)))
        params, opt_state = replicate(params, mesh), replicate(opt_state, mesh)
        tables = pad_alike([DbTables.for_model(x, cfg.loss.max_k, cfg.model) for x in stream.stores])
        dev = [replicate((t.column_embeddings, t.categorical_embeddings), mesh) for t in tables]
        stamps = [time.perf_counter()]
        for i in range(warmup + steps):
            batch = stream.next_train()
            micro = [(shard_inputs(batch_to_inputs(batch), mesh), *dev[batch.db_idx])]
            params, opt_state, m = trainer.step(params, opt_state, micro, i)
            jax.block_until_ready(m.loss)
            stamps.append(time.perf_counter())
    finally:
        stream.close()
    return {"what": "train, cell tasks", **head, **_speed(stamps, warmup), "source": "store"}


def bench_links(store: Store | str | Path, task: str, cfg: RunConfig, *, sizes: Sequence[int] = SIZES,
                widths: Sequence[int] | None = None, anchors: int = 256, k: int | None = None, key_rows: int = 512,
                checkpoint: str | Path | None = None, train_steps: int = 20, warmup: int = 3, train: bool = True,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every measurement of the module doc on `task` of `store` with settings `cfg`. `widths`: the key widths D of
    the top-k (default: the `demo` and `small` recipes' and `cfg`'s); `k`: the top-k's k (default `link.shortlist`,
    what the ranker asks of the catalogue)."""
    store = store if isinstance(store, Store) else Store.open(store)
    info = store.link_task(task)  # a named error before minutes of work
    widths = list(widths) if widths else sorted({*recipe_widths(), cfg.model.d_model})
    k = k or cfg.link.shortlist
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    out: dict[str, Any] = {
        "store": str(store.path), "task": task, "target_table": info.target_table, "machine":
            f"{platform.machine()}, {os.cpu_count()} CPUs, {jax.default_backend()} ({jax.devices()[0].device_kind}),"
            f" JAX {jax.__version__}", "d_model": cfg.model.d_model, "sampler": {
                "batch_size": cfg.sampler.batch_size, "seq_len": cfg.sampler.seq_len,
                "max_rows": cfg.sampler.max_rows, "row_buckets": list(cfg.sampler.row_buckets)},
        "link": {"item_cells": cfg.link.item_cells, "positives": cfg.link.positives,
                 "negatives": cfg.link.negatives, "shortlist": cfg.link.shortlist},
    }
    out["topk"] = topk_latency(sizes, widths, anchors=anchors, k=k, log=log)
    keys = key_throughput(store, task, cfg, rows=key_rows, checkpoint=checkpoint, log=log)
    keys["seconds_to_key"] = {str(n): n / keys["rows_per_s"] for n in sorted({*sizes, keys["target_rows"]})}
    out["keys"] = keys
    out["forecast"] = forecast_cost(sizes, cfg.link.forecast_windows or 4, log=log)
    out["train"] = []
    if train:
        lcfg = link_model_config(store, cfg)
        for on in (True, False):
            out["train"].append(link_train_speed(store, task, lcfg, catalogue=on, steps=train_steps, warmup=warmup))
            if log:
                log(f"{out['train'][-1]['what']}: {out['train'][-1]['steps_per_s']:.2f} steps/s")
        out["train"].append(cell_train_speed(store, cfg, steps=train_steps, warmup=warmup))
        if log:
            log(f"{out['train'][-1]['what']}: {out['train'][-1]['steps_per_s']:.2f} steps/s")
    out["seconds"] = time.perf_counter() - t0
    out["loadavg_1min"] = [load0, os.getloadavg()[0]]
    return out


def table_rows(res: dict[str, Any]) -> list[tuple[str, str, float, str]]:
    """The result as (what, setting, value, unit) rows: the one table `confluence bench links` prints."""
    rows: list[tuple[str, str, float, str]] = []
    for r in res["topk"]:
        rows.append(("top-k latency per anchor", f"N={r['n']:,} D={r['d']} k={r['k']}, keys {r['keys_mib']:,.1f} MiB, "
                     f"{r['anchors']} anchors", r["ms_per_anchor"], "ms"))
    kk = res["keys"]
    where = f"D={kk['d']}, {kk['item_cells']} cells a row, {kk['rows']:,} rows in chunks of {kk['chunk']} ({kk['model']} model)"
    rows += [("catalogue keys", where, kk["rows_per_s"], "rows/s"),
             ("  building the contexts", "the same rows", kk["sampling_rows_per_s"], "rows/s"),
             ("  the model", "the same rows", kk["model_rows_per_s"], "rows/s")]
    for n, s in kk["seconds_to_key"].items():
        mark = " (this task's target table)" if int(n) == kk["target_rows"] else " (extrapolated)"
        rows.append(("time to key the catalogue", f"N={int(n):,}{mark}", s, "s"))
    for r in res.get("forecast", []):
        where = (f"N={r['n']:,}, one observation time, {r['links']:,} links in {r['windows']} + {r['history']} "
                 "horizons")
        rows += [("popularity forecast", where, r["count_s"] + r["fit_s"], "s"),
                 ("  counting the links", "the same", r["count_s"], "s")]
    for r in res["train"]:
        side = f", {r['item_batch']} target rows x {r['item_cells']} cells" if r["item_batch"] else ""
        rows += [(r["what"], f"B={r['batch_size']} S={r['seq_len']}{side}; mean of {r['steps']} steps, "
                  "late compiles included", r["steps_per_s"], "steps/s"),
                 ("  median step", "the same steps", r["median_step_ms"], "ms")]
    return rows


def finite_positive(res: dict[str, Any]) -> bool:
    """Whether every figure of the table is a finite positive number."""
    return all(math.isfinite(v) and v > 0 for _, _, v, _ in table_rows(res))
