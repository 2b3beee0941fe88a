"""Entry point of the `confluence` command.

Each area of the system registers its commands from its own module (`register(app, bench_app, text_app)`), so
that the CLI mirrors the Python API and areas do not step on each other. Heavy imports (JAX, numba) happen
inside the commands, so `confluence --help` stays fast.
"""

from __future__ import annotations

import typer

from confluence.cli import (
    bench_cmds,
    corpus_cmds,
    data_cmds,
    demo_cmds,
    devsuite_cmds,
    eval_cmds,
    pretrained_cmds,
    sampler_cmds,
    schema_cmds,
    serve_cmds,
    synth_cmds,
    text_cmds,
    textenc_cmds,
    train_cmds,
)

app = typer.Typer(
    name="confluence",
    help="Confluence: a foundation model for relational databases.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: reads at 80 columns and in a log file, no type placeholders on flags
)
bench_app = typer.Typer(help="Benchmarks that print measured figures.", no_args_is_help=True, rich_markup_mode=None)
text_app = typer.Typer(help="The LeJEPA text model: train your own frozen text encoder on a corpus of texts.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(bench_app, name="bench")
app.add_typer(text_app, name="text")

for _area in (schema_cmds, data_cmds, sampler_cmds, train_cmds, eval_cmds, textenc_cmds, text_cmds, bench_cmds,
              demo_cmds, synth_cmds, serve_cmds, corpus_cmds, pretrained_cmds, devsuite_cmds):
    _area.register(app, bench_app, text_app)


def main() -> None:
    """Run the command; a file-system failure no command turned into a message of its own (a full disk, a
    read-only or forbidden path) ends with one `error:` line naming the path, not a traceback."""
    import errno

    try:
        app()
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EIO) \
                and not (exc.errno is None and "requested and" in str(exc)):
            raise
        from confluence.outputs import write_failure

        path = exc.filename or "the output"
        typer.echo(f"error: {write_failure(exc, path, 'a file', 'the command stopped')}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
