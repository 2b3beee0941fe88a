"""How long a run trains: "auto" from the databases, a time budget, early stopping with the best checkpoint kept
(training/budget.py, the loop), and the BEST checkpoint that evaluation loads."""

import json
import time

import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.errors import ConfigError, ConfluenceError
from confluence.toolkit.checkpoint import (
    best_checkpoint,
    read_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from confluence.toolkit.config import overlay
from confluence.toolkit.logs import read_scalars
from confluence.training.budget import (
    AUTO_MAX_STEPS,
    AUTO_MIN_STEPS,
    STEPS_PER_TASK,
    EarlyStop,
    auto_steps,
    check_run_length,
    parse_duration,
    steps_for_duration,
    task_anchor_counts,
    validation_interval,
)
from confluence.training.config import load_config
from confluence.training.loop import cooldown_record, open_stream, resolve_length, train
from tests.test_training_loop import _cfg, _Crash, _leaves


def test_durations_parse_and_bad_lengths_are_named():
    assert parse_duration("90s") == 90 and parse_duration("10m") == 600 and parse_duration("1h30m") == 5400
    assert parse_duration("1.5h") == 5400 and parse_duration("2min") == 120
    assert parse_duration("soon") is None and parse_duration("") is None and parse_duration("10") is None
    for ok in (0, 3000, "auto", "10m"):
        check_run_length(ok)
    for bad in (-1, "soon", "0s"):
        with pytest.raises(ConfigError, match="max_steps"):
            check_run_length(bad)
    with pytest.raises(ConfigError, match="loop.max_steps"):
        load_config("small", {"loop": {"max_steps": "tomorrow"}})


def test_auto_steps_follow_tasks_and_are_capped_by_passes_over_small_data():
    big = {f"t{i}": 100_000 for i in range(6)}
    assert auto_steps(big, 16) == 6 * STEPS_PER_TASK
    assert auto_steps({"t": 100_000}, 16) == AUTO_MIN_STEPS  # one task: the floor
    assert auto_steps({f"t{i}": 100_000 for i in range(40)}, 16) == AUTO_MAX_STEPS
    tiny = {"a": 200, "b": 120}  # 50 passes over 320 anchors at 16 a batch: 1,000 steps, below the floor
    assert auto_steps(tiny, 16) == 1000
    assert validation_interval(9000, 100) == 300 and validation_interval(1000, 100) == 100


def test_a_time_budget_leaves_room_for_validation():
    assert steps_for_duration(100.0, 0.1, 2.0, 100) == int(100 / (0.1 * 1.15 + 0.02))
    assert steps_for_duration(-5.0, 0.1, 2.0, 100) == 1


def test_early_stop_counts_validations_without_a_better_relative_score():
    es = EarlyStop(patience=2, min_delta=0.01)
    assert es.update(0, {"val/a/loss": 2.0, "val/b/loss": 0.5})  # the reference
    assert es.update(1, {"val/a/loss": 1.0, "val/b/loss": 0.5}) and es.best_step == 1  # score 0.75
    assert not es.update(2, {"val/a/loss": 1.2, "val/b/loss": 0.5}) and es.since_best == 1
    # better, but by less than 1 %: the new best, and the patience keeps counting
    assert es.update(3, {"val/a/loss": 0.99, "val/b/loss": 0.5}) and es.best_step == 3 and es.since_best == 2
    assert es.should_stop
    again = EarlyStop.from_meta(2, json.loads(json.dumps(es.to_meta())), 0.01)
    assert again.to_meta() == es.to_meta() and again.should_stop
    assert not EarlyStop(patience=0, since_best=99).should_stop  # 0: never


def _state(v: float):
    return {"w": jnp.full((3,), v)}, {"m": jnp.zeros((3,))}


def test_best_checkpoint_is_resolved_and_never_pruned(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, *_state(step), {"config": {}}, keep=2, best=step == 2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == ["step_00000002", "step_00000004", "step_00000005"]
    assert best_checkpoint(tmp_path).name == "step_00000002"
    assert resolve_checkpoint(tmp_path).name == "step_00000002"  # what evaluate / predict / serve load
    assert read_checkpoint(tmp_path, latest=True).step == 5  # what --resume continues
    save_checkpoint(tmp_path, 5, *_state(5), {"config": {}}, keep=2, best=True)  # an existing step made best
    assert best_checkpoint(tmp_path).name == "step_00000005"


def test_auto_length_comes_from_the_store(tiny_store):
    cfg = _cfg(loop={"max_steps": "auto", "val_every": 3, "patience": 2})
    with open_stream([tiny_store], cfg) as s:
        counts = task_anchor_counts(s)
        resolved, duration, said = resolve_length(cfg, s, None)
    assert duration is None and resolved.loop.max_steps == auto_steps(counts, cfg.sampler.batch_size)
    assert f"{resolved.loop.max_steps} steps, from the databases ({len(counts)} tasks" in said
    # a resumed run keeps the length its checkpoint was given
    saved = _cfg(loop={"max_steps": 77, "val_every": 7}).to_dict()
    with open_stream([tiny_store], cfg) as s:
        again, _, said = resolve_length(cfg, s, saved)
    assert (again.loop.max_steps, again.loop.val_every, said) == (77, 7, None)


@pytest.mark.slow
def test_early_stopping_stops_keeps_the_best_and_resumes_as_finished(tiny_store, tmp_path):
    # a validation counts as better only when 90 % below the best: after 2 validations the run stops
    cfg = _cfg(loop={"max_steps": 40, "val_every": 2, "ckpt_every": 10, "patience": 2, "min_delta": 0.9})
    with open_stream([tiny_store], cfg) as s:
        res = train(cfg, s, tmp_path / "run", progress=False)
    assert res.stopped_early and res.step == 4
    best = best_checkpoint(tmp_path / "run")
    assert best is not None and res.best_step in (2, 4) and best.name == f"step_{res.best_step:08d}"
    assert read_checkpoint(tmp_path / "run", latest=True).step == 4
    meta = read_checkpoint(tmp_path / "run", latest=True).meta["early_stop"]
    assert meta["since_best"] == 2 and meta["best_step"] == res.best_step
    with open_stream([tiny_store], cfg) as s:
        again = train(cfg, s, tmp_path / "run", resume=True, progress=False)
    assert again.stopped_early and again.last_loss is None and again.step == 4


@pytest.mark.slow
def test_early_stopping_state_resumes_exactly(tiny_store, tmp_path):
    cfg = _cfg(loop={"max_steps": 8, "val_every": 2, "ckpt_every": 4, "patience": 50})
    with open_stream([tiny_store], cfg) as s:
        full = train(cfg, s, tmp_path / "full", progress=False)
    with open_stream([tiny_store], cfg.with_max_steps(4)) as s:
        train(cfg.with_max_steps(4), s, tmp_path / "cut", progress=False)
    with open_stream([tiny_store], cfg) as s:
        resumed = train(cfg, s, tmp_path / "cut", resume=True, progress=False)
    assert resumed.best_step == full.best_step
    a = read_checkpoint(tmp_path / "full", latest=True).meta["early_stop"]
    b = read_checkpoint(tmp_path / "cut", latest=True).meta["early_stop"]
    assert a == b  # the parameters' equality: the loop's own resume test


@pytest.mark.slow
def test_a_wsd_run_that_stops_improving_cools_down_and_resumes_exactly(tiny_store, tmp_path):
    """optim.schedule="wsd": where early stopping would stop at the peak rate, the rate decays from there (over
    half the lengthened run here) and the run ends where it does; a resume inside the decay ends identically."""
    cfg = _cfg(optim={"schedule": "wsd", "cooldown_fraction": 0.5},
               loop={"max_steps": 40, "val_every": 2, "ckpt_every": 3, "patience": 2, "min_delta": 0.9})
    with open_stream([tiny_store], cfg) as s:
        full = train(cfg, s, tmp_path / "full", progress=False)
    assert full.stopped_early and full.step == 8  # stalled at step 4, then 4 steps of decay
    lr = dict(read_scalars(tmp_path / "full" / "scalars.csv")["lr/adamw"])
    assert lr[4] == pytest.approx(3e-3) and lr[6] == pytest.approx(3e-3 * 0.55) and lr[8] == pytest.approx(3e-4)
    meta = read_checkpoint(tmp_path / "full", latest=True).meta
    assert meta["cooldown"] == {"at": 4, "run_steps": 40} and meta["config"]["loop"]["max_steps"] == 8
    assert json.loads((tmp_path / "full" / "config.json").read_text())["optim"]["decay_start"] == 4

    def crash(step, _):
        if step == 7:
            raise _Crash  # inside the decay, after the checkpoint of step 6

    with pytest.raises(_Crash), open_stream([tiny_store], cfg) as s:
        train(cfg, s, tmp_path / "cut", progress=False, on_step=crash)
    with open_stream([tiny_store], cfg) as s:
        resumed = train(cfg, s, tmp_path / "cut", resume=True, progress=False)
    assert resumed.step == 8
    for a, b in zip(_leaves(full.params), _leaves(resumed.params), strict=True):
        np.testing.assert_array_equal(a, b)
    # the seed's cosine stops where the validation stalled
    with open_stream([tiny_store], cfg) as s:
        cosine = train(overlay(cfg, {"optim": {"schedule": "cosine"}}), s, tmp_path / "cosine", progress=False)
    assert cosine.stopped_early and cosine.step == 4


@pytest.mark.parametrize("record", [{"at": 4}, {"at": "x", "run_steps": 40}, {"at": 50, "run_steps": 40}, [4, 40]])
def test_a_damaged_cooldown_record_is_named_not_a_traceback(record, tmp_path):
    with pytest.raises(ConfluenceError, match="cooldown record is damaged"):
        cooldown_record({"cooldown": record}, tmp_path / "run")
    assert cooldown_record({}, tmp_path) is None
    assert cooldown_record({"cooldown": {"at": 4, "run_steps": 40}}, tmp_path) == {"at": 4, "run_steps": 40}


@pytest.mark.slow
def test_a_time_budget_is_measured_and_kept(tiny_store, tmp_path):
    cfg = _cfg(loop={"max_steps": "15s", "val_every": 5, "ckpt_every": 1000, "log_every": 5})
    t0 = time.monotonic()
    with open_stream([tiny_store], cfg) as s:
        res = train(cfg, s, tmp_path / "run", progress=False)
    elapsed = time.monotonic() - t0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["loop"]["max_steps"]
    assert isinstance(saved, int) and saved >= 1 and res.step <= saved
    assert read_checkpoint(tmp_path / "run", latest=True).meta["config"]["loop"]["max_steps"] == saved
    assert elapsed < 15 + 60  # the deadline stops it (a generous bound: compiling is not part of the estimate)


def test_cli_refuses_two_lengths(tmp_path):
    r = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "r"), "--db", str(tmp_path), "--max-steps", "5",
                                 "--budget", "10m"])
    assert r.exit_code != 0 and "--max-steps and --budget" in r.output


def test_a_time_budget_validates_at_the_recipe_interval_until_its_steps_are_measured(tiny_store):
    """The "auto" count only stands in for a duration's schedule: its sparse validation interval is not kept."""
    cfg = _cfg(loop={"max_steps": "10m", "val_every": 7})
    with open_stream([tiny_store], cfg) as s:
        resolved, duration, said = resolve_length(cfg, s, None)
    assert (duration, said, resolved.loop.val_every) == (600.0, None, 7)
    assert resolved.loop.max_steps == auto_steps(task_anchor_counts(s), cfg.sampler.batch_size)
