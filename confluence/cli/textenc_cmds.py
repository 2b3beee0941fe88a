"""CLI of the text-encoder area: `confluence bench text-encoder` and `confluence text-encoder embed`."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def bench_text_encoder(
    n: int = typer.Option(200_000, "--n", min=1000, help="number of distinct short strings"),
    repeats: int = typer.Option(3, "--repeats", min=1, help="timed repetitions (best and median reported)"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the figures to this JSON file"),
) -> None:
    """Text-embedding throughput (strings/s) of the default encoder: 1 and 2 threads, cold and cached."""
    from rich.console import Console
    from rich.table import Table

    from confluence.textenc.bench import run

    console = Console()
    res = run(n=n, repeats=repeats, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    table = Table(title=f"text encoder throughput, {n:,} short strings ({res['words_min']}-{res['words_max']} "
                        f"words), {res['machine']}")
    table.add_column("what")
    table.add_column("strings/s (best)", justify="right")
    table.add_column("strings/s (median)", justify="right")
    table.add_column("strings per CPU-s", justify="right")
    rows = [(f"static_{k}_threads", f"StaticEncoder, {k} thread(s)") for k in (1, 2)] + [
        ("model2vec_encode_1_thread", "model2vec StaticModel.encode"),
        ("cached_cold", "encode_cached, cold (embed + write)"),
        ("cached_warm", "encode_cached, warm (open + all hits)"),
    ]
    for key, label in rows:
        if key in res:
            r = res[key]
            table.add_row(label, f"{r['best']:,.0f}", f"{r['median']:,.0f}", f"{r['per_cpu_s']:,.0f}")
    console.print(table)
    verdict = "meets" if res["meets_goal"] else "MISSES"
    console.print(f"goal {res['goal_strings_per_s']:,} strings/s (best wall-clock, 2 threads): {verdict}; "
                  f"1-min load average {res['loadavg_1min_start']:.1f} -> {res['loadavg_1min_end']:.1f}")
    if json_out is not None:
        json_out.write_text(json.dumps(res, indent=2) + "\n")
        console.print(f"wrote {json_out}")


def embed(
    texts: list[str] = typer.Argument(..., help="strings to embed"),
    encoder: str = typer.Option("default", "--text-encoder",
                                help="default | model2vec:DIR | sentence-transformers:DIR | lejepa:CHECKPOINT_DIR"),
) -> None:
    """Embed a few strings and print their pairwise cosine similarities (a quick look at an encoder)."""
    import numpy as np

    from confluence.errors import ConfluenceError
    from confluence.textenc.registry import load_encoder

    try:
        enc = load_encoder(encoder)
        vecs = enc.encode(texts)
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    norms = np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
    sims = (vecs / norms) @ (vecs / norms).T
    typer.echo(f"encoder: {enc.fingerprint} (dim {enc.dim})")
    for i, t in enumerate(texts):
        row = " ".join(f"{s:6.3f}" for s in sims[i])
        typer.echo(f"{row}  {t}")


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add this area's commands to the `confluence` CLI."""
    bench_app.command("text-encoder")(bench_text_encoder)
    textenc_app = typer.Typer(help="The frozen text encoder used by preprocessing.", no_args_is_help=True)
    textenc_app.command("embed")(embed)
    app.add_typer(textenc_app, name="text-encoder")
