"""CLI commands of the synthetic databases: `confluence synth planted`, `confluence synth planted-links` and
`confluence synth random`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from confluence.cli.common import fail
from confluence.errors import ConfluenceError

if TYPE_CHECKING:
    from confluence.synth.random_db import RandomSpec


def planted_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write (raw/, planted.metadata.json, "
                                                      "ceilings.json, bayes/)."),
    seed: int = typer.Option(0, "--seed", help="Seed of every draw: the same seed writes the same bytes."),
    customers: int = typer.Option(1500, "--customers", min=1, help="Customers (the anchor table of most tasks)."),
    stores: int = typer.Option(30, "--stores", min=1, help="Stores (each customer's parent)."),
    regions: int = typer.Option(6, "--regions", min=1, help="Regions (each store's parent)."),
    orders_per_customer: float = typer.Option(12.0, "--orders-per-customer", min=0.0,
                                              help="Mean orders per customer (gamma-distributed rates)."),
    noise: float = typer.Option(0.1, "--noise", min=0.0, max=0.99,
                                help="Share of targets redrawn at random (the ceiling accounts for it)."),
    couriers: int = typer.Option(0, "--couriers", min=0, help="Couriers of the orders, with the root causes "
                                 "orders.handling and orders.handover (0: none)."),
    visits: bool = typer.Option(False, "--visits", help="Visits over decades of dates, with the root cause "
                                "customer_next_visit (a \"when next\" time)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out."),
) -> None:
    """Write a planted-signal database: one task per kind of relational signal, each with its ceiling."""
    from confluence.synth.planted import PlantedSpec, write_planted

    try:
        spec = PlantedSpec(seed=seed, customers=customers, stores=stores, regions=regions,
                           orders_per_customer=orders_per_customer, noise=noise, couriers=couriers,
                           visits=visits)
        path = write_planted(out, spec, overwrite=overwrite)
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    ceilings = json.loads((path / "ceilings.json").read_text(encoding="utf-8"))["tasks"]
    typer.echo(f"wrote {path}: raw/ (Parquet), planted.metadata.json, ceilings.json, bayes/")
    for task, c in ceilings.items():
        typer.echo(f"  {task:24s} {c['signal']:46s} {c['metric']} ceiling {c['ceiling']:.4g} ({c['n']} rows)")
    typer.echo(f"next: confluence preprocess {path / 'raw'} -m {path / 'planted.metadata.json'} -o STORE")


def planted_links_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write (raw/, planted_links.metadata.json, "
                                                      "ceilings.json, oracle/)."),
    seed: int = typer.Option(0, "--seed", help="Seed of every draw: the same seed writes the same bytes."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out."),
) -> None:
    """Write a planted link database: users, items and interactions with four link tasks (repeat, co-occurrence,
    attribute match, trend), each with its ceiling."""
    from confluence.synth.planted_links import PlantedLinksSpec, write_planted_links

    try:
        path = write_planted_links(out, PlantedLinksSpec(seed=seed), overwrite=overwrite)
    except ConfluenceError as exc:
        fail(str(exc))
    ceilings = json.loads((path / "ceilings.json").read_text(encoding="utf-8"))["tasks"]
    typer.echo(f"wrote {path}: raw/ (Parquet), planted_links.metadata.json, ceilings.json, oracle/")
    for task, c in ceilings.items():
        typer.echo(f"  {task:16s} {c['metric']} ceiling {c['ceiling']:.3f} on {c['n']} test seeds "
                   f"({c['ceiling_val']:.3f} on {c['n_val']} validation seeds)")
    typer.echo(f"next: confluence preprocess {path / 'raw'} -m {path / 'planted_links.metadata.json'} -o STORE")


def random_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write (raw/, random.metadata.json, spec.json); "
                                                      "with --count, the folder of db_00000, db_00001, ..."),
    seed: int = typer.Option(0, "--seed", help="Seed of every draw (with --count, of the first database): the same "
                                               "seed writes the same bytes."),
    count: int | None = typer.Option(None, "--count", help="Write this many databases, seeds seed .. seed+N-1, as "
                                                           "OUT/db_00000 ...; complete ones are skipped (resumable)."),
    tables: int | None = typer.Option(None, "--tables", help="Number of tables (default: drawn in 2..15)."),
    topology: str | None = typer.Option(None, "--topology", help="star, chain, snowflake or random (default: drawn)."),
    rows: float = typer.Option(1.0, "--rows", help="Scale of every table's row count (1.0: about 30-3,000 rows)."),
    link_signal: float = typer.Option(0.7, "--link-signal", help="Probability that a temporal table's key to a "
                                                                 "second parent is drawn with link signals (repeat, "
                                                                 "affinity); 0: popularity alone."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output (with --count: every one)."),
) -> None:
    """Write random relational databases for pretraining: random schemas, values from a random causal model that
    flows along foreign keys and through time, cell-masking, derived and link tasks."""
    from confluence.synth.random_db import RandomSpec, write_random

    try:
        spec = RandomSpec(seed=seed, tables=tables, topology=topology, rows=rows, link_signal=link_signal)
        if count is not None and count < 1:
            raise ConfluenceError(f"--count must be at least 1, got {count}")
        if count is None:
            path = write_random(out, spec, overwrite=overwrite)
        else:
            written, skipped = _write_many(out, spec, count, overwrite)
    except ConfluenceError as exc:
        fail(str(exc))
    if count is not None:
        typer.echo(f"wrote {written} random database(s) under {out} ({skipped} already complete, skipped)")
        typer.echo(f"next: confluence preprocess {out / 'db_00000' / 'raw'} -m "
                   f"{out / 'db_00000' / 'random.metadata.json'} -o STORE")
        return
    drawn = json.loads((path / "spec.json").read_text(encoding="utf-8"))
    tasks = drawn["tasks"]
    typer.echo(f"wrote {path}: raw/ (Parquet), random.metadata.json, spec.json")
    typer.echo(f"  {drawn['topology']}, {len(drawn['tables'])} tables, {len(drawn['foreign_keys'])} foreign keys, "
               f"{sum(t['rows'] for t in drawn['tables'].values())} rows; tasks: "
               f"{sum(v == 'cell' for v in tasks.values())} cell masking, {sum(v == 'derived' for v in tasks.values())} "
               f"derived, {sum(v == 'link' for v in tasks.values())} link")
    typer.echo(f"next: confluence preprocess {path / 'raw'} -m {path / 'random.metadata.json'} -o STORE")


def _write_many(out: Path, spec: RandomSpec, count: int, overwrite: bool) -> tuple[int, int]:
    """OUT/db_00000 .. of seeds spec.seed ..; a complete one (atomic_dir: present means complete) is skipped when
    its spec.json records the same spec, and refused when it records another."""
    import dataclasses

    from confluence.preprocess.progress import Reporter
    from confluence.synth.random_db import SPEC_FILE, write_random

    if out.exists() and not out.is_dir():
        raise ConfluenceError(f"{out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    written = skipped = 0
    with Reporter(enabled=True) as progress:
        progress.step("random databases", count)
        for i in range(count):
            one = dataclasses.replace(spec, seed=spec.seed + i)
            path = out / f"db_{i:05d}"
            if path.exists() and not overwrite:
                try:
                    have = json.loads((path / SPEC_FILE).read_text(encoding="utf-8"))["spec"]
                except (OSError, ValueError, KeyError):
                    raise ConfluenceError(f"{path}: exists but holds no {SPEC_FILE} of a random database; remove it "
                                          "or pass --overwrite") from None
                if have != dataclasses.asdict(one):
                    raise ConfluenceError(f"{path}: holds a database of another spec (seed {have.get('seed')}); "
                                          "choose another --out, the same settings, or pass --overwrite")
                skipped += 1
            else:
                write_random(path, one, overwrite=overwrite)
                written += 1
            progress.advance(1)
    return written, skipped


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add this area's commands to the `confluence` CLI."""
    synth_app = typer.Typer(help="Synthetic databases with known answers.", no_args_is_help=True, rich_markup_mode=None)
    synth_app.command("planted")(planted_cmd)
    synth_app.command("planted-links")(planted_links_cmd)
    synth_app.command("random")(random_cmd)
    app.add_typer(synth_app, name="synth")
