"""Where an inference context's time goes, and how fast `confluence predict` answers from end to end.

Two measurements:

* `profile_inference`: in this process, on one store and task, the phases of a prediction: loading the checkpoint,
  binding it to the store, the first model call (its compilation: from the persistent cache when warm), building
  contexts alone (the sampler with labelled context and draws), the model alone on built batches, both together
  (what predict runs: the batch stream's worker threads build while the model runs), and turning the head
  outputs into the prediction table. Rates are contexts per second (a context: one draw of one anchor).
* `time_commands`: `confluence predict` as a user runs it, in a child process from each checkout given (this one,
  or an earlier commit's, `--repo`), each with a cold then a warm compilation cache: wall time and anchors per
  second, before and after in one run.

A checkpoint or a recipe: `config=` builds a randomly initialised model of that recipe (saved to a temporary run),
so `base` can be timed without a trained `base` model (the arithmetic does not depend on the parameters' values).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def recipe_checkpoint(config: str, out: Path) -> Path:
    """A run directory holding a randomly initialised model of recipe `config` (a checkpoint at step 0)."""
    import jax

    from confluence.model.transformer import RelationalTransformer
    from confluence.toolkit.checkpoint import save_checkpoint
    from confluence.training.config import load_config
    from confluence.training.step import get_trainer

    cfg = load_config(config)
    model = RelationalTransformer(cfg.model, key=jax.random.key(cfg.seed))
    params, opt_state = get_trainer(cfg.model, cfg.optim.for_run(cfg.steps_or(1000)), cfg.loss).init_state(model)
    save_checkpoint(out, 0, params, opt_state, {"config": cfg.to_dict()})
    return out


def _timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def profile_inference(checkpoint: str | Path, store: str | Path, task: str, *, anchors: int = 2000,
                      draws: int = 4, batch_size: int | None = None, threads: int | None = None,
                      split: str = "test") -> dict[str, Any]:
    """The phases of predicting `anchors` seeds of `split` of `task` (module doc), in seconds and contexts/s."""
    import jax

    from confluence.evaluation.predict import seed_prediction_table, subsample
    from confluence.inference.predictor import Predictor, load_model

    res: dict[str, Any] = {"task": task, "draws": draws, "device": str(jax.devices()[0].platform)}
    loaded, res["load_s"] = _timed(lambda: load_model(checkpoint))
    predictor, res["bind_s"] = _timed(lambda: Predictor(loaded, store, batch_size=batch_size, threads=threads,
                                                        draws=draws))
    res["batch_size"] = predictor.batch_size
    res["model"] = {"d_model": loaded.config.model.d_model, "n_layers": loaded.config.model.n_layers,
                    "seq_len": loaded.config.sampler.seq_len}
    try:
        ids = subsample(predictor.seed_ids(split, task), anchors)
        res["anchors"] = len(ids)
        contexts = len(ids) * draws
        res["contexts"] = contexts
        first = next(iter(predictor.stream.ordered(task, ids[: predictor.batch_size], epoch=0, context=split)))
        _, res["first_call_s"] = _timed(lambda: predictor.forward(first))  # compiles (or loads the compiled model)
        res["first_prediction_s"] = res["load_s"] + res["bind_s"] + res["first_call_s"]

        def build() -> list:
            return [b for e in range(draws) for b in predictor.stream.ordered(task, ids, epoch=e, context=split)]

        batches, t_build = _timed(build)
        res["sampling_contexts_per_s"] = contexts / t_build

        _, t_model = _timed(lambda: [predictor.forward(b) for b in batches])
        res["model_contexts_per_s"] = contexts / t_model
        batches = []  # freed before the pipeline's own batches
        head, t_all = _timed(lambda: predictor.task_outputs(task, ids, context=split))
        res["pipeline_contexts_per_s"] = contexts / t_all
        res["pipeline_anchors_per_s"] = len(ids) / t_all
        train_ids = predictor.seed_ids("train", task)
        _, res["assemble_s"] = _timed(lambda: seed_prediction_table(predictor.store, task, ids, head,
                                                                     train_ids=train_ids))
        res["flops_per_context"], res["bytes_per_context"] = _cost(predictor, first)
    finally:
        predictor.close()
    return res


def _cost(predictor: Any, batch: Any) -> tuple[float | None, float | None]:
    """XLA's count of the model call's floating-point operations and bytes accessed, per context."""
    from confluence.inference.predictor import _forward
    from confluence.model.inputs import batch_to_inputs

    try:
        compiled = _forward.lower(predictor.loaded.model, batch_to_inputs(batch), predictor.col_tab,
                                  predictor.cat_tab, max_k=predictor.max_k).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        b = predictor.batch_size
        return float(cost.get("flops", 0.0)) / b, float(cost.get("bytes accessed", 0.0)) / b
    except Exception:  # noqa: BLE001 - a backend without cost analysis: the figures are simply absent
        return None, None


def time_commands(repos: list[Path], checkpoint: str, store: Path, task: str, *, anchors: int = 2000,
                  draws: int = 4, repeats: int = 1) -> list[dict[str, Any]]:
    """`confluence predict` of `anchors` test seeds of `task`, run from each checkout in `repos` (its package first
    on PYTHONPATH) with a cold then a warm compilation cache (`CONFLUENCE_COMPILE_CACHE`; a checkout that keeps no
    cache compiles both times): wall seconds and anchors per second, alternating the checkouts `repeats` times."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as tmp:
        for rep in range(repeats):
            for i, repo in enumerate(repos):
                cache = Path(tmp) / f"cache-{i}-{rep}"
                for state in ("cold", "warm"):
                    out = Path(tmp) / f"p-{i}-{rep}-{state}.parquet"
                    env = {**os.environ, "PYTHONPATH": str(repo), "CONFLUENCE_COMPILE_CACHE": str(cache),
                           "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "")}
                    if not env["JAX_PLATFORMS"]:
                        env.pop("JAX_PLATFORMS")
                    cmd = [sys.executable, "-m", "confluence.cli.main", "predict", "--checkpoint", str(checkpoint),
                           "--db", str(store), "--task", task, "--split", "test", "--max-seeds", str(anchors),
                           "--draws", str(draws), "-o", str(out), "--no-progress"]
                    t0 = time.perf_counter()
                    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=repo)
                    wall = time.perf_counter() - t0
                    if r.returncode != 0:
                        raise RuntimeError(f"{repo}: predict failed ({r.returncode}): {r.stderr[-2000:]}")
                    rows.append({"repo": str(repo), "repeat": rep, "cache": state, "wall_s": wall,
                                 "anchors": anchors, "anchors_per_s": anchors / wall,
                                 "contexts_per_s": anchors * draws / wall})
    return rows


def same_predictions(a: Path, b: Path) -> tuple[bool, float]:
    """Whether two prediction tables are identical, and the largest absolute difference of their numbers."""
    import pyarrow.parquet as pq

    ta, tb = pq.read_table(a), pq.read_table(b)
    if ta.schema.names != tb.schema.names or ta.num_rows != tb.num_rows:
        return False, float("inf")
    worst = 0.0
    for name in ta.schema.names:
        x, y = ta.column(name).to_numpy(zero_copy_only=False), tb.column(name).to_numpy(zero_copy_only=False)
        if np.issubdtype(np.asarray(x).dtype, np.number):
            worst = max(worst, float(np.nanmax(np.abs(np.asarray(x, float) - np.asarray(y, float)), initial=0.0)))
    return ta.equals(tb), worst
