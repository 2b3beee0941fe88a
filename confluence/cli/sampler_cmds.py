"""CLI of the sampler area: `confluence sample show`."""

from __future__ import annotations

from pathlib import Path

import typer

sample_app = typer.Typer(help="Look at what the sampler builds.", no_args_is_help=True)


def show(
    db: Path = typer.Option(..., "--db", help="processed store directory"),
    task: str = typer.Option(..., "--task", help="task name"),
    seed_index: int = typer.Option(0, "--seed-index", help="index of the seed within the task"),
    config: str | None = typer.Option(None, "--config",
                                      help="build contexts with this recipe / file's sampler settings"),
    set_: list[str] = typer.Option([], "--set", help="override a sampler setting, e.g. --set sampler.recent=16"),
    seed: int = typer.Option(0, "--seed", help="sampling seed"),
    epoch: int = typer.Option(0, "--epoch"),
    max_cells: int = typer.Option(200, "--max-cells", help="print at most this many cells"),
) -> None:
    """Print one sequence: its rows, cells and the three attention masks, as the model sees them. Without --config
    the sampler's defaults (S = 1024, width 16); `--config demo` shows the demo's contexts."""
    import numpy as np
    from rich.console import Console

    from confluence.cli.train_cmds import run_config
    from confluence.errors import ConfluenceError
    from confluence.sampler.config import SamplerConfig
    from confluence.sampler.data import SamplerData
    from confluence.sampler.sampler import Sampler
    from confluence.sampler.show import render_sequence
    from confluence.store import Store
    from confluence.toolkit.config import overlay, parse_sets

    try:
        if config is not None:
            sconf = run_config(config, set_).sampler
        else:
            sets = parse_sets(set_)
            sconf = overlay(SamplerConfig(), sets.get("sampler", {}), "sampler")
        data = SamplerData.from_store(Store.open(db))
        sampler = Sampler([data], overlay(sconf, {"batch_size": 1, "tasks": None}), seed=seed)
        res = sampler.build(task, np.array([seed_index]), epoch=epoch)
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    Console(highlight=False).print(render_sequence(res, data, 0, task_name=task, max_cells=max_cells), markup=False)


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add `sample show`."""
    sample_app.command("show")(show)
    app.add_typer(sample_app, name="sample")
