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


def test_results_read_at_80_columns_in_a_log():
    """`evaluate`'s console results: one block per task (no table borders to wrap), the verdict in words, the gain
    over LightGBM oriented so that positive = the model is better, at most 80 columns, no control codes."""

    from confluence.cli.eval_cmds import print_results

    results = {
        "airport_next_day_delay_over_15": {
            "info": {"stype": "boolean", "n_eval": 365},
            "model": {"auroc": 0.88, "average_precision": 0.61, "n": 365.0},
            "baseline": {"auroc": 0.5, "average_precision": 0.24, "name": "majority"},
            "gbdt": {"auroc": 0.86, "average_precision": 0.66},
            "model_vs_gbdt": {"diff": 0.02, "ci_low": -0.02, "ci_high": 0.06, "n_boot": 1000.0, "a_not_worse": 1.0}},
        "flights.dep_delay": {
            "info": {"stype": "numerical", "n_eval": 2000},
            "model": {"mae": 17.16, "r2": -2.3e-05, "n": 2000.0},
            "baseline": {"mae": 17.41, "r2": -0.13, "name": "median"},
            "gbdt": {"mae": 15.73, "r2": 0.12},
            "model_vs_gbdt": {"diff": 1.43, "ci_low": 1.05, "ci_high": 1.83, "n_boot": 1000.0, "a_not_worse": 0.0}},
    }
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_results(results, "db — split test")
    text = buf.getvalue()
    assert "\x1b" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert "verdict: beats trivial, not worse than GBDT" in text
    assert "verdict: beats trivial, worse than GBDT" in text
    assert "-1.43 [-1.83, -1.05]" in text  # an error metric: the model's higher MAE is a negative gain
    assert "+0.02 [-0.02, +0.06]" in text
    assert "average_precision" in text and "trivial = median" in text
