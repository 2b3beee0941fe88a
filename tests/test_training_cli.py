"""`confluence train` and `confluence bench train` end to end (tiny configuration, synthetic databases)."""

import json

import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from tests.conftest_model import tiny_train_config


@pytest.fixture()
def tiny_config_file(tmp_path):
    cfg = tiny_train_config(max_steps=4, ckpt_every=2, val_every=2)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg.to_dict()))
    return path


@pytest.mark.slow
def test_train_and_resume_from_the_cli(tmp_path, tiny_config_file):
    run = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--synthetic", "2", "--config", str(tiny_config_file), "--out", str(run),
                                 "--max-steps", "2", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_00000002"
    r = CliRunner().invoke(app, ["train", "--synthetic", "2", "--config", str(tiny_config_file), "--out", str(run),
                                 "--resume", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "trained to step 4" in r.output and "val/synthetic1/" in r.output
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_00000004"
    assert (run / "scalars.csv").is_file() and json.loads((run / "config.json").read_text())["batch_size"] == 4


@pytest.mark.slow
def test_bench_train_writes_figures(tmp_path, tiny_config_file):
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["bench", "train", "--config", str(tiny_config_file), "--steps", "2", "--json",
                                 str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["step_s"] > 0 and d["cells_per_s"] > 0 and 0 < d["mfu"] < 1
    assert d["batch_size"] == 4 and d["seq_len"] == 32


def test_cli_reports_bad_arguments_without_traceback(tmp_path, tiny_config_file):
    r = CliRunner().invoke(app, ["train", "--config", "nope", "--out", str(tmp_path / "x"), "--synthetic", "1"])
    assert r.exit_code == 2 and "neither a preset" in r.output
    r = CliRunner().invoke(app, ["train", "--config", str(tiny_config_file), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--db" in r.output
