"""`confluence train` end to end on a real store (tiny configuration): train, resume, the schedule it reports,
and bad arguments without a traceback."""

import json

import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from tests.fixtures.model import tiny_run_config

STORE_SAMPLER = {"seq_len": 48, "max_rows": 16, "row_buckets": [16], "text_buckets": [64], "width": 4}


@pytest.fixture()
def tiny_config_file(tmp_path):
    cfg = tiny_run_config(sampler=STORE_SAMPLER, loop={"max_steps": 4, "ckpt_every": 2, "val_every": 2})
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg.to_dict()))
    return path


@pytest.mark.slow
def test_train_and_resume_from_the_cli(tmp_path, tiny_config_file, tiny_store):
    run = tmp_path / "run"
    base = ["train", "--db", str(tiny_store), "--config", str(tiny_config_file), "--out", str(run), "--no-progress"]
    r = CliRunner().invoke(app, [*base, "--max-steps", "2"])
    assert r.exit_code == 0, r.output
    assert "2 steps; learning rate: linear warmup over 2 steps" in r.output  # the tiny config fixes total_steps
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_00000002"
    r = CliRunner().invoke(app, [*base, "--resume", "--set", "loop.max_steps=4"])
    assert r.exit_code == 0, r.output
    assert "resume: setting changed since the checkpoint: loop.max_steps: 2 -> 4" in r.output
    assert "trained to step 4" in r.output and "val/bookstore/order_rating" in r.output
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_00000004"
    assert (run / "scalars.png").stat().st_size > 1000
    saved = json.loads((run / "config.json").read_text())
    assert saved["sampler"]["batch_size"] == 4 and saved["loop"]["max_steps"] == 4


def test_cli_reports_bad_arguments_without_traceback(tmp_path, tiny_config_file, tiny_store):
    r = CliRunner().invoke(app, ["train", "--config", "nope", "--out", str(tmp_path / "x"), "--db", str(tiny_store)])
    assert r.exit_code == 2 and "neither a recipe" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["train", "--config", str(tiny_config_file), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--db" in r.output
    r = CliRunner().invoke(app, ["train", "--db", str(tiny_store), "--out", str(tmp_path / "x"),
                                 "--set", "sampler.widht=3"])
    assert r.exit_code == 2 and "config setting 'sampler.widht': unknown setting" in r.output
