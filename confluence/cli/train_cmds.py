"""CLI of training: `confluence train`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import typer

from confluence.cli.common import fail
from confluence.errors import ConfluenceError


def run_config(config: str, sets: list[str], max_steps: int | None = None, budget: str | None = None):
    """The RunConfig of `--config` (a recipe or a file), `--set` overrides and `--max-steps` / `--budget` (one of
    them), in that order."""
    from confluence.toolkit.config import parse_sets
    from confluence.training.config import load_config

    if max_steps is not None and budget is not None:
        raise ConfluenceError("--max-steps and --budget both set the run's length: give one of them")
    cfg = load_config(config, parse_sets(sets))
    length = max_steps if max_steps is not None else budget
    return cfg if length is None else cfg.with_max_steps(length)


def describe_schedule(cfg) -> str:
    """One line saying how long the run is and what its learning-rate schedule does."""
    from confluence.training.budget import describe_length, is_resolved

    wsd = cfg.optim.schedule == "wsd"
    stop = ((f"; after {cfg.loop.patience} validations without improvement the rate decays from there and the run "
             f"ends where it does" if wsd else
             f"; stops after {cfg.loop.patience} validations without improvement") + ", keeping the best checkpoint"
            if cfg.loop.patience else "")
    decay = (f"held, then a linear decay over the last {cfg.optim.cooldown_fraction:.0%} of the run" if wsd else
             "cosine decay over the run")
    if not is_resolved(cfg.loop.max_steps):
        return f"run length {describe_length(cfg.loop.max_steps)}; learning rate: linear warmup, then {decay}{stop}"
    o = cfg.optim.for_run(cfg.loop.max_steps)
    then = (f"held until step {o.decay_start}, then a linear decay" if wsd else "then cosine decay")
    return (f"{cfg.loop.max_steps} steps; learning rate: linear warmup over {o.warmup_steps} steps, {then} "
            f"to {o.final_lr_fraction:g} x peak at step {o.total_steps}"
            + ("" if cfg.optim.total_steps is None else " (optim.total_steps is set: it does not follow the run)")
            + stop)


BUDGET_HELP = ("Run length as a time budget (\"10m\", \"1h30m\": the steps that fit, measured on this machine; the "
               "run also stops at the deadline) or \"auto\" (from the databases' tasks and training rows: the "
               "default of the small recipe). Instead of --max-steps.")


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        out: Path = typer.Option(..., "--out", help="Run directory (checkpoints, scalars.csv, config.json)."),
        config: str = typer.Option("small", "--config", help="Recipe (small, base, demo, ...) or a .toml / .json file."),
        db: list[Path] = typer.Option(..., "--db", metavar="STORE", help="Processed store directory; repeat for several databases."),
        max_steps: int | None = typer.Option(None, "--max-steps", min=1,
                                             help="Run length in steps (sets loop.max_steps; the schedule "
                                                  "follows). Default: the recipe's (small: auto, from the "
                                                  "databases, with early stopping)."),
        budget: str | None = typer.Option(None, "--budget", metavar="DURATION|auto", help=BUDGET_HELP),
        resume: bool = typer.Option(False, "--resume", help="Continue from the run directory's last checkpoint."),
        force: bool = typer.Option(False, "--force", help="Replace a run already in --out (deleted first)."),
        init_from: Path | None = typer.Option(None, "--init-from", help="Initialise parameters from a checkpoint."),
        heldout_db: list[Path] = typer.Option([], "--heldout-db", metavar="STORE",
                                              help="A database never trained on whose tasks' validation losses are "
                                                   "logged (heldout/...): transfer to a new database; repeatable."),
        set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a setting, e.g. --set optim.lr_adamw=1e-3."),
        coordinator: str | None = typer.Option(None, "--coordinator", help="Multi-host: coordinator host:port."),
        num_processes: int | None = typer.Option(None, "--num-processes", help="Multi-host: number of processes."),
        process_id: int | None = typer.Option(None, "--process-id", help="Multi-host: this process's index."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No console progress bar."),
    ) -> None:
        """Train (or fine-tune) the relational transformer on one or several processed stores."""
        import jax

        if coordinator is not None:  # before anything touches a JAX backend
            try:  # CPU-only hosts need a collectives backend; GPUs use NCCL regardless of this option
                jax.config.update("jax_cpu_collectives_implementation", "gloo")
            except (AttributeError, KeyError, ValueError):
                pass
            jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                       process_id=process_id)
        try:
            res = _run(run_config(config, set_, max_steps, budget), out, db, heldout_db, resume=resume, force=force,
                       init_from=init_from, no_progress=no_progress)
        except ConfluenceError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            _interrupted(out)
        _report(res, out)

    @app.command("train-links")
    def train_links_cmd(
        db: Path = typer.Option(..., "--db", metavar="STORE", help="Processed store holding the link task."),
        task: str = typer.Option(..., "--task", help="The link task (metadata `link_tasks`)."),
        out: Path = typer.Option(..., "--out", help="Run directory (its checkpoint and config.json)."),
        config: str = typer.Option("small", "--config", help="Recipe or .toml / .json file (its sampler, optimizer "
                                                             "and, without --init-from, model)."),
        steps: int = typer.Option(1000, "--steps", min=1, help="Training steps."),
        init_from: Path | None = typer.Option(None, "--init-from", help="Start the trunk from a checkpoint (a run of "
                                                                       "`train` on the same database, or "
                                                                       "pretrained:small); its model settings."),
        set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a setting."),
        force: bool = typer.Option(False, "--force", help="Replace a run already in --out."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress lines."),
    ) -> None:
        """Train the link head on a link task ("which rows will this row link to next?"): the rows of the target
        table that each context reaches are scored against the anchor's question (docs/guide/README.md, "Link
        tasks")."""
        from confluence.training.links import train_links

        said = _link_progress(steps, no_progress)
        try:
            path = train_links(db, task, out, run_config(config, set_), steps=steps, init_from=init_from,
                               force=force, on_step=said)
        except ConfluenceError as exc:
            fail(str(exc))
        typer.echo(f"trained the link head on {task} for {steps} steps; checkpoint {path}")

    @app.command("pretrain-links")
    def pretrain_links_cmd(
        out: Path = typer.Option(..., "--out", help="Run directory (its checkpoint and config.json)."),
        corpus: Path | None = typer.Option(None, "--corpus", help="Corpus directory (`confluence corpus build`): "
                                                                  "every link task of its train members."),
        db: list[Path] = typer.Option([], "--db", metavar="STORE", help="A processed store; repeat for several "
                                                                        "(instead of --corpus)."),
        config: str = typer.Option("small", "--config", help="Recipe or .toml / .json file (its sampler, optimizer "
                                                             "and, without --init-from, model)."),
        steps: int = typer.Option(1000, "--steps", min=1, help="Training steps."),
        init_from: Path | None = typer.Option(None, "--init-from", help="Start from a checkpoint (e.g. "
                                                                       "pretrained:small); its model settings."),
        set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a setting."),
        force: bool = typer.Option(False, "--force", help="Replace a run already in --out."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress lines."),
    ) -> None:
        """Pretrain the link head on every link task of many databases (a database drawn per step, then one of its
        link tasks); fine-tune the result with `train-links --init-from` (docs/guide/README.md, "Link tasks")."""
        from confluence.toolkit.compile_cache import use_compile_cache
        from confluence.training.links import pretrain_links

        said = _link_progress(steps, no_progress)
        try:
            if (corpus is None) == (not db):
                raise ConfluenceError("pretrain-links: give --corpus or --db (one of them)")
            if corpus is not None:
                from confluence.corpus import open_corpus

                db = list(open_corpus(corpus).train_stores)
            use_compile_cache()
            path = pretrain_links(db, out, run_config(config, set_), steps=steps, init_from=init_from, force=force,
                                  on_step=said)
        except ConfluenceError as exc:
            fail(str(exc))
        typer.echo(f"pretrained the link head on {len(db)} database(s) for {steps} steps; checkpoint {path}")

    @app.command("pretrain")
    def pretrain_cmd(
        corpus: Path = typer.Option(..., "--corpus", help="Corpus directory (`confluence corpus build`): trains on "
                                                          "its train members, validates on its held-out ones too."),
        out: Path = typer.Option(..., "--out", help="Run directory (checkpoints, scalars.csv, config.json)."),
        config: str = typer.Option("pretrain-small", "--config", help="Recipe (pretrain-small, pretrain-base) or a "
                                                                      ".toml / .json file."),
        max_steps: int | None = typer.Option(None, "--max-steps", min=1,
                                             help="Run length (sets loop.max_steps; the schedule follows)."),
        resume: bool = typer.Option(False, "--resume", help="Continue from the run directory's last checkpoint."),
        force: bool = typer.Option(False, "--force", help="Replace a run already in --out (deleted first)."),
        init_from: Path | None = typer.Option(None, "--init-from", help="Start from a checkpoint's parameters "
                                                                         "(e.g. pretrained:small, to continue it)."),
        set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a setting."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No console progress bar."),
    ) -> None:
        """Pretrain on a corpus of databases: database-first task sampling with labelled context (the recipe),
        validation losses of the corpus's held-out databases logged as heldout/... (docs/design/pretraining.md)."""
        try:
            from confluence.corpus import open_corpus

            found = open_corpus(corpus)
            if not found.train_stores:
                raise ConfluenceError(f"corpus {corpus}: no training member")
            res = _run(run_config(config, set_, max_steps), out, found.train_stores, found.heldout_stores,
                       resume=resume, force=force, init_from=init_from, no_progress=no_progress)
        except ConfluenceError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            _interrupted(out)
        _report(res, out)


