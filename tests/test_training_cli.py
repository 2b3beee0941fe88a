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
    assert r.exit_code == 1 and "neither a recipe" in r.output and "Traceback" not in r.output  # bad input: 1
    r = CliRunner().invoke(app, ["train", "--config", str(tiny_config_file), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--db" in r.output  # usage: 2 (typer's own)
    r = CliRunner().invoke(app, ["train", "--db", str(tiny_store), "--out", str(tmp_path / "x"),
                                 "--set", "sampler.widht=3"])
    assert r.exit_code == 1 and "config setting 'sampler.widht': unknown setting" in r.output


def _snapshot(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_finished_run_is_never_overwritten_without_force(tmp_path, tiny_config_file, tiny_store):
    run = tmp_path / "run"
    base = ["train", "--db", str(tiny_store), "--config", str(tiny_config_file), "--out", str(run), "--no-progress",
            "--max-steps", "2"]
    assert CliRunner().invoke(app, base).exit_code == 0
    before = _snapshot(run)
    assert "checkpoints/LATEST" in before and "scalars.csv" in before
    r = CliRunner().invoke(app, base)  # the same command again, without --resume
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "already holds a training run (checkpoint at step 2); nothing was changed" in r.output
    assert "--resume" in r.output and "--force" in r.output
    assert _snapshot(run) == before  # every file byte-identical
    r = CliRunner().invoke(app, [*base, "--force", "--set", "seed=7"])
    assert r.exit_code == 0, r.output
    after = _snapshot(run)
    assert after["checkpoints/LATEST"] == before["checkpoints/LATEST"]  # a new run of the same length
    assert json.loads(after["config.json"])["seed"] == 7 and after["scalars.csv"] != before["scalars.csv"]


def test_resume_with_nothing_to_resume_is_an_error(tmp_path, tiny_config_file, tiny_store):
    base = ["train", "--db", str(tiny_store), "--config", str(tiny_config_file), "--no-progress", "--resume"]
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "nothing")])
    assert r.exit_code == 1 and "has no checkpoint to resume from; it does not exist" in r.output
    assert not (tmp_path / "nothing").exists()  # an error leaves nothing behind
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "scalars.csv").write_text("step,wall_time,tag,value\n0,0,val/x,1\n")
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "half")])  # no marker: not known to be a run
    assert r.exit_code == 1 and "it holds 'scalars.csv') and was not written by confluence" in r.output
    from confluence import outputs

    outputs.mark(tmp_path / "half", "run")  # a run killed before its first checkpoint
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "half")])
    assert r.exit_code == 1 and "it holds scalars.csv without a checkpoint" in r.output
    assert (tmp_path / "half" / "scalars.csv").read_text().count("\n") == 2


@pytest.mark.slow
def test_demo_refuses_to_redo_an_existing_run(tmp_path):
    from confluence.training.loop import prepare_run_dir

    prepare_run_dir(tmp_path / "demo" / "run", resume=False, force=False)
    (tmp_path / "demo" / "run" / "config.json").write_text("{}")
    r = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "demo")])
    assert r.exit_code == 1 and "already holds a demo run" in r.output and "--force" in r.output
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["run"]  # nothing built before refusing


@pytest.mark.slow
def test_ctrl_c_says_how_to_resume_and_a_finished_run_says_it_is_finished(tmp_path, tiny_store):
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg = tiny_run_config(sampler=STORE_SAMPLER, loop={"max_steps": 100000, "ckpt_every": 100000,
                                                       "val_every": 100000, "log_every": 1})
    conf = tmp_path / "tiny.json"
    conf.write_text(json.dumps(cfg.to_dict()))
    run = tmp_path / "run"
    args = ["train", "--db", str(tiny_store), "--config", str(conf), "--out", str(run), "--no-progress"]
    # SIGUSR1 dumps every thread's stack to stderr: what a run that does not stop was doing
    boot = ("import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
            "from confluence.cli.main import main; sys.argv[0] = 'confluence'; main()")
    # output goes to files, not pipes: nobody reads a pipe while the test waits, and a full one would block the run
    with (tmp_path / "stdout.txt").open("w") as log_out, (tmp_path / "stderr.txt").open("w") as log_err:
        # SIGINT as in a terminal: a test runner started as a background job of a non-interactive shell (CI's
        # `.ci/run &`) has SIGINT ignored, a child inherits that, and Python leaves an ignored SIGINT ignored (as it
        # should for a background job: tests/test_training_loop.py), so the run would never see the Ctrl-C
        proc = subprocess.Popen([sys.executable, "-c", boot, *args], stdout=log_out, stderr=log_err, text=True,
                                env={**os.environ, "JAX_PLATFORMS": "cpu"},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:  # wait for a few logged steps
            scalars = run / "scalars.csv"
            if scalars.exists() and scalars.read_text().count("train/loss,") >= 3:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
            stalled = False
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(3)
            proc.kill()
            proc.wait()
            stalled = True
    err = (tmp_path / "stderr.txt").read_text()
    assert not stalled, f"the run did not stop within 120 s of SIGINT; its threads: {err[-6000:]}"
    assert proc.returncode == 130, err[-2000:]
    assert "stopped (Ctrl-C); the run is saved at step" in err and "with --resume to continue it" in err
    assert "Traceback" not in err
    step = int((run / "checkpoints" / "LATEST").read_text().strip().split("_")[1])
    r = CliRunner().invoke(app, [*args, "--resume", "--max-steps", str(step)])
    assert r.exit_code == 0, r.output
    assert f"is already at step {step}, its last step; nothing to train" in r.output and "None" not in r.output


@pytest.mark.slow
def test_train_says_what_it_does_before_the_first_step(tmp_path, tiny_config_file, tiny_store):
    """The waits before the first step (the model's initialisation, compiling the step, the untrained model's
    validation) each say what they are, in order, with --no-progress too (it turns off only the bar)."""
    base = ["train", "--db", str(tiny_store), "--config", str(tiny_config_file), "--max-steps", "2"]
    quiet = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "quiet"), "--no-progress"])
    assert quiet.exit_code == 0, quiet.output
    lines = quiet.output.splitlines()
    expected = ["opening the training stores (1 database(s)) ...", "initialising the model (1 layer, d_model 16) ...",
                "compiling the training step (4 sequences of 48 cells, up to 16 rows each, 64 texts per batch; once "
                "per batch shape) ...", "validating the untrained model (", "validating at step 2 (",
                "trained to step 2"]
    at = [next((i for i, ln in enumerate(lines) if ln.startswith(e)), None) for e in expected]
    assert None not in at and at == sorted(at), quiet.output
    assert any(ln.startswith("compiling the training step: done in ") for ln in lines), quiet.output
    tasks = len(json.loads((tiny_store / "metadata.json").read_text())["tasks"])
    assert f"validating the untrained model ({tasks} tasks, 1 batch each) ..." in lines, quiet.output
    assert "train: started" not in quiet.output  # the bar (log lines here) is what --no-progress turns off
    loud = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "loud")])
    assert loud.exit_code == 0, loud.output
    assert "train: started (2 to do)" in loud.output and "compiling the training step (" in loud.output
