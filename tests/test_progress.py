"""Long work shows progress: a bar on a terminal, log lines in a log (CI, `| tee`, a file), never minutes of silence.
`confluence evaluate` is checked at CLI level, as a user meets it."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.toolkit.progress import Reporter, StepBar
from tests.test_eval_end_to_end import shop  # noqa: F401  (the module-scoped trained checkpoint)


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=100), buf


def test_reporter_writes_log_lines_when_not_a_terminal():
    console, buf = _console(False)
    with Reporter(enabled=True, console=console, interval=0.0) as rep:
        rep.step("task a: model", 4)
        rep.advance(2)
        rep.advance(2)
        rep.step("task b: LightGBM", 3)
        rep.advance(3)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "task a: model: started (4 to do)"
    assert any(re.match(r"task a: model: 2/4 \(50%\) 0:00 elapsed", ln) for ln in lines), lines
    assert any(ln.startswith("task a: model: 4/4 (100%)") for ln in lines), lines
    assert "task b: LightGBM: started (3 to do)" in lines
    assert lines[-1].startswith("task b: LightGBM: 3/3 (100%)")  # the last step is closed on exit
    assert "\x1b" not in buf.getvalue()  # no terminal control codes in a log


def test_reporter_rate_limits_its_lines():
    console, buf = _console(False)
    with Reporter(enabled=True, console=console, interval=3600.0) as rep:
        rep.step("slow step", 1000)
        for _ in range(1000):
            rep.advance(1)
    assert buf.getvalue().splitlines() == ["slow step: started (1000 to do)",
                                           buf.getvalue().splitlines()[-1]]
    assert buf.getvalue().splitlines()[-1].startswith("slow step: 1000/1000 (100%)")


def test_reporter_draws_a_bar_on_a_terminal_and_is_silent_when_disabled():
    console, buf = _console(True)
    with Reporter(enabled=True, console=console) as rep:
        rep.step("model", 10)
        rep.advance(10)
    assert "10/10" in buf.getvalue() and "started" not in buf.getvalue()
    console, buf = _console(False)
    with Reporter(enabled=False, console=console) as rep:
        rep.step("model", 10)
        rep.advance(10)
    assert buf.getvalue() == ""


def test_training_bar_logs_rate_and_loss_when_not_a_terminal():
    console, buf = _console(False)
    bar = StepBar(100, start=10, console=console, interval=0.0)
    bar.update(50, 1.25)
    bar.close()
    text = buf.getvalue()
    assert "train: started (100 to do)" in text
    assert re.search(r"train: 50/100 \(50%\) .* step/s, loss 1\.2500", text), text


@pytest.mark.slow
def test_evaluate_cli_shows_progress_in_a_log(shop):  # noqa: F811
    store, run, tmp = shop
    res = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(run), "--db", str(store), "--split", "test",
                                   "--task", "amount", "--max-seeds", "64", "--gbdt"])
    assert res.exit_code == 0, res.output
    assert "amount: model: started (" in res.output
    assert re.search(r"amount: model: \d+/\d+ \(100%\)", res.output), res.output
    assert "amount: LightGBM: started (102 to do)" in res.output  # two feature tables + 100 rounds
    assert "amount: LightGBM: 102/102 (100%)" in res.output
    assert "sparse values" not in res.output  # LightGBM's renumbering warning is fixed at the source
    quiet = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(run), "--db", str(store), "--task",
                                     "amount", "--max-seeds", "64", "--no-progress"])
    assert quiet.exit_code == 0 and "started (" not in quiet.output
