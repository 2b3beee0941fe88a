"""Training: a few CPU steps reduce the loss; train -> kill -> resume equals an uninterrupted run; fine-tuning
initialisation; gradient accumulation; checkpoints; configuration files."""

import json

import jax
import numpy as np
import pytest

from confluence.model.inputs import DbTables, batch_to_inputs
from confluence.training.checkpoint import read_meta
from confluence.training.data import SyntheticSource
from confluence.training.logs import read_scalars
from confluence.training.loop import train
from confluence.training.presets import ConfigError, load_config
from confluence.training.step import get_trainer, make_mesh, replicate, shard_inputs
from tests.conftest_model import tiny_model, tiny_train_config


def _source(cfg):
    return SyntheticSource(1, d_t=cfg.model.d_t, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                           max_rows=cfg.max_rows, seed=cfg.seed)


def _leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


@pytest.mark.slow
def test_a_few_cpu_steps_reduce_the_loss():
    cfg = tiny_train_config(optim={"warmup_steps": 3, "total_steps": 40})
    src = _source(cfg)
    model = tiny_model(cfg.model)
    tr = get_trainer(cfg.model, cfg.optim, cfg.loss)
    mesh = make_mesh()
    params, opt = (replicate(x, mesh) for x in tr.init_state(model))
    db = src.databases[0]
    tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, cfg.loss.max_k)
    tabs = replicate((tb.column_embeddings, tb.categorical_embeddings), mesh)
    task = src.tasks[0]  # numerical target
    val = [shard_inputs(batch_to_inputs(src.val_batch(task, i)), mesh) for i in range(2)]

    def val_loss(p):
        return float(np.mean([float(tr.eval_loss(p, v, *tabs)[0]) for v in val]))

    before = val_loss(params)
    for step in range(40):
        params, opt, m = tr.step(params, opt, [(shard_inputs(batch_to_inputs(src.train_batch(task)), mesh), *tabs)],
                                 step)
    after = val_loss(params)
    assert np.isfinite(after) and after < 0.7 * before, (before, after)


class _Crash(Exception):
    pass


@pytest.mark.slow
def test_train_kill_resume_equals_uninterrupted(tmp_path):
    cfg = tiny_train_config(max_steps=6, ckpt_every=3, val_every=3)
    full = train(cfg, _source(cfg), tmp_path / "full", progress=False)

    def crash(step, _):
        if step == 5:
            raise _Crash  # dies after step 5, whose state was never checkpointed (last checkpoint: step 3)

    with pytest.raises(_Crash):
        train(cfg, _source(cfg), tmp_path / "cut", progress=False, on_step=crash)
    assert read_meta(tmp_path / "cut").step == 3
    resumed = train(cfg, _source(cfg), tmp_path / "cut", resume=True, progress=False)
    assert resumed.step == full.step == 6
    for a, b in zip(_leaves(full.params), _leaves(resumed.params), strict=True):
        np.testing.assert_array_equal(a, b)
    steps = [s for s, _ in read_scalars(tmp_path / "cut" / "scalars.csv")["train/loss"]]
    assert steps == sorted(set(steps)) == list(range(1, 7))  # no repeated or skipped steps in the log
    meta = read_meta(tmp_path / "full").meta
    assert meta["step"] == 6 and meta["config"]["model"] == cfg.model.to_dict()
    assert set(meta["pipeline"]) == {t.key for t in _source(cfg).tasks} and "task_sampler" in meta["rng"]
    assert not list((tmp_path / "full" / "checkpoints").glob(".tmp*"))
    assert "val/synthetic0/orders.amount/loss" in read_scalars(tmp_path / "full" / "scalars.csv")


def test_init_from_checkpoint_loads_the_parameters(tmp_path):
    cfg = tiny_train_config(max_steps=3, ckpt_every=3, val_every=3)
    first = train(cfg, _source(cfg), tmp_path / "a", progress=False)
    fine = train(cfg, _source(cfg), tmp_path / "b", init_from=tmp_path / "a", max_steps=0, progress=False)
    for a, b in zip(_leaves(first.params), _leaves(fine.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_gradient_accumulation_of_identical_micro_batches_equals_one_batch():
    cfg = tiny_train_config()
    src = _source(cfg)
    tr = get_trainer(cfg.model, cfg.optim, cfg.loss)
    mesh = make_mesh()
    db = src.databases[0]
    tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, cfg.loss.max_k)
    tabs = replicate((tb.column_embeddings, tb.categorical_embeddings), mesh)
    micro = (shard_inputs(batch_to_inputs(src.train_batch(src.tasks[3])), mesh), *tabs)
    outs = []
    for n in (1, 2):
        params, opt = (replicate(x, mesh) for x in tr.init_state(tiny_model(cfg.model)))
        params, opt, m = tr.step(params, opt, [micro] * n, 0)
        params, opt, m = tr.step(params, opt, [micro] * n, 1)
        outs.append(_leaves(params))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_config_files_and_errors(tmp_path):
    small = load_config("small")
    assert small.model.d_model == 64 and load_config("base").model.d_model == 256
    f = tmp_path / "c.toml"
    f.write_text('preset = "small"\nbatch_size = 8\n[model]\nn_layers = 3\n[optim]\nlr_adamw = 0.001\n')
    c = load_config(str(f))
    assert (c.batch_size, c.model.n_layers, c.optim.lr_adamw, c.seq_len) == (8, 3, 0.001, small.seq_len)
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"preset": "base", "max_steps": 7}))
    assert load_config(str(j)).max_steps == 7
    j.write_text(json.dumps({"bogus": 1}))
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(str(j))
    with pytest.raises(ConfigError, match="neither a preset"):
        load_config("nope")
    with pytest.raises(ConfigError, match="n_heads"):
        load_config("small", {"model": {"n_heads": 5}})
