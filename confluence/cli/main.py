"""Entry point of the `confluence` command.

Each area of the system registers its commands from its own module (`register(app, bench_app, text_app)`), so
that the CLI mirrors the Python API and areas do not step on each other. Heavy imports (JAX, numba) happen
inside the commands, so `confluence --help` stays fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="confluence",
    help="Confluence: a foundation model for relational databases.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks that print measured figures.", no_args_is_help=True)
text_app = typer.Typer(help="The LeJEPA text base model (seed 003).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(text_app, name="text")

_AREAS = (
    "confluence.cli.schema_cmds",
    "confluence.cli.data_cmds",
    "confluence.cli.sampler_cmds",
    "confluence.cli.train_cmds",
    "confluence.cli.eval_cmds",
    "confluence.cli.textenc_cmds",
    "confluence.cli.text_cmds",
    "confluence.cli.kernel_cmds",
    "confluence.cli.demo_cmds",
)

for _mod in _AREAS:
    try:
        _m = importlib.import_module(_mod)
    except ModuleNotFoundError as exc:  # an area not built yet
        if exc.name != _mod:
            raise
        continue
    _m.register(app, bench_app, text_app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