def _link_progress(steps: int, quiet: bool) -> Callable[[int, float], None]:
    """The `on_step` of `train-links` / `pretrain-links`: every 50 steps (and the last) a line with the mean link
    loss of the last 50 and the seconds so far; nothing when `quiet`."""
    import time

    t0, losses = time.monotonic(), []

    def said(step: int, loss: float) -> None:
        losses.append(loss)
        if not quiet and (step % 50 == 0 or step == steps):
            window = losses[-50:]
            typer.echo(f"step {step}/{steps}: link loss {sum(window) / len(window):.4f} "
                       f"({time.monotonic() - t0:.0f} s)")

    return said


def _run(cfg, out: Path, db: list[Path], heldout_db: list[Path], *, resume: bool, force: bool,
         init_from: Path | None, no_progress: bool):
    """Open the stores and train (`train` / `pretrain`): a run directory is checked before any store is opened."""
    import jax

    from confluence.toolkit.checkpoint import latest_checkpoint, read_checkpoint
    from confluence.toolkit.compile_cache import use_compile_cache
    from confluence.toolkit.config import overlay
    from confluence.toolkit.progress import Phase
    from confluence.training.budget import is_resolved
    from confluence.training.config import RunConfig, describe_changes
    from confluence.training.loop import fit_max_k, open_heldout_stream, open_stream, prepare_run_dir, train

    use_compile_cache()  # a resumed or repeated run loads its compiled step (20-45 s of compiling) from disk
    main = jax.process_index() == 0
    if resume or not force:  # refuse before the stores are opened; --force deletes only in train()
        prepare_run_dir(out, resume=resume, force=False)
    if main:
        typer.echo(f"training: {describe_schedule(cfg)}"
                   + (f" on {len(db)} database(s), {len(heldout_db)} held out" if heldout_db else ""))
    with Phase("opening the training stores", f"{len(db)} database(s)", enabled=main, tick=not no_progress):
        stream = open_stream(db, cfg)
    held = None
    try:
        if heldout_db:
            with Phase("opening the held-out stores", f"{len(heldout_db)} database(s)", enabled=main,
                       tick=not no_progress):
                held = open_heldout_stream(heldout_db, cfg)
        fitted = fit_max_k(cfg, list(stream.stores) + (list(held.stores) if held is not None else []))
        if main and fitted.loss.max_k != cfg.loss.max_k:
            typer.echo(f"loss.max_k: {cfg.loss.max_k} -> {fitted.loss.max_k} (a categorical target has more classes "
                       "than the recipe pads to)")
        cfg = fitted
        if resume and main and latest_checkpoint(out) is not None:
            saved = RunConfig.from_dict(read_checkpoint(out, latest=True).meta.get("config", {}))
            now = cfg
            if not is_resolved(cfg.loop.max_steps):  # "auto" / a duration resumes with the length it was given
                now = overlay(cfg, {"loop": {"max_steps": saved.loop.max_steps, "val_every": saved.loop.val_every}})
            for line in describe_changes(saved, now):
                typer.echo(f"resume: setting changed since the checkpoint: {line}")
        return train(cfg, stream, out, resume=resume, init_from=init_from, progress=not no_progress, force=force,
                     heldout=held)
    finally:
        stream.close()
        if held is not None:
            held.close()


