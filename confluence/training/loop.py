"""The training loop: task sampling over one or several databases, jitted steps, validation per task, atomic
checkpoints with exact resumption, fine-tuning initialisation, scalar logs and a console progress bar."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from confluence.errors import ConfluenceError
from confluence.model.inputs import DbTables, batch_to_inputs
from confluence.model.transformer import RelationalTransformer
from confluence.training.checkpoint import load_state, read_meta, save_checkpoint
from confluence.training.data import BatchSource, TaskRef
from confluence.training.logs import ScalarLog
from confluence.training.presets import TrainConfig
from confluence.training.step import get_trainer, make_mesh, replicate, shard_inputs


@dataclass
class TrainResult:
    step: int
    params: Any
    last_loss: float | None
    val_losses: dict[str, float] = field(default_factory=dict)
    history: list[tuple[int, float]] = field(default_factory=list)


class TaskSampler:
    """Picks the task of each micro-batch from a seeded numpy Generator whose state is checkpointed."""

    def __init__(self, tasks: list[TaskRef], weighting: str, seed: int):
        self.tasks, self.weighting = tasks, weighting
        self.rng = np.random.default_rng(seed)

    def next(self) -> TaskRef:
        if self.weighting == "db_uniform":
            dbs = sorted({t.db_idx for t in self.tasks})
            db = dbs[int(self.rng.integers(len(dbs)))]
            cands = [t for t in self.tasks if t.db_idx == db]
            return cands[int(self.rng.integers(len(cands)))]
        return self.tasks[int(self.rng.integers(len(self.tasks)))]

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def restore(self, state: dict) -> None:
        self.rng.bit_generator.state = state


def _check_source(cfg: TrainConfig, source: BatchSource) -> None:
    if not source.tasks:
        raise ConfluenceError("training: the data source has no tasks (does the store define any?)")
    for db in source.databases:
        if db.column_embeddings.shape[1] != cfg.model.d_t:
            raise ConfluenceError(
                f"database {db.name!r}: its embeddings have D_t={db.column_embeddings.shape[1]} but the model "
                f"config has d_t={cfg.model.d_t}; set model.d_t to match the store"
            )


def train(
    cfg: TrainConfig,
    source: BatchSource,
    out_dir: Path,
    *,
    resume: bool = False,
    init_from: Path | None = None,
    max_steps: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> TrainResult:
    """Train until `max_steps` (default cfg.max_steps). `on_step(step, scalars)` is called after every step."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_source(cfg, source)
    mesh = mesh or make_mesh()
    stop_at = int(max_steps if max_steps is not None else cfg.max_steps)

    model = RelationalTransformer(cfg.model, key=jax.random.key(cfg.seed))
    trainer = get_trainer(cfg.model, cfg.optim, cfg.loss)
    params, opt_state = trainer.init_state(model)
    tasks = TaskSampler(source.tasks, cfg.task_weighting, cfg.seed)
    step = 0
    if resume and (out_dir / "checkpoints" / "LATEST").is_file():
        ck = read_meta(out_dir)
        saved_cfg = ck.meta.get("config", {})
        if saved_cfg.get("model") != cfg.model.to_dict():
            raise ConfluenceError(f"--resume: the checkpoint {ck.path} was trained with another model config")
        params, opt_state = load_state(ck.path, params, opt_state)
        step = ck.step
        source.restore(ck.meta["pipeline"])
        tasks.restore(ck.meta["rng"]["task_sampler"])
    elif init_from is not None:
        params, _ = load_state(Path(init_from), params)
    (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))

    params, opt_state = replicate(params, mesh), replicate(opt_state, mesh)
    tables = [DbTables.build(d.name, d.column_embeddings, d.categorical_embeddings, d.max_k, cfg.loss.max_k)
              for d in source.databases]
    dev_tables = [replicate((t.column_embeddings, t.categorical_embeddings), mesh) for t in tables]
    log = ScalarLog(out_dir / "scalars.csv", truncate_after_step=step if resume else None)

    def checkpoint(at: int) -> None:
        meta = {"config": cfg.to_dict(), "pipeline": source.position(), "rng": {"task_sampler": tasks.state(),
                "seed": cfg.seed}, "databases": [d.name for d in source.databases]}
        save_checkpoint(out_dir, at, params, opt_state, meta, keep=cfg.keep_checkpoints)

    def validate() -> dict[str, float]:
        res = {}
        for t in source.tasks:
            tot, n = 0.0, 0.0
            for i in range(cfg.val_batches):
                b = source.val_batch(t, i)
                if b is None:
                    break
                loss, w = trainer.eval_loss(params, shard_inputs(batch_to_inputs(b), mesh), *dev_tables[t.db_idx])
                tot += float(loss) * float(w)
                n += float(w)
            if n:
                res[f"val/{t.key}/loss"] = tot / n
        return res

    result = TrainResult(step=step, params=None, last_loss=None)
    window_cells, window_wait, window_t0 = 0, 0.0, time.perf_counter()
    window_losses: list[tuple[str, jax.Array]] = []  # device scalars, read at log time (no per-step sync)
    bar = _progress(progress, stop_at, step)
    try:
        while step < stop_at:
            micro, stypes = [], []
            for _ in range(cfg.grad_accum):
                t = tasks.next()
                t0 = time.perf_counter()
                batch = source.train_batch(t)
                window_wait += time.perf_counter() - t0
                window_cells += int((~batch.is_padding).sum())
                stypes.append(t.target_stype.label)
                micro.append((shard_inputs(batch_to_inputs(batch), mesh), *dev_tables[t.db_idx]))
            params, opt_state, m = trainer.step(params, opt_state, micro, step)
            step += 1
            window_losses.append((stypes[0] if len(set(stypes)) == 1 else "mixed", m.loss))
            scalars: dict[str, float] = {}
            if step % cfg.log_every == 0 or step == stop_at:
                loss = float(m.loss)
                elapsed = time.perf_counter() - window_t0
                per_type: dict[str, list[float]] = {}
                for st, v in window_losses:
                    per_type.setdefault(st, []).append(float(v))
                scalars = {f"train/loss_{st}": float(np.mean(v)) for st, v in sorted(per_type.items())}
                scalars |= {
                    "train/loss": loss, "train/null_loss": float(m.null_loss),
                    "train/type_loss": float(m.type_loss), "train/grad_norm": float(m.grad_norm),
                    "lr/muon": cfg.optim.lr_muon * float(m.lr_scale), "lr/adamw": cfg.optim.lr_adamw * float(m.lr_scale),
                    "perf/cells_per_s": window_cells / max(elapsed, 1e-9), "perf/sampler_wait_s": window_wait,
                    "perf/sampler_wait_frac": window_wait / max(elapsed, 1e-9),
                }
                result.history.append((step, loss))
                result.last_loss = loss
                log.write(step, scalars)
                window_cells, window_wait, window_t0 = 0, 0.0, time.perf_counter()
                window_losses = []
            if step % cfg.val_every == 0 or step == stop_at:
                val = validate()
                log.write(step, val)
                result.val_losses = val
                scalars.update(val)
            if step % cfg.ckpt_every == 0 or step == stop_at:
                checkpoint(step)
            if bar is not None:
                bar.update(step, result.last_loss)
            if on_step is not None:
                on_step(step, scalars)
    except KeyboardInterrupt:
        checkpoint(step)  # a user's Ctrl-C keeps everything done so far
        raise
    finally:
        log.close()
        if bar is not None:
            bar.close()
    result.step, result.params = step, params
    return result


class _Bar:
    def __init__(self, total: int, start: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[rate]:.2f} step/s loss {task.fields[loss]}"), TimeRemainingColumn())
        self.task = self.p.add_task("train", total=total, completed=start, rate=0.0, loss="-")
        self.t0, self.start = time.perf_counter(), start
        self.p.start()

    def update(self, step: int, loss: float | None) -> None:
        rate = (step - self.start) / max(time.perf_counter() - self.t0, 1e-9)
        self.p.update(self.task, completed=step, rate=rate, loss="-" if loss is None else f"{loss:.4f}")

    def close(self) -> None:
        self.p.stop()


def _progress(enabled: bool, total: int, start: int) -> _Bar | None:
    return _Bar(total, start) if enabled else None
