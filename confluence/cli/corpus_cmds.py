"""CLI commands of pretraining corpora: `confluence corpus build` and `confluence corpus show`."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from confluence.cli.common import fail
from confluence.errors import ConfluenceError


def build_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Corpus directory (corpus.json, raw/, stores/); an existing "
                                                      "one of the same settings is finished or grown."),
    databases: int = typer.Option(..., "--databases", "-n", help="Random databases (seeds seed .. seed+N-1)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the first random database."),
    rows: float = typer.Option(1.0, "--rows", help="Scale of every table's row count (1.0: about 30-3,000 rows)."),
    heldout: float = typer.Option(0.1, "--heldout", help="Share of the random databases held out for validation "
                                                         "(at least one when N >= 2; 0: none)."),
    tpch: list[float] = typer.Option([], "--tpch", metavar="SF", help="Add TPC-H at this scale factor (repeatable; train; needs "
                                                        "tpchgen-cli, the 'bench' extra)."),
    database: list[str] = typer.Option([], "--database", metavar="METADATA=SOURCE",
                                       help="Add a database of your own (repeatable; train): its reviewed metadata "
                                            "file, '=', and its source as `confluence preprocess` reads it."),
    workers: int = typer.Option(1, "--workers", "-j", help="Members built at once, each in its own process."),
    text_encoder: str | None = typer.Option(None, "--text-encoder",
                                            help="Text encoder spec (default: the shipped model2vec encoder)."),
    embedding_cache: Path | None = typer.Option(None, "--embedding-cache",
                                                help="Directory of the embedding cache, shared by the workers."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete a corpus of other settings in --out and "
                                                              "build this one."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar or lines."),
) -> None:
    """Build a pretraining corpus: random databases (and TPC-H) generated and preprocessed into stores, in
    parallel; resumable (complete members are skipped); deterministic (the same settings write the same bytes)."""
    from confluence.corpus import build_corpus

    start = time.perf_counter()
    try:
        extra = [_split_database(d) for d in database]
        corpus = build_corpus(out, databases, seed=seed, rows=rows, heldout=heldout, tpch=tpch, extra=extra,
                              workers=workers,
                              encoder=text_encoder, embedding_cache=embedding_cache, overwrite=overwrite,
                              progress=not no_progress)
    except ConfluenceError as exc:
        fail(exc)
    warned = sum(len(w) for w in corpus.warnings.values())
    typer.echo(f"built {len(corpus.built)}, skipped {len(corpus.skipped)} (already complete) of "
               f"{len(corpus.members)} member(s) in {time.perf_counter() - start:.1f} s: {out}")
    typer.echo(f"  {len(corpus.train_stores)} train store(s), {len(corpus.heldout_stores)} held-out")
    if warned:
        typer.echo(f"  {warned} data warning(s) in the members built: the generator plants dangling foreign keys")
    typer.echo(f"next: confluence corpus show {out}")


def _split_database(arg: str) -> tuple[str, str]:
    """`METADATA=SOURCE` split at its first '=' (a ConfluenceError naming the argument when either part is
    missing)."""
    from confluence.corpus import CorpusError

    metadata, sep, source = arg.partition("=")
    if not sep or not metadata.strip() or not source.strip():
        raise CorpusError(f"--database {arg!r}: expected METADATA=SOURCE (the metadata file, '=', the raw source)")
    return metadata.strip(), source.strip()


def show_cmd(corpus_dir: Path = typer.Argument(..., help="A corpus directory (what `corpus build` wrote).")) -> None:
    """Print a corpus's spec and one line per member: role, tables, rows, tasks, link tasks (- while not built)."""
    from confluence.corpus import open_corpus
    from confluence.corpus.build import describe

    try:
        corpus = open_corpus(corpus_dir, require_complete=False)
        rows = describe(corpus)
    except ConfluenceError as exc:
        fail(exc)
    s = corpus.spec
    tpch = f", TPC-H at {', '.join(f'{x:g}' for x in s.tpch)}" if s.tpch else ""
    tpch += f", {len(s.extra)} database(s) of your own" if s.extra else ""
    typer.echo(f"corpus {corpus_dir}: {s.databases} random database(s) (seed {s.seed}, rows {s.rows:g}, heldout "
               f"{s.heldout:g}){tpch}")
    typer.echo(f"text encoder: {s.encoder.get('fingerprint')}")
    typer.echo(f"{'member':16s} {'role':8s} {'tables':>6s} {'rows':>10s} {'tasks':>5s} {'links':>5s}")
    for r in rows:
        cells = ["-" if r[k] is None else str(r[k]) for k in ("tables", "rows", "tasks", "link_tasks")]
        typer.echo(f"{r['member']:16s} {r['role']:8s} {cells[0]:>6s} {cells[1]:>10s} {cells[2]:>5s} {cells[3]:>5s}")
    missing = len(corpus.incomplete)
    links = sum(r["link_tasks"] or 0 for r in rows)
    typer.echo(f"{len(rows) - missing} of {len(rows)} member(s) built; {links} link task(s) in "
               f"{sum(1 for r in rows if r['link_tasks'])} of them (`confluence pretrain-links`)"
               + (f"; finish with: confluence corpus build --out {corpus_dir} ..." if missing else ""))


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add this area's commands to the `confluence` CLI."""
    corpus_app = typer.Typer(help="Pretraining corpora: many databases preprocessed offline.", no_args_is_help=True,
                             rich_markup_mode=None)
    corpus_app.command("build")(build_cmd)
    corpus_app.command("show")(show_cmd)
    app.add_typer(corpus_app, name="corpus")
