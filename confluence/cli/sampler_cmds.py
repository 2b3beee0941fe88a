"""CLI of the sampler area: `confluence sample show`."""

from __future__ import annotations

from pathlib import Path

import typer

sample_app = typer.Typer(help="Look at what the sampler builds.", no_args_is_help=True, rich_markup_mode=None)


def show(
    db: Path = typer.Option(..., "--db", help="processed store directory"),
    task: str = typer.Option(..., "--task", help="task name"),
    seed_index: int = typer.Option(0, "--seed-index", help="index of the seed within the task"),
    checkpoint: Path | None = typer.Option(None, "--checkpoint",
                                           help="show the contexts of this run (its sampler settings and seed)"),
    config: str | None = typer.Option(None, "--config",
                                      help="build contexts with this recipe / file's sampler settings "
                                           "(default: small, what `confluence train` uses)"),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="override a sampler setting, e.g. --set sampler.recent=16"),
    seed: int | None = typer.Option(None, "--seed", help="sampling seed (default: the run's / recipe's)"),
    epoch: int = typer.Option(0, "--epoch", help="pass over the data (contexts are re-drawn each epoch)"),
    max_cells: int = typer.Option(200, "--max-cells", help="print at most this many cells"),
    raw: bool = typer.Option(False, "--raw", help="show the model's inputs (z-scores, row indices) only"),
    phase: str = typer.Option("train", "--phase",
                              help="with labelled context (sampler.labels): the phase whose labels the context may "
                                   "show: train, val, test or all"),
) -> None:
    """Print one sequence: its rows (by primary key), cells (values as in the data, model inputs beside) and the
    three attention masks, as the model sees them: `--checkpoint RUN` as that run was trained, `--config R` as
    recipe R would build them (default: small, the recipe `confluence train` uses)."""
    import numpy as np
    from rich.console import Console

    from confluence.cli.train_cmds import run_config
    from confluence.errors import ConfluenceError
    from confluence.sampler.sampler import Sampler
    from confluence.sampler.show import render_sequence
    from confluence.store import Store
    from confluence.toolkit.config import overlay, parse_sets

    try:
        if checkpoint is not None and config is not None:
            raise ConfluenceError("give --checkpoint (a run's settings) or --config (a recipe's), not both")
        if checkpoint is not None:
            from confluence.toolkit.checkpoint import read_checkpoint
            from confluence.training.config import RunConfig

            cfg = RunConfig.from_dict(read_checkpoint(checkpoint).meta.get("config", {}))
            sconf = overlay(cfg.sampler, parse_sets(set_).get("sampler", {}), "sampler")
        else:
            cfg = run_config(config or "small", set_)
            sconf = cfg.sampler
        store = Store.open(db)
        store.task(task)  # a clear error naming the store's tasks
        # recency ranks are printed whatever the model reads (they change no other cell of the batch)
        sampler = Sampler([store], overlay(sconf, {"batch_size": 1, "tasks": None, "child_rank": True}),
                          seed=cfg.seed if seed is None else seed)
        data = sampler.data[0]
        res = sampler.build(task, np.array([seed_index]), epoch=epoch, context=phase)
        text = render_sequence(res, data, 0, task_name=task, max_cells=max_cells, store=None if raw else store)
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    Console(highlight=False).print(text, markup=False, soft_wrap=True)  # long lines stay whole in a log


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add `sample show`."""
    sample_app.command("show")(show)
    app.add_typer(sample_app, name="sample")
