"""CLI of the text-encoder area: `confluence text-encoder embed`."""

from __future__ import annotations

import typer


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
        raise typer.Exit(1) from None
    norms = np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
    sims = (vecs / norms) @ (vecs / norms).T
    typer.echo(f"encoder: {enc.fingerprint} (dim {enc.dim})")
    for i, t in enumerate(texts):
        row = " ".join(f"{s:6.3f}" for s in sims[i])
        typer.echo(f"{row}  {t}")


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add this area's commands to the `confluence` CLI."""
    textenc_app = typer.Typer(help="The frozen text encoder used by preprocessing.", no_args_is_help=True, rich_markup_mode=None)
    textenc_app.command("embed")(embed)
    app.add_typer(textenc_app, name="text-encoder")
