"""CLI of the model / training area: `confluence train` and `confluence bench train`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from confluence.errors import ConfluenceError


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=2)


def _overrides(sets: list[str]) -> dict:
    """`--set a.b=VALUE` (VALUE parsed as JSON when possible) -> nested dict."""
    out: dict = {}
    for item in sets:
        if "=" not in item:
            _fail(f"--set {item!r}: expected KEY=VALUE (e.g. model.n_layers=4)")
        key, raw = item.split("=", 1)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        out: Path = typer.Option(..., "--out", help="Run directory (checkpoints, scalars.csv, config.json)."),
        config: str = typer.Option("small", "--config", help="Preset (small, base) or a .json / .toml file."),
        db: list[Path] = typer.Option([], "--db", help="Processed store directory; repeat for several databases."),
        synthetic: int = typer.Option(0, "--synthetic", help="Train on N synthetic databases instead of --db."),
        max_steps: int | None = typer.Option(None, "--max-steps", help="Stop after this many steps in total."),
        resume: bool = typer.Option(False, "--resume", help="Continue from the run directory's last checkpoint."),
        init_from: Path | None = typer.Option(None, "--init-from", help="Initialise parameters from a checkpoint."),
        set_: list[str] = typer.Option([], "--set", help="Override a config field, e.g. --set optim.lr_adamw=1e-3."),
        coordinator: str | None = typer.Option(None, "--coordinator", help="Multi-host: coordinator host:port."),
        num_processes: int | None = typer.Option(None, "--num-processes", help="Multi-host: number of processes."),
        process_id: int | None = typer.Option(None, "--process-id", help="Multi-host: this process's index."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No console progress bar."),
    ) -> None:
        """Train (or fine-tune) the relational transformer on one or several processed stores."""
        import jax

        if coordinator is not None:  # before anything touches a JAX backend
            try:  # CPU-only hosts need a collectives backend; GPUs use NCCL regardless of this option
                jax.config.update("jax_cpu_collectives_implementation", "gloo")
            except (AttributeError, KeyError, ValueError):
                pass
            jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                       process_id=process_id)
        try:
            from confluence.training.data import SyntheticSource, open_store_source
            from confluence.training.loop import train
            from confluence.training.presets import load_config

            cfg = load_config(config, _overrides(set_))
            if bool(db) == bool(synthetic):
                _fail("give either --db DIR (one or more) or --synthetic N")
            if synthetic:
                source = SyntheticSource(synthetic, d_t=cfg.model.d_t, batch_size=cfg.batch_size // jax.process_count(),
                                         seq_len=cfg.seq_len, max_rows=cfg.max_rows, seed=cfg.seed)
            else:
                source = open_store_source(db, cfg)
            try:
                res = train(cfg, source, out, resume=resume, init_from=init_from, max_steps=max_steps,
                            progress=not no_progress)
            finally:
                source.close()
        except ConfluenceError as exc:
            _fail(str(exc))
        typer.echo(f"trained to step {res.step}; last train loss {res.last_loss}; run directory {out}")
        for k, v in sorted(res.val_losses.items()):
            typer.echo(f"  {k}: {v:.4f}")

    @bench_app.command("train")
    def bench_train_cmd(
        config: str = typer.Option("small", "--config", help="Preset (small, base) or a .json / .toml file."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write the figures to this JSON file."),
        steps: int = typer.Option(5, "--steps", help="Timed steps after the compile step."),
        set_: list[str] = typer.Option([], "--set", help="Override a config field."),
        peak_tflops: float | None = typer.Option(None, "--peak-tflops", help="Peak TFLOP/s for the MFU."),
    ) -> None:
        """Time forward + backward + optimizer update on synthetic batches of the preset's shapes."""
        from confluence.training.bench import bench_train, result_dict
        from confluence.training.presets import load_config

        try:
            cfg = load_config(config, _overrides(set_))
        except ConfluenceError as exc:
            _fail(str(exc))
        r = bench_train(cfg, config, steps=steps, peak_flops=None if peak_tflops is None else peak_tflops * 1e12)
        d = result_dict(r)
        for k, v in d.items():
            typer.echo(f"{k:>22}: {v:.4g}" if isinstance(v, float) else f"{k:>22}: {v}")
        if json_out is not None:
            json_out.write_text(json.dumps(d, indent=2) + "\n")
