"""The training loop: batches from the one batch stream, jitted steps, validation per task, atomic checkpoints with
exact resumption, fine-tuning initialisation, scalar logs and a console progress bar."""

from __future__ import annotations

import json
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np
from rich.console import Console

from confluence import outputs
from confluence.errors import ConfluenceError
from confluence.model.inputs import DbTables, batch_to_inputs, fitted_max_k, pad_alike
from confluence.model.transformer import RelationalTransformer
from confluence.sampler.stream import BatchStream
from confluence.stypes import SemanticType
from confluence.toolkit.checkpoint import latest_checkpoint, load_state, read_checkpoint, save_checkpoint
from confluence.toolkit.config import overlay
from confluence.toolkit.interrupt import StepBoundaryInterrupt
from confluence.toolkit.logs import ScalarLog, plot_scalars
from confluence.toolkit.mesh import make_mesh, replicate
from confluence.toolkit.progress import Phase, StepBar
from confluence.toolkit.provenance import code_provenance
from confluence.training.budget import (
    AUTO,
    EarlyStop,
    auto_steps,
    is_resolved,
    parse_duration,
    steps_for_duration,
    task_anchor_counts,
    validation_interval,
)
from confluence.training.config import RunConfig
from confluence.training.step import get_trainer, shard_inputs
from confluence.training.validate import Validator, ValTask, scalar


@dataclass
class TrainResult:
    step: int
    params: Any
    last_loss: float | None
    val_losses: dict[str, float] = field(default_factory=dict)
    best_step: int | None = None  # early stopping: the best-validated step (its checkpoint is `checkpoints/BEST`)
    stopped_early: bool = False  # validation stopped improving before the last step
    stopped_at_deadline: bool = False  # a time budget ran out before the estimated steps were done
    history: list[tuple[int, float]] = field(default_factory=list)


def _check_stream(cfg: RunConfig, stream: BatchStream) -> None:
    if not stream.tasks:
        raise ConfluenceError("training: the stores have no tasks (does the metadata define any?)")
    for store in stream.stores:
        d_t = int(np.asarray(store.column_embeddings).shape[1])
        if d_t != cfg.model.d_t:
            raise ConfluenceError(f"database {store.name!r}: its embeddings have D_t={d_t} but the model config has "
                                  f"d_t={cfg.model.d_t}; set model.d_t to match the store")


def fit_max_k(cfg: RunConfig, stores: list[Any]) -> RunConfig:
    """`cfg` with `loss.max_k` widened (doubled) until every categorical target of `stores` fits, as evaluation
    widens it: a database whose target has more classes than the recipe pads to trains without a setting to edit,
    and the run's saved config holds the width it trained with."""
    k = fitted_max_k(cfg.loss.max_k, stores)
    return cfg if k == cfg.loss.max_k else replace(cfg, loss=replace(cfg.loss, max_k=k))


def start_params(cfg: RunConfig, init_from: Path | str, like: Any) -> Any:
    """Parameters of checkpoint `init_from` (a path or `pretrained:NAME`) shaped as `like`, this run's model: what
    `--init-from` starts a run from. Parts the checkpoint was made without (ADDED_PARTS) start from `like`; when the
    rest does not fit, the error names the model settings in which the checkpoint differs."""
    from dataclasses import fields

    from confluence.toolkit.checkpoint import CheckpointError

    _warn_input_shift(cfg, init_from)
    try:
        params, _ = load_state(init_from, like)
        return params
    except CheckpointError as exc:
        saved = RunConfig.from_dict(read_checkpoint(init_from).meta.get("config", {})).model
        added = tuple(name for name in ADDED_PARTS if has_part(cfg.model, name) and not has_part(saved, name))
        if added:
            # a checkpoint made without some added parts (the copy head, the recency-rank rows, the time reference):
            # when every other parameter fits (settings that shape no parameter, such as copy_numbers, may differ),
            # it loads, and the added ones start from this run's initialisation
            try:
                off = {name: type(getattr(cfg.model, name))() for name in added}  # False, or () for the sinks
                return _graft_added(replace(cfg.model, **off), added, init_from, like)
            except CheckpointError:
                pass
        diffs = [f"model.{f.name} = {getattr(saved, f.name)!r} there, {getattr(cfg.model, f.name)!r} here"
                 for f in fields(saved) if getattr(saved, f.name) != getattr(cfg.model, f.name)]
        if not diffs:
            raise
        raise ConfluenceError(f"--init-from {init_from}: its model does not fit this run's ({'; '.join(diffs)}); "
                              "use a recipe with the same model settings or --set them") from exc


