"""`confluence serve`: the HTTP JSON prediction service (confluence.serving, docs/serving.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import typer

from confluence.evaluation.draws import DEFAULT_DRAWS


def _server_class():
    """uvicorn's Server, ending normally (exit status 0) after its graceful shutdown on SIGINT / SIGTERM: uvicorn
    re-raises the signal once shut down, which would end the process as killed by it."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server


DEFAULT_COMPILE_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "confluence" / "jax"


def serve_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="Trained run directory, its checkpoints/ folder, or "
                                    "one step_* checkpoint directory."),
    db: Path = typer.Option(..., "--db", help="Processed store to serve (preprocessed with the checkpoint's text "
                            "encoder)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on."),
    batch_size: int = typer.Option(None, "--batch-size", min=1, help="Sequences per forward pass; concurrent "
                                   "requests share one (default: the run's training batch size)."),
    max_wait_ms: float = typer.Option(5.0, "--max-wait-ms", min=0.0, help="After a request arrives, wait this "
                                      "long for more to batch with it (unless the batch is full)."),
    max_anchors: int = typer.Option(1000, "--max-anchors", min=1, help="Most anchors in one request (more: "
                                    "HTTP 413)."),
    top_k: int = typer.Option(3, "--top-k", min=0, help="Categorical tasks: classes listed by default (a "
                              "request's top_k overrides it)."),
    clip_numbers: bool = typer.Option(True, "--clip-numbers/--no-clip-numbers",
                                      help="Numbers within the train targets' range, rounded when they are all "
                                           "whole, as predict reports them."),
    warm_up: bool = typer.Option(True, "--warm-up/--no-warm-up", help="Compile the model for every batch "
                                 "shape before /health says ready (--no-warm-up: start sooner, compile each "
                                 "shape when a request first needs it)."),
    draws: int = typer.Option(DEFAULT_DRAWS, "--draws", min=1, help="Contexts drawn per anchor, their answers "
                              "combined as predict combines them; 1: one context, the least work per request."),
    compile_cache: str = typer.Option(str(DEFAULT_COMPILE_CACHE), "--compile-cache", metavar="DIR",
                                      help="Keep the compiled model here, so a restart skips compiling; 'off': "
                                           "do not."),
    log_level: str = typer.Option("info", "--log-level", help="critical | error | warning | info | debug"),
) -> None:
    """Serve predictions over HTTP: POST /predict, GET /health, /tasks, /model, and the OpenAPI page /docs."""
    from confluence.errors import ConfluenceError
    from confluence.serving.app import create_app
    from confluence.serving.service import use_compile_cache

    levels = ("critical", "error", "warning", "info", "debug")
    if log_level not in levels:
        raise typer.BadParameter(f"{log_level!r} is not one of {', '.join(levels)}", param_hint="--log-level")
    logger = logging.getLogger("confluence")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(log_level.upper())
    typer.echo(f"loading {checkpoint} and {db} ...", err=True)
    try:
        use_compile_cache(compile_cache)
        app = create_app(checkpoint, db, batch_size=batch_size, max_wait_ms=max_wait_ms, max_anchors=max_anchors,
                         top_k=top_k, clip_numbers=clip_numbers, warm_up=warm_up, draws=draws)
    except (ConfluenceError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    service = app.state.service
    typer.echo(f"serving step {service.loaded.step} of {service.loaded.path} on store '{service.store.name}' "
               f"({len(service.tasks)} tasks) at http://{host}:{port} (API page: /docs)", err=True)
    import uvicorn

    server = _server_class()(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                            timeout_graceful_shutdown=10))
    server.run()
    if not server.started:  # e.g. the port is taken (uvicorn said why)
        raise typer.Exit(1)
    typer.echo("stopped", err=True)


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    del bench_app, text_app
    app.command("serve")(serve_cmd)
