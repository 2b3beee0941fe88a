"""`confluence text ...`: the LeJEPA text base model (seed 003): corpus, prepare, train, embed, probe."""

from __future__ import annotations

from pathlib import Path

import typer

from confluence.cli.common import fail
from confluence.errors import ConfluenceError


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Register the text-model commands on the `text` sub-app."""

    @text_app.command("corpus")
    def corpus_cmd(out: Path = typer.Argument(..., help="Parquet file to write (columns text, package)")) -> None:
        """Write the offline corpus: Python standard-library docstrings labelled by package."""
        from confluence.textmodel.corpus import write_stdlib_corpus

        try:
            path = write_stdlib_corpus(out)
        except ConfluenceError as exc:
            fail(exc)
        import pyarrow.parquet as pq

        typer.echo(f"wrote {pq.read_metadata(path).num_rows} docstrings to {path}")

    @text_app.command("prepare")
    def prepare_cmd(
        corpus: Path = typer.Argument(..., help="text file, directory of text files, Parquet file, or processed store"),
        out: Path = typer.Option(..., "--out", help="output data directory (must not exist)"),
        max_seq_len: int = typer.Option(64, help="tokens per sample, EOS included"),
        vocab_size: int = typer.Option(4096, help="BPE vocabulary size when training a tokenizer"),
        tokenizer: Path | None = typer.Option(None, help="use this tokenizers JSON file instead of training one"),
        column: str | None = typer.Option(None, help="text column of a Parquet corpus"),
        source: Path | None = typer.Option(None, help="raw database of a store corpus (to read its text cells)"),
        shard_size: int = typer.Option(65536, help="samples per .npy shard"),
    ) -> None:
        """Tokenize a corpus into fixed-length .npy shards plus meta.json and tokenizer.json."""
        from confluence.textmodel.data import prepare_corpus

        try:
            m = prepare_corpus(corpus, out, max_seq_len=max_seq_len, vocab_size=vocab_size, tokenizer=tokenizer,
                               column=column, source=source, shard_size=shard_size)
        except ConfluenceError as exc:
            fail(exc)
        typer.echo(f"{m.num_documents} documents -> {m.num_samples} samples x {m.max_seq_len} tokens "
                   f"({m.num_tokens} tokens, vocab {m.vocab_size}) in {out}")

    @text_app.command("train")
    def train_cmd(
        data: Path = typer.Option(..., "--data", help="prepared data directory"),
        out: Path = typer.Option(..., "--out", help="run directory (resumed when it holds checkpoints)"),
        config: str = typer.Option("text-smoke", "--config", help="text-tiny | text-smoke | text-base or a file"),
        max_train_steps: int | None = typer.Option(None, "--max-train-steps", min=1,
                                                   help="stop after this many steps (default: one epoch)"),
        set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="override a setting, e.g. --set model.attn_type=rope"),
    ) -> None:
        """Train the LeJEPA text model (one epoch or --max-train-steps); resumes from the newest checkpoint."""
        from confluence.textmodel.config import load_text_config
        from confluence.textmodel.data import read_meta
        from confluence.textmodel.train import train_text
        from confluence.toolkit.config import merge, parse_sets

        try:
            meta = read_meta(data)
            sets = parse_sets(set_)
            if max_train_steps is not None:
                sets = merge(sets, {"max_train_steps": max_train_steps})
            cfg = load_text_config(config, meta.vocab_size, meta.max_seq_len, sets)

            def show(row: dict) -> None:
                parts = " ".join(f"{k}={v:.4g}" for k, v in row.items() if k not in ("step", "seconds"))
                typer.echo(f"step {row['step']:>6} [{row['seconds']:.1f}s] {parts}")

            res = train_text(data, out, cfg, progress=show)
        except ConfluenceError as exc:
            fail(exc)
        typer.echo(f"trained to step {res.steps} in {res.seconds:.1f}s; checkpoints in {res.run_dir / 'checkpoints'}")

    @text_app.command("embed")
    def embed_cmd(
        run: Path = typer.Argument(..., help="run or checkpoint directory"),
        texts: list[str] = typer.Argument(..., help="texts to embed"),
        out: Path | None = typer.Option(None, help="write float32 [n, D_t] here (.npy) instead of printing"),
    ) -> None:
        """Embed texts with a trained checkpoint (the frozen-encoder path preprocessing uses)."""
        import numpy as np

        from confluence.textmodel.encoder import load_lejepa_encoder

        try:
            enc = load_lejepa_encoder(run)
        except ConfluenceError as exc:
            fail(exc)
        emb = enc.encode(texts)
        if out is not None:
            np.save(out, emb)
            typer.echo(f"wrote {emb.shape} embeddings ({enc.fingerprint}) to {out}")
        else:
            for t, e in zip(texts, emb, strict=True):
                typer.echo(f"{t[:40]!r}: [{', '.join(f'{x:.3f}' for x in e[:6])}, ...] (dim {len(e)})")

    @text_app.command("curves")
    def curves_cmd(
        run: Path = typer.Argument(..., help="run directory"),
        out: Path = typer.Option(..., "--out", help="PNG to write"),
    ) -> None:
        """Plot the training curve of every logged loss term of a run."""
        from confluence.textmodel.report import plot_curves

        try:
            typer.echo(f"wrote {plot_curves(run, out)}")
        except ConfluenceError as exc:
            fail(exc)

    @text_app.command("probe")
    def probe_cmd(
        corpus: Path = typer.Argument(..., help="Parquet file with columns text and package (`text corpus`)"),
        encoders: list[str] = typer.Option(..., "--encoder", metavar="ENCODER", help="run dir, 'random:RUN', 'tfidf' or a registry spec"),
        max_docs: int = typer.Option(3000, help="docs used (largest packages first)"),
        min_per_class: int = typer.Option(40, help="Keep classes with at least this many examples."),
    ) -> None:
        """Linear probe (package classification) and nearest-neighbour retrieval with each encoder's embeddings."""
        from confluence.textenc.probe import run_probe

        try:
            rows = run_probe(corpus, encoders, max_docs=max_docs, min_per_class=min_per_class)
        except ConfluenceError as exc:
            fail(exc)
        r0 = rows[0]
        typer.echo(f"{r0['num_classes']} packages, {r0['num_train']} train / {r0['num_test']} test documents")
        typer.echo(f"{'encoder':<40} {'dim':>5} {'probe acc':>10} {'kNN@1':>8} {'MRR':>7}")
        for r in rows:
            typer.echo(f"{r['encoder']:<40} {r['dim']:>5} {r['probe_acc']:>10.4f} {r['knn1']:>8.4f} {r['mrr']:>7.4f}")