# model settings that shape no parameter but change what every cell's input is (the codes added to the name and
# value embeddings when the tables are built): a checkpoint made with other values loads, its inputs shifted
INPUT_SETTINGS = ("category_codes", "column_codes")


def _warn_input_shift(cfg: RunConfig, init_from: Path | str) -> None:
    """Warn when `init_from` was trained with other input codes than this run's (fine-tuning then starts from a
    model whose every column or category input moved: it adapts, but a user should know and can --set them)."""
    saved = RunConfig.from_dict(read_checkpoint(init_from).meta.get("config", {})).model
    diffs = [f"model.{n} = {getattr(saved, n)!r} there, {getattr(cfg.model, n)!r} here" for n in INPUT_SETTINGS
             if getattr(saved, n) != getattr(cfg.model, n)]
    if diffs:
        warnings.warn(f"--init-from {init_from} was trained with other input codes ({'; '.join(diffs)}): its "
                      "inputs shift and fine-tuning has to adapt to them; --set them to the checkpoint's values to "
                      "fine-tune on the inputs it was trained with", stacklevel=3)


# model settings that only add parameters (a checkpoint without them loads into a model with them): the setting ->
# where its parameters live in the model
ADDED_PARTS: dict[str, Callable[[Any], Any]] = {
    "copy_head": lambda m: m.copy,
    "link_head": lambda m: m.link,
    "child_rank": lambda m: m.encoder.child_rank_emb,
    "arrival": lambda m: (m.encoder.arrival_weight, m.encoder.arrival_emb),
    "time_reference": lambda m: m.time_ref,
    "time_wait": lambda m: m.time_ref.wait,
    "attention_sink": lambda m: tuple(getattr(b, a).sink for b in m.blocks for a in ("attn_out", "attn_in", "attn_col")),
}
# added parts that live inside another: a model has them only where that one is on too
PART_OF = {"time_wait": "time_reference"}


def has_part(model: Any, name: str) -> bool:
    """Whether a model of these settings (`ModelConfig`) has the parameters of the added part `name`."""
    return bool(getattr(model, name)) and (name not in PART_OF or has_part(model, PART_OF[name]))


def _graft_added(saved_model: Any, added: tuple[str, ...], init_from: Path | str, like: Any) -> Any:
    """`like` (this run's initial parameters) with every parameter but those of the `added` settings from
    `init_from`, a checkpoint whose parameters are those of `saved_model` (this run's model without them);
    CheckpointError when they are not."""
    import equinox as eqx

    from confluence.training.step import is_param

    skeleton = eqx.partition(RelationalTransformer(saved_model, key=jax.random.key(0)), is_param)[0]
    loaded, _ = load_state(init_from, skeleton)
    for name in added:
        loaded = eqx.tree_at(ADDED_PARTS[name], loaded, ADDED_PARTS[name](like), is_leaf=lambda x: x is None)
    # the same leaves in this run's tree (whose static settings, e.g. the model config, are this run's)
    return jax.tree.unflatten(jax.tree.structure(like), jax.tree.leaves(loaded))


def saved_position(meta: dict[str, Any]) -> dict[str, Any]:
    """The stream position a checkpoint holds (also of checkpoints written before the batch stream existed)."""
    if "stream" in meta:
        return meta["stream"]
    return {"tasks": meta["rng"]["task_sampler"], "streams": meta["pipeline"]}


