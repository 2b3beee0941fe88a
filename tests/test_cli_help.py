"""Every command and option of the CLI explains itself: help text on each option, no stray type placeholders, and
help that reads at 80 columns."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from confluence.cli.main import app


def _commands(group, path: tuple[str, ...] = ()):
    if hasattr(group, "commands"):  # a group (typer ships its own click)
        for name, cmd in group.commands.items():
            yield from _commands(cmd, (*path, name))
    else:
        yield path, group


COMMANDS = list(_commands(typer.main.get_command(app)))


def test_the_cli_has_its_commands():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"train", "evaluate", "predict", "demo", "sample show", "preprocess"} <= names


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_has_help(path, cmd):
    assert (cmd.help or "").strip(), f"`confluence {' '.join(path)}` has no help text"
    missing = [p.opts[0] for p in cmd.params if getattr(p, "param_type_name", "") == "option" and not (p.help or "").strip()]
    assert not missing, f"`confluence {' '.join(path)}`: options without help: {missing}"


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_reads_at_80_columns(path, cmd):
    res = CliRunner().invoke(app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "<bool>" not in res.output and "BOOLEAN" not in res.output, res.output
    assert "<list[" not in res.output.split("Options:")[-1], res.output  # repeatable options name their values
    assert max(len(line) for line in res.output.splitlines()) <= 80, res.output
