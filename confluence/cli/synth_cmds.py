"""CLI commands of the synthetic databases: `confluence synth planted`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from confluence.errors import ConfluenceError


def planted_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write (raw/, planted.metadata.json, "
                                                      "ceilings.json, bayes/)."),
    seed: int = typer.Option(0, "--seed", help="Seed of every draw: the same seed writes the same bytes."),
    customers: int = typer.Option(1500, "--customers", min=1, help="Customers (the anchor table of most tasks)."),
    stores: int = typer.Option(30, "--stores", min=1),
    regions: int = typer.Option(6, "--regions", min=1),
    orders_per_customer: float = typer.Option(12.0, "--orders-per-customer", min=0.0,
                                              help="Mean orders per customer (gamma-distributed rates)."),
    noise: float = typer.Option(0.1, "--noise", min=0.0, max=0.99,
                                help="Share of targets redrawn at random (the ceiling accounts for it)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out."),
) -> None:
    """Write a planted-signal database: one task per kind of relational signal, each with its ceiling."""
    from confluence.synth.planted import PlantedSpec, write_planted

    try:
        spec = PlantedSpec(seed=seed, customers=customers, stores=stores, regions=regions,
                           orders_per_customer=orders_per_customer, noise=noise)
        path = write_planted(out, spec, overwrite=overwrite)
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    ceilings = json.loads((path / "ceilings.json").read_text(encoding="utf-8"))["tasks"]
    typer.echo(f"wrote {path}: raw/ (Parquet), planted.metadata.json, ceilings.json, bayes/")
    for task, c in ceilings.items():
        typer.echo(f"  {task:24s} {c['signal']:46s} {c['metric']} ceiling {c['ceiling']:.4g} ({c['n']} rows)")
    typer.echo(f"next: confluence preprocess {path / 'raw'} -m {path / 'planted.metadata.json'} -o STORE")


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add this area's commands to the `confluence` CLI."""
    synth_app = typer.Typer(help="Synthetic databases with known answers.", no_args_is_help=True)
    synth_app.command("planted")(planted_cmd)
    app.add_typer(synth_app, name="synth")
