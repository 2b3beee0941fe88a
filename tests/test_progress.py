"""Long work shows progress: a bar on a terminal, log lines in a log (CI, `| tee`, a file), never minutes of silence.
`confluence evaluate` is checked at CLI level, as a user meets it."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.toolkit.progress import Phase, Reporter, StepBar, per_row
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


def test_reporter_speaks_while_one_unit_lasts_longer_than_its_interval():
    """A unit of work longer than the interval (one DuckDB query, one LightGBM round) is not silent: the step's
    line comes again every interval, ending with what is being done now."""
    import time

    console, buf = _console(False)
    with Reporter(enabled=True, console=console, interval=0.1) as rep:
        rep.step("amount: LightGBM features of 500 train seeds", 3)
        rep.note("orders siblings through orders.customer_id")
        time.sleep(0.65)  # one slow query: no advance for six intervals
        rep.advance(3)
    lines = buf.getvalue().splitlines()
    ticks = [ln for ln in lines if ln.startswith("amount: LightGBM features of 500 train seeds: 0/3 (0%)")]
    assert len(ticks) >= 3, lines
    assert all(ln.endswith("; orders siblings through orders.customer_id") for ln in ticks), ticks
    assert lines[-1].startswith("amount: LightGBM features of 500 train seeds: 3/3 (100%)"), lines
    time.sleep(0.3)
    assert buf.getvalue().splitlines() == lines  # the ticker stopped with the reporter


def test_a_phase_says_when_it_starts_while_it_lasts_and_when_it_ends():
    import time

    console, buf = _console(False)
    with Phase("compiling the training step", "4 sequences of 48 cells", console=console, interval=0.1) as ph:
        ph.status = "nearly there"
        time.sleep(0.35)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "compiling the training step (4 sequences of 48 cells) ..."
    assert any(re.fullmatch(r"compiling the training step: 0:00 elapsed, nearly there", ln) for ln in lines[1:-1])
    assert re.fullmatch(r"compiling the training step: done in 0:00", lines[-1]), lines
    console, buf = _console(False)
    with Phase("validating", console=console, tick=False, interval=0.1):  # --no-progress: a line per phase only
        time.sleep(0.25)
    assert buf.getvalue().splitlines() == ["validating ...", "validating: done in 0:00"]
    with Phase("validating", console=console, enabled=False):  # not the first process of a multi-host run
        pass
    assert buf.getvalue().splitlines() == ["validating ...", "validating: done in 0:00"]


def test_contexts_are_counted_as_rows():
    """Each row is answered from `draws` contexts: the step counts rows (2,000 rows is 2000 to do, not 8000)."""
    console, buf = _console(False)
    with Reporter(enabled=True, console=console, interval=0.0) as rep:
        rep.step("flights.dep_delay: model", 10)
        contexts = per_row(rep.advance, 4)
        for _ in range(4):  # the draws run one after the other over all rows, in batches of 3 contexts
            for n in (3, 3, 3, 1):
                contexts(n)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "flights.dep_delay: model: started (10 to do)"
    assert lines[-1].startswith("flights.dep_delay: model: 10/10 (100%)"), lines
    assert not any(re.search(r": (1[1-9]|[2-9]\d)/10 ", ln) for ln in lines), lines  # never past the rows


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
                                   "--task", "amount", "--max-seeds", "64", "--gbdt", "--json",
                                   str(tmp / "progress.json")])
    assert res.exit_code == 0, res.output
    assert "amount: model: started (" in res.output
    assert re.search(r"amount: model: \d+/\d+ \(100%\)", res.output), res.output
    # the model's step counts rows (each answered from 4 context draws), as the results do
    n_rows = json.loads((tmp / "progress.json").read_text())["amount"]["info"]["n_eval"]
    assert f"amount: model: started ({n_rows} to do)" in res.output, res.output
    assert f"amount: model: {n_rows}/{n_rows} (100%)" in res.output
    # LightGBM says what it builds: each feature table query by query, then its rounds
    assert re.search(r"amount: LightGBM features of \d+ train seeds: started \(\d+ to do\)", res.output), res.output
    assert re.search(r"amount: LightGBM features of \d+ eval seeds: \d+/\d+ \(100%\)", res.output), res.output
    assert re.search(r"amount: LightGBM rounds \(\d+ rows x \d+ features, \d+ threads\): started \(100 to do\)",
                     res.output), res.output
    assert "LightGBM rounds" in res.output and "100/100 (100%)" in res.output
    assert "sparse values" not in res.output  # LightGBM's renumbering warning is fixed at the source
    pred = CliRunner().invoke(app, ["predict", "--checkpoint", str(run), "--db", str(store), "--task", "amount",
                                    "--split", "test", "-o", str(tmp / "progress.parquet")])
    assert pred.exit_code == 0, pred.output
    n_pred = int(re.search(r"wrote (\d+) predictions", pred.output).group(1))
    assert f"predict amount: started ({n_pred} to do)" in pred.output, pred.output
    quiet = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(run), "--db", str(store), "--task",
                                     "amount", "--max-seeds", "64", "--no-progress"])
    assert quiet.exit_code == 0 and "started (" not in quiet.output
