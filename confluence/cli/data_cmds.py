"""CLI commands of the preprocessing / store area: `confluence preprocess`, `confluence inspect`."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from confluence.cli.common import fail
from confluence.errors import ConfluenceError


def preprocess_cmd(
    source: str = typer.Argument(..., help="Raw database: Parquet/CSV directory, SQLite/DuckDB file, RelBench folder,"
                                 " or postgresql://[user@]host[:port]/db[?schema=NAME]."),
    metadata: Path = typer.Option(..., "--metadata", "-m", help="The reviewed metadata JSON file."),
    out: Path = typer.Option(..., "--out", "-o", help="Store directory to write (replaced atomically if present)."),
    text_encoder: str | None = typer.Option(None, "--text-encoder",
                                            help="Text encoder spec (default: the shipped model2vec encoder)."),
    embedding_cache: Path | None = typer.Option(None, "--embedding-cache",
                                                help="Directory of the embedding cache, reused across runs."),
    memory_limit_mb: int = typer.Option(2048, "--memory-limit-mb", min=128, help="Memory budget (batch size, DuckDB)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="DuckDB threads (default: all cores)."),
    no_validate: bool = typer.Option(False, "--no-validate", help="Skip checking the metadata against the data."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    strict: bool = typer.Option(False, "--strict", help="Make data warnings (NaN/inf read as NULL, dangling foreign"
                                " keys, empty tables) errors: exit 1, no store written."),
    dangling_keys: str = typer.Option("drop", "--dangling-keys", help="A foreign-key value matching no key: 'drop'"
                                      " its edge, or 'keep' it as a key-only row of the referenced table (rows"
                                      " sharing it stay siblings)."),
) -> None:
    """Preprocess a raw database into a processed store, then print its summary and any data warnings."""
    from confluence.preprocess import preprocess
    from confluence.sources.data_warnings import recorded
    from confluence.store import Store
    from confluence.store.inspect import print_summary

    cache = None
    if embedding_cache is not None:
        from confluence.textenc.cache import EmbeddingCache

        cache = EmbeddingCache(embedding_cache)
    start = time.perf_counter()
    found: list = []
    try:
        with recorded() as found:
            path = preprocess(source, metadata, out, text_encoder=text_encoder, embedding_cache=cache,
                              memory_limit_mb=memory_limit_mb, threads=threads, progress=not quiet,
                              validate=not no_validate, strict=strict, dangling_keys=dangling_keys)
        store = Store.open(path)
    except ConfluenceError as exc:
        _warnings(found)
        fail(exc)
    typer.echo(f"wrote {path} in {time.perf_counter() - start:.1f} s")
    print_summary(store)
    _warnings(found)


def _warnings(found: list) -> None:
    for w in found:
        typer.echo(f"warning: {w}", err=True)


def inspect_cmd(store_dir: Path = typer.Argument(..., help="A processed store directory.")) -> None:
    """Print a readable summary of a processed store: tables, columns per type, FK edges, tasks."""
    from confluence.store import Store
    from confluence.store.inspect import print_summary

    try:
        store = Store.open(store_dir)
    except ConfluenceError as exc:
        fail(exc)
    print_summary(store)


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add this area's commands to the `confluence` CLI."""
    app.command("preprocess")(preprocess_cmd)
    app.command("inspect")(inspect_cmd)