def _interrupted(out: Path) -> NoReturn:
    """Ctrl-C: say where the run stands and how to continue it; exit 130 (the shell's code for SIGINT)."""
    from confluence.toolkit.checkpoint import CheckpointError, latest_checkpoint, read_checkpoint

    try:
        step = read_checkpoint(out, latest=True).step if latest_checkpoint(out) is not None else None
    except CheckpointError:
        step = None
    if step is None:
        typer.echo(f"\nstopped (Ctrl-C) before the first checkpoint; nothing to resume in {out}", err=True)
    else:
        typer.echo(f"\nstopped (Ctrl-C); the run is saved at step {step} in {out}: run the same command with "
                   "--resume to continue it exactly where it stopped", err=True)
    raise typer.Exit(130)


def _report(res, out: Path) -> None:
    if res.last_loss is None and res.stopped_early:  # an early-stopped run resumed
        typer.echo(f"the run in {out} stopped early at step {res.step} (validation had stopped improving); its best "
                   f"checkpoint is step {res.best_step}. Nothing to train; to train on, start a new run with "
                   "--init-from or --set loop.patience=0")
        return
    if res.last_loss is None:  # no step ran: a finished run resumed
        typer.echo(f"the run in {out} is already at step {res.step}, its last step; nothing to train. To train "
                   "longer, resume it with a larger --max-steps (the schedule is stretched to it)")
        return
    typer.echo(f"trained to step {res.step}; last train loss {res.last_loss:.4f}; run directory {out}")
    if res.stopped_early or res.stopped_at_deadline:
        typer.echo("  stopped " + ("early: validation had stopped improving" if res.stopped_early else
                                   "at the time budget's deadline"))
    if res.best_step is not None:
        typer.echo(f"  best validation at step {res.best_step}: checkpoints/BEST, what evaluate / predict / serve "
                   "load from this run directory")
    for k, v in sorted(res.val_losses.items()):
        typer.echo(f"  {k}: {v:.4f}")