# what a training run writes into its directory (`--force` removes exactly these)
RUN_FILES = ("checkpoints", "scalars.csv", "scalars.png", "tensorboard", "config.json")


def is_legacy_run(out_dir: Path) -> bool:
    """A training run written before output markers: nothing but a run's files (`RUN_FILES`), a checkpoint among
    them."""
    names = {p.name for p in out_dir.iterdir()}
    return names <= set(RUN_FILES) | {outputs.MARKER_FILE} and "checkpoints" in names


def describe_run(out_dir: Path) -> str | None:
    """What training run `out_dir` holds ("checkpoint at step N", "a training log"), or None when it holds none."""
    ck = latest_checkpoint(out_dir)
    if ck is not None:
        return f"checkpoint at step {read_checkpoint(out_dir, latest=True).step}"
    present = [n for n in RUN_FILES if (out_dir / n).exists()]
    return f"{', '.join(present)} without a checkpoint" if present else None


def prepare_run_dir(out_dir: Path, *, resume: bool, force: bool, kind: str = "run") -> None:
    """Check that training may write `out_dir` (see `train`), delete a replaced run when `force`, create it and
    mark it as a run. A directory holding anything but a run (a user's files) is refused, `force` or not."""
    state = outputs.claim(out_dir, kind, legacy=is_legacy_run)
    existing = describe_run(out_dir) if state == "ours" else None
    if resume:
        if latest_checkpoint(out_dir) is None:
            has = f"; it holds {existing}" if existing else ("" if out_dir.is_dir() else "; it does not exist")
            raise ConfluenceError(f"--resume: {out_dir} has no checkpoint to resume from{has}. Start a new run "
                                  "without --resume (add --force to replace what is there)")
    elif existing is not None:
        if not force:
            raise ConfluenceError(f"{out_dir} already holds a training run ({existing}); nothing was changed. "
                                  "Continue it with --resume, replace it with --force, or choose another --out")
        remove_run_files(out_dir)
    with outputs.writing(out_dir, "the training run"):
        outputs.mark(out_dir, kind)


def remove_run_files(out_dir: Path) -> None:
    """Delete the files a training run writes in `out_dir` (`RUN_FILES`), nothing else."""
    for name in RUN_FILES:
        target = out_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def train(
    cfg: RunConfig,
    stream: BatchStream,
    out_dir: Path,
    *,
    resume: bool = False,
    init_from: Path | None = None,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    force: bool = False,
    heldout: BatchStream | None = None,
) -> TrainResult:
    """Train until `cfg.loop.max_steps` on `stream`'s training batches. `resume` continues the run's last checkpoint
    exactly (same batches, same schedule position); `init_from` starts from another run's parameters.
    `on_step(step, scalars)` is called after every step. `heldout` (`open_heldout_stream`): databases the run never
    trains on, whose tasks' validation losses are logged beside the training databases' (`heldout/<db>/<task>/loss`
    and their mean `heldout/loss`): how well what is learnt transfers to a new database (pretraining).

    A directory that already holds a run is never overwritten silently: without `resume` it is an error unless
    `force` (which deletes that run first); `resume` without a checkpoint to resume is an error too."""
    out_dir = Path(out_dir)
    # one writer per run directory (process 0 writes it): a second `train` into it stops here, naming the first
    lock = outputs.OutputLock(out_dir, "trained") if jax.process_index() == 0 else None
    if lock is not None:
        with outputs.writing(out_dir, "the training run"):
            lock.acquire()
    try:
        return _train(cfg, stream, out_dir, resume=resume, init_from=init_from, mesh=mesh, progress=progress,
                      on_step=on_step, force=force, heldout=heldout)
    finally:
        if lock is not None:
            lock.release()


