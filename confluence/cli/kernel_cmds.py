"""CLI of the attention-kernel area: `confluence bench attention`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

GPU_SEQ_LENS = (1024, 2048, 4096)
CPU_SEQ_LENS = (128,)


def _end_to_end_training() -> dict[str, object]:
    """End-to-end training cells/s with and without the kernel, when the training area provides a benchmark."""
    import importlib.util

    if importlib.util.find_spec("confluence.training") is None:
        return {"available": False, "reason": "confluence.training is not installed in this checkout"}
    import confluence.training as training

    bench = getattr(training, "train_throughput", None)
    if bench is None:
        return {
            "available": False,
            "reason": "confluence.training provides no train_throughput(preset, attention_impl) benchmark yet",
        }
    out: dict[str, object] = {"available": True, "preset": "base"}
    for impl in ("reference", "block_sparse"):
        out[impl] = bench(preset="base", attention_impl=impl)
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
    train: Annotated[bool, typer.Option(help="Also measure end-to-end training cells/s.")] = True,
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
    report = run_attention_bench(cfg, log=typer.echo)
    report["end_to_end_training"] = (
        _end_to_end_training() if train else {"available": False, "reason": "--no-train"}
    )
    e2e = report["end_to_end_training"]
    typer.echo(
        f"end-to-end training: {e2e if e2e.get('available') else 'unavailable: ' + str(e2e['reason'])}"
    )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(as_numpy_report(report), indent=2))
        typer.echo(f"wrote {json_path}")


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add `confluence bench attention`."""
    del app, text_app
    bench_app.command("attention")(bench_attention)
