"""The text-encoder CLI commands, registered on a fresh app as confluence.cli.main does."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from confluence.cli import textenc_cmds


def _app() -> typer.Typer:
    app, bench_app, text_app = typer.Typer(), typer.Typer(), typer.Typer()
    app.add_typer(bench_app, name="bench")
    app.add_typer(text_app, name="text")
    textenc_cmds.register(app, bench_app, text_app)
    return app


def test_embed_prints_similarities():
    res = CliRunner().invoke(_app(), ["text-encoder", "embed", "dog", "puppy", "stock market"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("encoder: model2vec:confluence-minilm-l6-v2-m2v256:") and "(dim 256)" in lines[0]
    dog = [float(x) for x in lines[1].split()[:3]]
    assert dog[0] > 0.999 and dog[1] > dog[2]


def test_embed_bad_spec_is_an_error_not_a_traceback():
    res = CliRunner().invoke(_app(), ["text-encoder", "embed", "x", "--text-encoder", "nope"])
    assert res.exit_code == 1  # bad input (2 is for usage)
    assert "valid forms" in res.output