def _train(cfg: RunConfig, stream: BatchStream, out_dir: Path, *, resume: bool, init_from: Path | None,
           mesh: jax.sharding.Mesh | None, progress: bool, on_step: Callable[[int, dict[str, float]], None] | None,
           force: bool, heldout: BatchStream | None) -> TrainResult:
    """`train`'s body, run while holding the run directory's lock."""
    _check_stream(cfg, stream)  # bad input is refused before --force deletes anything
    if heldout is not None:
        _check_stream(cfg, heldout)
        clash = sorted({s.name for s in heldout.stores} & {s.name for s in stream.stores})
        if clash:
            raise ConfluenceError(f"held-out database(s) {clash} are also training databases: a held-out loss "
                                  "would not measure transfer")
    cfg = fit_max_k(cfg, list(stream.stores) + (list(heldout.stores) if heldout is not None else []))
    t_start = time.monotonic()
    prepare_run_dir(out_dir, resume=resume, force=force)
    mesh = mesh or make_mesh()
    main = jax.process_index() == 0  # only process 0 writes the run directory (logs, config, checkpoints)
    console = Console(file=sys.stdout)  # the phases' lines and the step bar share it (on a terminal, above the bar)
    saved_meta = read_checkpoint(out_dir, latest=True).meta if resume else {}
    cfg, duration, said = resolve_length(cfg, stream, saved_meta.get("config"))
    if main and said:
        console.print(said)
    loop = cfg.loop
    stop_at = loop.max_steps
    deadline = None if duration is None else t_start + duration
    early = EarlyStop.from_meta(loop.patience, saved_meta.get("early_stop"), loop.min_delta)
    cooldown = cooldown_record(saved_meta, out_dir)  # a "wsd" run cooling down since it stalled: how to resume it
    if cooldown is not None:
        cfg = cooled(cfg, cooldown["run_steps"], cooldown["at"])
        loop, stop_at = cfg.loop, cfg.loop.max_steps

    def phase(what: str, detail: str = "") -> Phase:
        """A line when a long wait before or between steps starts and ends (compiling, validating), whatever
        `progress`; with `progress`, a line every 10 s while it lasts."""
        return Phase(what, detail, console=console, enabled=main, tick=progress)

    source = ("" if not (resume or init_from) else
              f", then the parameters of {'the checkpoint to resume' if resume else init_from}")
    layers = f"{cfg.model.n_layers} layer" + ("s" if cfg.model.n_layers != 1 else "")
    with phase("initialising the model", f"{layers}, d_model {cfg.model.d_model}{source}"):
        model = RelationalTransformer(cfg.model, key=jax.random.key(cfg.seed))
        trainer = get_trainer(cfg.model, cfg.optim.for_run(loop.max_steps), cfg.loss)
        params, opt_state = trainer.init_state(model)
        step = 0
        if resume:
            ck = read_checkpoint(out_dir, latest=True)
            saved = RunConfig.from_dict(ck.meta.get("config", {}))
            if saved.model != cfg.model:
                raise ConfluenceError(f"--resume: the checkpoint {ck.path} was trained with another model config")
            params, opt_state = load_state(ck.path, params, opt_state)
            step = ck.step
            stream.restore(saved_position(ck.meta))
        elif init_from is not None:
            params = start_params(cfg, init_from, params)
    if main:
        (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))

    params, opt_state = replicate(params, mesh), replicate(opt_state, mesh)
    # every database's tables padded to one shape: the step compiles once, not once per table-size bucket
    all_stores = list(stream.stores) + (list(heldout.stores) if heldout is not None else [])
    tables = pad_alike([DbTables.for_model(s, cfg.loss.max_k, cfg.model) for s in all_stores])
    on_device = [replicate((t.column_embeddings, t.categorical_embeddings), mesh) for t in tables]
    dev_tables, held_tables = on_device[: len(stream.stores)], on_device[len(stream.stores):]
    log = ScalarLog(out_dir / "scalars.csv" if main else None, truncate_after_step=step if resume else None)

    saved_at = -1  # the step last checkpointed
    code = code_provenance()  # read once: the code this process imported at its start


    def checkpoint(at: int, best: bool = False) -> None:
        nonlocal saved_at
        meta = {"config": cfg.to_dict(), "stream": stream.position(), "databases": [s.name for s in stream.stores],
                "heldout_databases": [s.name for s in heldout.stores] if heldout is not None else [], "code": code}
        if loop.patience:
            meta["early_stop"] = early.to_meta()
        if cooldown is not None:
            meta["cooldown"] = cooldown
        save_checkpoint(out_dir, at, params, opt_state, meta, keep=loop.keep_checkpoints, best=best)
        saved_at = at

    def validated(at: int, val: dict[str, float]) -> None:
        """Early stopping's bookkeeping after a validation: the best one's checkpoint is kept (the untrained
        model's, at step 0, is only the reference the later ones are measured against)."""
        if loop.patience and early.update(at, val) and at > 0:
            checkpoint(at, best=True)

    train_val = val_subset(len(stream.stores), loop.val_databases)
    val_tasks = [ValTask(stream, dev_tables[e.db_idx], "val", e) for e in stream.tasks
                 if train_val is None or e.db_idx in train_val]
    val_tasks += [ValTask(heldout, held_tables[e.db_idx], "heldout", e)
                  for e in (heldout.tasks if heldout is not None else [])]
    validator = Validator(trainer, val_tasks, loop.val_batches, mesh)

    def validate(what: str) -> dict[str, float]:
        """The validation losses of every validated task (`val/...`, `heldout/...` and their mean), said as a
        phase (`what`): the first validation compiles the loss for each batch shape it meets."""
        batches = f"{loop.val_batches} batch" + ("es" if loop.val_batches != 1 else "")
        with phase(what, f"{len(val_tasks)} tasks, {batches} each") as ph:
            return validator(params, lambda i, t: setattr(ph, "status", f"{i}/{len(val_tasks)} tasks done, now "
                                                                         f"{t.entry.key}"))

    def draw() -> tuple[list[tuple[dict, Any, Any]], list[str], float, int]:
        """The next update's micro-batches, their target types, the seconds spent waiting for them, their cells."""
        micro, stypes, wait, cells = [], [], 0.0, 0
        for _ in range(loop.grad_accum):
            t0 = time.perf_counter()
            batch = stream.next_train()
            wait += time.perf_counter() - t0
            cells += int((~batch.is_padding).sum())
            stypes.append(SemanticType(int(batch.target_stype)).label)
            micro.append((shard_inputs(batch_to_inputs(batch), mesh), *dev_tables[batch.db_idx]))
        return micro, stypes, wait, cells

    result = TrainResult(step=step, params=None, last_loss=None)
    window_cells, window_wait, window_t0 = 0, 0.0, time.perf_counter()
    window_losses: list[tuple[str, jax.Array]] = []  # device scalars, read at log time (no per-step sync)
    # The first update's batches come before the baseline validation (which reads its own seeds: no batch changes),
    # so that a step that cannot fit the device stops here, with the settings to change, before any step runs.
    compiled: set[tuple] = set()  # the batch shapes whose step is compiled (each row / text bucket compiles once)
    try:
        first = draw() if step < stop_at else None
        if first is not None:
            with phase("compiling the training step", _shape_words(first[0]) + "; once per batch shape"):
                trainer.check_memory(params, opt_state, first[0])
            compiled.add(_shape_key(first[0]))
    except BaseException:
        log.close()
        if main and not resume:  # a new run that never stepped leaves nothing: the same --out can be used again
            remove_run_files(out_dir)
            (out_dir / outputs.MARKER_FILE).unlink(missing_ok=True)
        raise
    if step == 0 and stop_at > 0:  # the untrained model's validation loss, as a baseline
        t_val = time.perf_counter()
        val0 = validate("validating the untrained model")
        t_val = time.perf_counter() - t_val
        log.write(0, val0)
        if duration is not None and first is not None:  # a time budget: the steps that fit, measured here
            with phase("measuring the training step", "for the time budget"):
                step_s = trainer.time_steps(params, opt_state, first[0])
            steps = steps_for_duration(duration - (time.monotonic() - t_start), step_s, t_val, loop.val_every)
            cfg = cfg.with_max_steps(steps)
            cfg = overlay(cfg, {"loop": {"val_every": validation_interval(steps, loop.val_every)}})
            loop, stop_at = cfg.loop, steps
            if main:
                console.print(f"run length: {steps} steps fit the time budget ({step_s * 1e3:.0f} ms a step, "
                              f"{t_val:.1f} s a validation); validating every {loop.val_every} steps")
                (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
            trainer = get_trainer(cfg.model, cfg.optim.for_run(steps), cfg.loss)
            with phase("compiling the training step for the run's schedule", _shape_words(first[0])):
                trainer.check_memory(params, opt_state, first[0])
            compiled = {_shape_key(first[0])}
        validated(0, val0)
    bar = StepBar(stop_at, step, console=console) if progress and main else None
    if early.should_stop and not decaying(cfg, step):  # a run that stopped early, resumed: nothing left to train
        stop_at = step
        result.stopped_early, result.best_step = True, early.best_step
    try:
        with StepBoundaryInterrupt() as stop:  # Ctrl-C stops after the step in flight (toolkit/interrupt.py)
            while step < stop_at:
                micro, stypes, wait, cells = first if first is not None else draw()
                first = None
                window_wait, window_cells = window_wait + wait, window_cells + cells
                if _shape_key(micro) in compiled:
                    params, opt_state, m = trainer.step(params, opt_state, micro, step)
                else:  # a batch of a row / text bucket not met before: its step compiles now
                    with phase("compiling the training step for another batch shape", _shape_words(micro)):
                        params, opt_state, m = trainer.step(params, opt_state, micro, step)
                    compiled.add(_shape_key(micro))
                step += 1
                if deadline is not None and step < stop_at and time.monotonic() >= deadline:
                    stop_at = step  # the time budget is spent: validate and checkpoint this step, then stop
                    result.stopped_at_deadline = True
                window_losses.append((stypes[0] if len(set(stypes)) == 1 else "mixed", m.loss))
                scalars: dict[str, float] = {}
                if step % loop.log_every == 0 or step == stop_at:
                    loss = scalar(m.loss)
                    elapsed = time.perf_counter() - window_t0
                    per_type: dict[str, list[float]] = {}
                    for st, v in window_losses:
                        per_type.setdefault(st, []).append(scalar(v))
                    scalars = {f"train/loss_{st}": float(np.mean(v)) for st, v in sorted(per_type.items())}
                    scalars |= {
                        "train/loss": loss, "train/null_loss": scalar(m.null_loss),
                        "train/type_loss": scalar(m.type_loss), "train/grad_norm": scalar(m.grad_norm),
                        "lr/muon": cfg.optim.lr_muon * scalar(m.lr_scale), "lr/adamw": cfg.optim.lr_adamw * scalar(m.lr_scale),
                        "perf/cells_per_s": window_cells / max(elapsed, 1e-9), "perf/sampler_wait_s": window_wait,
                        "perf/sampler_wait_frac": window_wait / max(elapsed, 1e-9),
                    }
                    result.history.append((step, loss))
                    result.last_loss = loss
                    log.write(step, scalars)
                    window_cells, window_wait, window_t0 = 0, 0.0, time.perf_counter()
                    window_losses = []
                if step % loop.val_every == 0 or step == stop_at:
                    val = validate(f"validating at step {step}")
                    log.write(step, val)
                    result.val_losses = val
                    scalars.update(val)
                    validated(step, val)
                    if early.should_stop and step < stop_at and cfg.optim.schedule == "wsd" \
                            and not decaying(cfg, step):  # stopped improving at the peak rate: cool down from here
                        cooldown = {"at": step, "run_steps": loop.max_steps}
                        cfg = cooled(cfg, loop.max_steps, step)
                        loop, stop_at = cfg.loop, min(stop_at, cfg.loop.max_steps)
                        trainer, compiled = get_trainer(cfg.model, cfg.optim, cfg.loss), set()
                        result.stopped_early = True
                        if bar is not None:
                            bar.retotal(stop_at)
                        if main:
                            (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
                            console.print(f"validation has not improved for {early.since_best} validations "
                                          f"(the best at step {early.best_step}): the learning rate decays from "
                                          f"here to step {stop_at}, where the run ends")
                    elif early.should_stop and step < stop_at and not decaying(cfg, step):
                        stop_at = step  # validation stopped improving: checkpoint this step and stop
                        result.stopped_early = True
                        if main:
                            console.print(f"early stop at step {step}: validation has not improved for "
                                          f"{early.since_best} validations; the best was at step "
                                          f"{early.best_step} (checkpoints/BEST)")
                if step % loop.ckpt_every == 0 or step == stop_at:
                    checkpoint(step)
                if bar is not None:
                    bar.update(step, result.last_loss)
                if on_step is not None:
                    on_step(step, scalars)
                if stop.requested:
                    if saved_at != step:
                        checkpoint(step)
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        if saved_at != step:  # a user's Ctrl-C keeps everything done so far
            try:
                checkpoint(step)
            except RuntimeError as exc:  # a second Ctrl-C inside a step: its donated state is gone
                warnings.warn(f"no checkpoint at step {step} ({exc}); the last one written stands", stacklevel=2)
        raise
    finally:
        log.close()
        if bar is not None:
            bar.close()
    if main and (out_dir / "scalars.csv").is_file():
        try:
            plot_scalars(out_dir / "scalars.csv", out_dir / "scalars.png")
        except (OSError, ValueError) as exc:  # a picture of the log must not fail a finished run
            warnings.warn(f"{out_dir / 'scalars.png'}: not drawn ({exc})", stacklevel=2)
    result.step, result.params = step, params
    if loop.patience and early.best_step >= 0:
        result.best_step = early.best_step
    return result


def decaying(cfg: RunConfig, step: int) -> bool:
    """Whether a run of `cfg` (its length resolved) is in its "wsd" schedule's decay at `step`: early stopping
    waits for the decay's end, where the rate is low enough for the validation loss to settle."""
    if cfg.optim.schedule != "wsd":
        return False
    return step >= (cfg.optim.for_run(cfg.loop.max_steps).decay_start or 0)


def cooldown_record(meta: dict[str, Any], out_dir: Path) -> dict[str, int] | None:
    """The checkpoint's record of where its run's decay started (`{"at", "run_steps"}`), checked: None for a run
    that never cooled down; a ConfluenceError naming the run when the record is damaged."""
    rec = meta.get("cooldown")
    if rec is None:
        return None
    try:
        at, run_steps = int(rec["at"]), int(rec["run_steps"])
    except (KeyError, TypeError, ValueError):
        raise ConfluenceError(f"{out_dir}: the latest checkpoint's cooldown record is damaged ({rec!r}); "
                              f"resume from an earlier checkpoint or train again with --force") from None
    if not 0 <= at < run_steps:
        raise ConfluenceError(f"{out_dir}: the latest checkpoint's cooldown record is damaged (the decay starts at "
                              f"step {at} of a {run_steps}-step run); resume from an earlier checkpoint or train "
                              f"again with --force")
    return {"at": at, "run_steps": run_steps}


def cooled(cfg: RunConfig, run_steps: int, at: int) -> RunConfig:
    """`cfg`, a "wsd" run of `run_steps` steps, cooling down from step `at` (`OptimConfig.cooled_down`): its rate
    decays from there and the run ends where the decay does. Its schedule is resolved, so a resume keeps it."""
    optim = cfg.optim.for_run(run_steps).cooled_down(at)
    return replace(cfg, optim=optim, loop=replace(cfg.loop, max_steps=optim.total_steps))


def resolve_length(cfg: RunConfig, stream: BatchStream,
                   saved: dict[str, Any] | None) -> tuple[RunConfig, float | None, str | None]:
    """`cfg` with its run length as a step count, the time budget in seconds when the length is a duration (the
    steps are then measured after the first validation; until then the `"auto"` count stands in), and a line
    saying what was chosen (None: nothing to say). A resumed run (`saved`: its checkpoint's config) keeps the
    length it was given when it started, whatever `"auto"` or a duration would say now."""
    length = cfg.loop.max_steps
    if is_resolved(length):
        return cfg, None, None
    if saved is not None:
        old = RunConfig.from_dict(saved).loop
        return overlay(cfg, {"loop": {"max_steps": old.max_steps, "val_every": old.val_every}}), None, None
    counts = task_anchor_counts(stream)
    steps = auto_steps(counts, cfg.sampler.batch_size)
    if length != AUTO:  # the validation interval follows the measured step count, not this stand-in
        return overlay(cfg, {"loop": {"max_steps": steps}}), parse_duration(str(length)), None
    cfg = overlay(cfg, {"loop": {"max_steps": steps, "val_every": validation_interval(steps, cfg.loop.val_every)}})
    return cfg, None, (f"run length: {steps} steps, from the databases ({len(counts)} tasks, "
                       f"{sum(counts.values()):,} training anchors); validating every {cfg.loop.val_every} steps"
                       + (f", stopping after {cfg.loop.patience} validations without improvement"
                          if cfg.loop.patience else ""))


def _shape_key(micro: list[tuple[dict, Any, Any]]) -> tuple:
    """What decides whether a step compiles again: the shapes of its micro-batches' inputs and tables."""
    return tuple((k, tuple(v.shape)) for inputs, *tabs in micro for k, v in [*sorted(inputs.items()),
                                                                            *enumerate(tabs)])


def _shape_words(micro: list[tuple[dict, Any, Any]]) -> str:
    """A step's batch shape in words: "16 sequences of 1024 cells, up to 32 rows each, 64 texts per batch"."""
    inputs = micro[0][0]
    b, s = inputs["is_padding"].shape[:2]
    rows, texts = inputs["fk_adj"].shape[-1], inputs["text_batch_embeddings"].shape[0]
    return f"{b} sequences of {s} cells, up to {rows} rows each, {texts} texts per batch" + (
        f", {len(micro)} micro-batches" if len(micro) > 1 else "")


def open_heldout_stream(paths: list[Path], cfg: RunConfig) -> BatchStream:
    """A stream over held-out databases for `train(heldout=...)`: the run's sampler settings, but every task of
    those databases (the run's task list and weights name its training databases' tasks)."""
    return BatchStream.open(paths, replace(cfg.sampler, tasks=None, task_weights=None), seed=cfg.seed,
                            rank=jax.process_index(), world_size=jax.process_count())


def val_subset(n: int, k: int) -> set[int] | None:
    """The training databases a run validates on: `k` of `n`, evenly spaced (None: all, when k is 0 or >= n)."""
    if k <= 0 or k >= n:
        return None
    return {i * n // k for i in range(k)}


def open_stream(paths: list[Path], cfg: RunConfig) -> BatchStream:
    """The training stream of a run over processed stores: this process's share of `cfg.sampler.batch_size`,
    seeded by the run's seed; per-task settings must name tasks of the stores."""
    stream = BatchStream.open(paths, cfg.sampler, seed=cfg.seed, rank=jax.process_index(),
                              world_size=jax.process_count())
    try:
        stream.check_task_keys()
    except ConfluenceError:
        stream.close()
        raise
    return stream
