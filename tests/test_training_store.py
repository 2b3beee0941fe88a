"""Training on a real processed store (the preprocessed bookstore) through the sampler."""

import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.model.inputs import DbTables, batch_to_inputs
from confluence.preprocess.pipeline import preprocess
from confluence.training.data import open_store_source
from confluence.training.loop import train
from confluence.training.step import get_trainer, make_mesh, replicate, shard_inputs
from tests.conftest_model import tiny_model, tiny_train_config
from tests.conftest_store import HashEncoder, write_bookstore

SAMPLER = {"row_buckets": [16], "text_buckets": [64], "width": 4}


@pytest.fixture(scope="module")
def bookstore(tmp_path_factory):
    d = tmp_path_factory.mktemp("model_store")
    src, meta = write_bookstore(d)
    return preprocess(src, meta, d / "store", encoder=HashEncoder(16), progress=False)


def _cfg(**kw):
    return tiny_train_config(model={"d_t": 16}, sampler=SAMPLER, max_rows=16, seq_len=48, **kw)


@pytest.mark.slow
def test_a_few_cpu_steps_reduce_the_loss_on_the_bookstore(bookstore):
    cfg = _cfg(optim={"warmup_steps": 3, "total_steps": 60, "lr_adamw": 3e-3})
    src = open_store_source([bookstore], cfg)
    try:
        tr = get_trainer(cfg.model, cfg.optim, cfg.loss)
        mesh = make_mesh()
        params, opt = (replicate(x, mesh) for x in tr.init_state(tiny_model(cfg.model)))
        db = src.databases[0]
        tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, cfg.loss.max_k)
        tabs = replicate((tb.column_embeddings, tb.categorical_embeddings), mesh)
        # A fixed evaluation set: the first train batch of every task.
        fixed = []
        for t in src.tasks:
            ids = src._train_ids[t.key][: cfg.batch_size]
            fixed.append(shard_inputs(batch_to_inputs(src.sampler.batch_for_seeds(t.task_name, ids, t.db_idx)), mesh))

        def loss(p):
            return float(np.mean([float(tr.eval_loss(p, f, *tabs)[0]) for f in fixed]))

        before = loss(params)
        rng = np.random.default_rng(0)
        for step in range(60):
            t = src.tasks[int(rng.integers(len(src.tasks)))]
            micro = (shard_inputs(batch_to_inputs(src.train_batch(t)), mesh), *tabs)
            params, opt, _ = tr.step(params, opt, [micro], step)
        after = loss(params)
        assert np.isfinite(after) and after < 0.8 * before, (before, after)
    finally:
        src.close()


@pytest.mark.slow
def test_train_loop_on_the_bookstore_checkpoints_and_resumes(bookstore, tmp_path):
    cfg = _cfg(max_steps=4, ckpt_every=2, val_every=2)
    src = open_store_source([bookstore], cfg)
    res = train(cfg, src, tmp_path / "run", max_steps=2, progress=False)
    src.close()
    pos = res.step
    src = open_store_source([bookstore], cfg)
    res = train(cfg, src, tmp_path / "run", resume=True, progress=False)
    src.close()
    assert (pos, res.step) == (2, 4) and np.isfinite(res.last_loss)


def test_store_source_rejects_a_too_small_max_k(bookstore):
    cfg = _cfg(loss={"max_k": 1})
    src = open_store_source([bookstore], cfg)
    try:
        db = src.databases[0]
        with pytest.raises(ConfluenceError, match="raise `max_k`"):
            DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, cfg.loss.max_k)
    finally:
        src.close()


def test_per_task_sampler_settings_must_name_known_tasks(bookstore):
    for setting, value in (("task_recent", {"order_ratin": 2}), ("task_weights", {"bookstore/nope": 1.0})):
        cfg = tiny_train_config(model={"d_t": 16}, sampler={**SAMPLER, setting: value}, max_rows=16, seq_len=48)
        with pytest.raises(ConfluenceError, match=f"{setting}: unknown task"):
            open_store_source([bookstore], cfg)
    ok = tiny_train_config(model={"d_t": 16}, max_rows=16, seq_len=48, sampler={
        **SAMPLER, "task_recent": {"order_rating": 2}, "task_weights": {"bookstore/order_rating": 2.0}})
    open_store_source([bookstore], ok).close()
