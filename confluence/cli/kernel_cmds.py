"""CLI of the attention-kernel area: `confluence bench attention`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

GPU_SEQ_LENS = (1024, 2048, 4096)
CPU_SEQ_LENS = (128,)


def _end_to_end_training(preset: str, steps: int) -> dict[str, object]:
    """Training cells/s of `preset` with the reference attention and with the kernel (the training area's bench)."""
    from confluence.model.kernels.bench import train_throughput

    out: dict[str, object] = {"available": True, "preset": preset, "steps": steps}
    for impl in ("reference", "block_sparse"):
        r = train_throughput(preset, impl, steps)
        out[impl] = r
        typer.echo(
            f"train {preset} attention_impl={impl}: {r['cells_per_s']:.4g} cells/s "
            f"({r['real_cells_per_s']:.4g} non-padding), step {1e3 * r['step_s']:.1f} ms, compile {r['compile_s']:.1f} s"
        )
    ref, ker = out["reference"], out["block_sparse"]
    out["speedup"] = ker["cells_per_s"] / ref["cells_per_s"]  # type: ignore[index]
    return out


def bench_attention(
    seq_len: Annotated[
        list[int] | None,
        typer.Option(
            "--seq-len",
            "-s",
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
    repeats: Annotated[
        int | None, typer.Option(help="Timed runs per measurement (median). Default 10 GPU, 2 CPU.")
    ] = None,
    kind: Annotated[
        list[str] | None, typer.Option("--kind", help="Sublayer kinds (repeatable). Default: all three.")
    ] = None,
    impl: Annotated[
        list[str] | None,
        typer.Option(
            "--impl",
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
    train: Annotated[bool, typer.Option(help="Also measure end-to-end training cells/s.")] = True,
    train_preset: Annotated[
        str | None,
        typer.Option(help="Training preset for the end-to-end figure. Default: base on a GPU, small on CPU."),
    ] = None,
    train_steps: Annotated[int, typer.Option(help="Timed training steps per attention implementation.")] = 5,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the full report as JSON here.")
    ] = None,
) -> None:
    """Forward and forward+backward time per sublayer type: block-sparse kernel vs reference vs dense-masked SDPA."""
    import jax

    from confluence.model.attention import MASK_KINDS
    from confluence.model.kernels.bench import (
        IMPLEMENTATIONS,
        AttentionBenchConfig,
        as_numpy_report,
        run_attention_bench,
    )

    on_gpu = jax.default_backend() == "gpu"
    kinds = tuple(kind or MASK_KINDS)
    impls = tuple(impl or (IMPLEMENTATIONS if on_gpu else IMPLEMENTATIONS[:3]))
    for name, values, allowed in (("--kind", kinds, MASK_KINDS), ("--impl", impls, IMPLEMENTATIONS)):
        bad = [x for x in values if x not in allowed]
        if bad:
            raise typer.BadParameter(f"{name} {bad[0]!r} is not one of {', '.join(allowed)}")
    cfg = AttentionBenchConfig(
        seq_lens=tuple(seq_len or (GPU_SEQ_LENS if on_gpu else CPU_SEQ_LENS)),
        batch_size=batch_size if batch_size is not None else (None if on_gpu else 2),
        heads=heads if heads is not None else (8 if on_gpu else 2),
        head_dim=head_dim,
        block=block,
        repeats=repeats if repeats is not None else (10 if on_gpu else 2),
        kinds=kinds,
        implementations=() if stats_only else impls,
    )
    if not on_gpu:
        typer.echo(
            "note: no GPU; the kernel runs in the Pallas interpreter, so its times are not speed figures"
        )
    if store is not None:
        from confluence.errors import ConfluenceError
        from confluence.model.kernels.bench import sampler_source

        try:
            source, source_name = sampler_source(str(store), task, cfg.seed)
        except (ConfluenceError, FileNotFoundError) as exc:
            raise typer.BadParameter(f"--store {store}: {exc}") from exc
        report = run_attention_bench(cfg, source, source_name, log=typer.echo)
    else:
        report = run_attention_bench(cfg, log=typer.echo)
    if train and not stats_only:
        preset = train_preset or ("base" if on_gpu else "small")
        report["end_to_end_training"] = _end_to_end_training(preset, train_steps)
        typer.echo(
            f"end-to-end training speedup with the kernel: x{report['end_to_end_training']['speedup']:.2f}"
        )
    else:
        report["end_to_end_training"] = {
            "available": False,
            "reason": "not requested (--no-train or --stats-only)",
        }
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(as_numpy_report(report), indent=2))
        typer.echo(f"wrote {json_path}")


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add `confluence bench attention`."""
    del app, text_app
    bench_app.command("attention")(bench_attention)
