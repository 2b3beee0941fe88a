"""`confluence serve`: the HTTP JSON prediction service (confluence.serving, docs/guide/serving.md)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import typer

from confluence.inference.draws import DEFAULT_DRAWS

TOKEN_ENV = "CONFLUENCE_SERVE_TOKEN"
# on SIGTERM / SIGINT, requests in progress get this long to be answered; then the worker stops between forward
# passes and the rest get 503, so the process ends well within uvicorn's graceful timeout (SHUTDOWN_S)
DRAIN_S = 5.0
SHUTDOWN_S = 10


def _server_class():
    """uvicorn's Server, ending normally (exit status 0) after its graceful shutdown on SIGINT / SIGTERM (uvicorn
    re-raises the signal once shut down, which would end the process as killed by it), and telling the service
    to stop within DRAIN_S when the shutdown begins (a large request in progress cannot hold the exit up)."""
    import uvicorn

    class Server(uvicorn.Server):
        on_shutdown: Callable[[], None] | None = None

        async def shutdown(self, sockets: list | None = None) -> None:
            if self.on_shutdown is not None:
                self.on_shutdown()
            await super().shutdown(sockets)

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
    max_explain_anchors: int = typer.Option(16, "--max-explain-anchors", min=1, help="Most anchors in one POST "
                                            "/explain request (each costs a model call per context row; more: "
                                            "HTTP 413)."),
    max_body_bytes: int = typer.Option(None, "--max-body-bytes", min=1024, help="Most bytes in a request body; "
                                       "more is refused (HTTP 413) unparsed and unkept (default: 64 KiB + 512 "
                                       "bytes per --max-anchors anchor: 577,536 for 1000)."),
    token_file: Path = typer.Option(None, "--token-file", metavar="FILE", help="Require this bearer token (the "
                                    "file's text) on every endpoint but /health (else HTTP 401); default: the "
                                    f"environment variable {TOKEN_ENV}, if set; neither: no token."),
    docs: bool = typer.Option(False, "--docs/--no-docs", help="Serve the interactive API page at /docs (Swagger "
                              "UI; the browser loads its JavaScript and CSS from the jsdelivr CDN, so it is blank "
                              "offline). /openapi.json is served either way."),
    model_details: bool = typer.Option(False, "--model-details", help="GET /model shows the checkpoint's and "
                                       "store's absolute paths and the training machine's environment (default: "
                                       "basenames, no environment)."),
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
    compile_cache: str = typer.Option(None, "--compile-cache", metavar="DIR", show_default=False,
                                      help="Keep the compiled model here, so a restart skips compiling; 'off': "
                                           "do not (default: $CONFLUENCE_COMPILE_CACHE, else "
                                           "~/.cache/confluence/jax, shared with predict and evaluate)."),
    blend: str = typer.Option(None, "--blend", metavar="gbdt", help="At start-up, fit LightGBM and a blend "
                              "weight per task (chosen on the validation split, 0 unless a paired interval there "
                              "shows another weight helps or LightGBM no better than the trivial baseline; a log "
                              "line per task; the trivial baseline ships where nothing is shown better than it); "
                              "answers gain LightGBM's, the blend's and the trivial baseline's columns, as predict "
                              "--blend gbdt."),
    log_level: str = typer.Option("info", "--log-level", help="critical | error | warning | info | debug"),
) -> None:
    """Serve predictions over HTTP: POST /predict, GET /health, /tasks, /model, /openapi.json (and with --docs, the
    API page /docs)."""
    from confluence.errors import ConfluenceError
    from confluence.serving.app import create_app
    from confluence.toolkit.compile_cache import use_compile_cache

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
        token, token_from = None, None
        if token_file is not None:
            token, token_from = token_file.read_text().strip(), str(token_file)
        elif os.environ.get(TOKEN_ENV):
            token, token_from = os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
        if token is not None and (not token or any(c.isspace() for c in token)):
            raise ConfluenceError(f"the bearer token of {token_from} is empty or holds whitespace")
        use_compile_cache(compile_cache)
        app = create_app(checkpoint, db, batch_size=batch_size, max_wait_ms=max_wait_ms, max_anchors=max_anchors,
                         top_k=top_k, clip_numbers=clip_numbers, warm_up=warm_up, draws=draws,
                         max_body_bytes=max_body_bytes, token=token, docs=docs, model_details=model_details,
                         blend=blend, max_explain_anchors=max_explain_anchors)
    except (ConfluenceError, OSError, UnicodeDecodeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    service = app.state.service
    typer.echo(f"serving step {service.loaded.step} of {service.loaded.path} on store '{service.store.name}' "
               f"({len(service.tasks)} tasks) at http://{host}:{port}"
               f"{' (API page: /docs)' if docs else ''}; requests up to {service.settings.max_anchors} anchors, "
               f"{service.settings.body_limit} bytes", err=True)
    if token is not None:
        typer.echo(f"a bearer token is required on every endpoint but /health (from {token_from})", err=True)
    elif host not in ("127.0.0.1", "localhost", "::1"):
        typer.echo(f"warning: listening on {host} with no token: anyone who reaches it can use it "
                   f"(--token-file or ${TOKEN_ENV})", err=True)
    import uvicorn

    server = _server_class()(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                            timeout_graceful_shutdown=SHUTDOWN_S))
    server.on_shutdown = lambda: service.stop_after(DRAIN_S)
    server.run()
    if not server.started:  # e.g. the port is taken (uvicorn said why)
        raise typer.Exit(1)
    typer.echo("stopped", err=True)
    gc.freeze()  # the process ends now: its last collection need not walk the model and the store (1-3 s)


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    del bench_app, text_app
    app.command("serve")(serve_cmd)
