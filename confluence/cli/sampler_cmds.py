"""CLI of the sampler area: `confluence sample show` and `confluence bench sampler`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

sample_app = typer.Typer(help="Look at what the sampler builds.", no_args_is_help=True)


def _open(db: Path):
    from confluence.errors import ConfluenceError
    from confluence.sampler.data import SamplerData
    from confluence.store import Store

    try:
        return SamplerData.from_store(Store.open(db))
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _config(**kw):
    from confluence.errors import ConfluenceError
    from confluence.sampler.config import SamplerConfig

    cfg = SamplerConfig(**kw)
    try:
        cfg.check()
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    return cfg


def show(
    db: Path = typer.Option(..., "--db", help="processed store directory"),
    task: str = typer.Option(..., "--task", help="task name"),
    seed_index: int = typer.Option(0, "--seed-index", help="index of the seed within the task"),
    seq_len: int = typer.Option(1024, "--seq-len"),
    width: int = typer.Option(16, "--width"),
    recent: int = typer.Option(0, "--recent", help="of the `width` children, keep this many latest ones"),
    per_fk: bool = typer.Option(False, "--per-fk", help="`width` children per child foreign-key column, not per row"),
    child_counts: str = typer.Option("none", "--child-counts",
                                     help="none | anchor | all: rows that also show how many rows referenced them"),
    max_rows: int = typer.Option(256, "--max-rows"),
    seed: int = typer.Option(0, "--seed", help="sampling seed"),
    epoch: int = typer.Option(0, "--epoch"),
    max_cells: int = typer.Option(200, "--max-cells", help="print at most this many cells"),
) -> None:
    """Print one sequence: its rows, cells and the three attention masks, as the model sees them."""
    import numpy as np
    from rich.console import Console

    from confluence.errors import ConfluenceError
    from confluence.sampler.sampler import Sampler
    from confluence.sampler.show import render_sequence

    data = _open(db)
    cfg = _config(batch_size=1, seq_len=seq_len, width=width, recent=recent, width_per_fk=per_fk, max_rows=max_rows,
                  child_counts=child_counts, seed=seed)
    try:
        res = Sampler([data], cfg).build(task, np.array([seed_index]), epoch=epoch)
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    Console(highlight=False).print(render_sequence(res, data, 0, task_name=task, max_cells=max_cells), markup=False)


def bench_sampler(
    db: Path = typer.Option(..., "--db", help="processed store directory"),
    threads: int = typer.Option(1, "--threads"),
    batch_size: int = typer.Option(32, "--batch-size"),
    seq_len: int = typer.Option(1024, "--seq-len"),
    width: int = typer.Option(16, "--width"),
    recent: int = typer.Option(0, "--recent", help="of the `width` children, keep this many latest ones"),
    per_fk: bool = typer.Option(False, "--per-fk", help="`width` children per child foreign-key column, not per row"),
    child_counts: str = typer.Option("none", "--child-counts",
                                     help="none | anchor | all: rows that also show how many rows referenced them"),
    max_rows: int = typer.Option(256, "--max-rows"),
    batches: int = typer.Option(50, "--batches", help="timed batches"),
    task: list[str] = typer.Option(None, "--task", help="restrict to these tasks (repeatable)"),
    json_out: Path = typer.Option(None, "--json", help="write the figures to this JSON file"),
) -> None:
    """Measure sequences/s, real cells/s and padded slots/s with a per-phase breakdown."""
    from confluence.sampler.bench import run_bench

    data = _open(db)
    cfg = _config(batch_size=batch_size, seq_len=seq_len, width=width, recent=recent, width_per_fk=per_fk,
                  child_counts=child_counts, max_rows=max_rows, threads=threads, tasks=tuple(task) if task else None)
    res = run_bench(data, cfg, batches=batches)
    typer.echo(
        f"{res['database']}: {res['sequences_per_s']:,.0f} sequences/s, {res['cells_per_s']:,.0f} real cells/s, "
        f"{res['slots_per_s']:,.0f} slots/s ({threads} thread(s), B={batch_size}, S={seq_len}, w={width}, "
        f"{res['mean_real_cells_per_sequence']:.0f} real cells/sequence, mean R {res['mean_padded_rows']:.0f})"
    )
    if threads > 1:
        typer.echo(f"  (whole batches built {threads} at a time: phase seconds are summed over overlapping builds, "
                   f"so the shares add up to about {100 * threads} %)")
    for k, v in res["phases"].items():
        typer.echo(f"  {k:<13s} {v['seconds']:8.3f} s  {100 * v['share']:5.1f} %  {v['cpu_us_per_sequence']:6.1f} µs CPU/sequence")
    if json_out:
        json_out.write_text(json.dumps(res, indent=2))
        typer.echo(f"wrote {json_out}")


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add `sample show` and `bench sampler`."""
    sample_app.command("show")(show)
    app.add_typer(sample_app, name="sample")
    bench_app.command("sampler")(bench_sampler)
