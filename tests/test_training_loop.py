"""Training on a real store through the batch stream: a few CPU steps reduce the loss; train -> kill -> resume
equals an uninterrupted run; fine-tuning initialisation; task weights; gradient accumulation; errors."""

import json
import os
import signal
from collections import Counter

import jax
import numpy as np
import pytest

from confluence.errors import ConfigError, ConfluenceError
from confluence.model.inputs import DbTables, batch_to_inputs, fitted_max_k, target_max_k
from confluence.model.transformer import RelationalTransformer
from confluence.toolkit.checkpoint import read_checkpoint
from confluence.toolkit.interrupt import StepBoundaryInterrupt
from confluence.toolkit.logs import read_scalars
from confluence.toolkit.mesh import make_mesh, replicate
from confluence.toolkit.provenance import code_provenance
from confluence.training.loop import fit_max_k, open_stream, train
from confluence.training.step import is_param, shard_inputs
from tests.fixtures.model import tiny_batch, tiny_db, tiny_model, tiny_run_config, tiny_trainer

STORE_SAMPLER = {"seq_len": 48, "max_rows": 16, "row_buckets": [16], "text_buckets": [64], "width": 4}


def _cfg(**changes):
    return tiny_run_config(**{"sampler": STORE_SAMPLER, **changes})


def _leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


@pytest.mark.slow
def test_a_few_cpu_steps_reduce_the_loss(tiny_store):
    cfg = _cfg(optim={"warmup_steps": 3, "total_steps": 60, "lr_adamw": 3e-3}, loop={"max_steps": 60})
    with open_stream([tiny_store], cfg) as stream:
        tr = tiny_trainer(cfg)
        mesh = make_mesh()
        params, opt = (replicate(x, mesh) for x in tr.init_state(tiny_model(cfg.model)))
        tb = DbTables.from_store(stream.stores[0], cfg.loss.max_k)
        tabs = replicate((tb.column_embeddings, tb.categorical_embeddings), mesh)
        # a fixed evaluation set: the first train batch of every task
        fixed = [shard_inputs(batch_to_inputs(next(stream.ordered(e.task.name, stream.train_seed_ids(e)[:4]))), mesh)
                 for e in stream.tasks]

        def loss(p):
            return float(np.mean([float(tr.eval_loss(p, f, *tabs)[0]) for f in fixed]))

        before = loss(params)
        for step in range(60):
            micro = (shard_inputs(batch_to_inputs(stream.next_train()), mesh), *tabs)
            params, opt, _ = tr.step(params, opt, [micro], step)
        after = loss(params)
    assert np.isfinite(after) and after < 0.8 * before, (before, after)


class _Crash(Exception):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [{}, {"threads": 2, "prefetch": 3}, {"prefetch": 0}])
def test_train_kill_resume_equals_uninterrupted(tiny_store, tmp_path, sampler):
    cfg = _cfg(sampler={**STORE_SAMPLER, **sampler}, loop={"max_steps": 6, "ckpt_every": 3, "val_every": 3})
    with open_stream([tiny_store], cfg) as s:
        full = train(cfg, s, tmp_path / "full", progress=False)

    def crash(step, _):
        if step == 5:
            raise _Crash  # dies after step 5, whose state was never checkpointed (last checkpoint: step 3)

    with pytest.raises(_Crash), open_stream([tiny_store], cfg) as s:
        train(cfg, s, tmp_path / "cut", progress=False, on_step=crash)
    assert read_checkpoint(tmp_path / "cut").step == 3
    with open_stream([tiny_store], cfg) as s:
        resumed = train(cfg, s, tmp_path / "cut", resume=True, progress=False)
    assert resumed.step == full.step == 6
    for a, b in zip(_leaves(full.params), _leaves(resumed.params), strict=True):
        np.testing.assert_array_equal(a, b)
    steps = [s for s, _ in read_scalars(tmp_path / "cut" / "scalars.csv")["train/loss"]]
    assert steps == sorted(set(steps)) == list(range(1, 7))  # no repeated or skipped steps in the log
    from tests.test_toolkit_tensorboard import events

    assert [s for s, _ in events(tmp_path / "cut")["train/loss"]] == steps  # TensorBoard shows the same one curve
    meta = read_checkpoint(tmp_path / "full").meta
    assert meta["step"] == 6 and meta["config"] == cfg.to_dict()
    assert meta["code"] == code_provenance()  # the code that trained it, recorded (tests/test_provenance.py)
    with open_stream([tiny_store], cfg) as s:
        assert set(meta["stream"]["streams"]) == {e.key for e in s.tasks} and "tasks" in meta["stream"]
    assert not list((tmp_path / "full" / "checkpoints").glob(".tmp*"))
    assert "val/bookstore/order_rating/loss" in read_scalars(tmp_path / "full" / "scalars.csv")


@pytest.mark.slow
def test_a_step_larger_than_the_device_is_refused_before_it_runs(tiny_store, tmp_path, monkeypatch):
    import confluence.toolkit.memory as memory

    cfg = _cfg(loop={"max_steps": 2, "val_every": 2, "grad_accum": 2})
    limit = {"bytes": 1}
    monkeypatch.setattr(memory, "device_limit", lambda device=None: limit["bytes"])
    with pytest.raises(ConfluenceError, match=r"a training step of \d+ sequences of 48 cells needs .* but the device "
                                              r"holds .*: lower sampler.batch_size and raise loop.grad_accum"), \
            open_stream([tiny_store], cfg) as s:
        train(cfg, s, tmp_path / "run", progress=False)
    assert not any((tmp_path / "run").iterdir())  # no step ran, and the new run left nothing behind
    limit["bytes"] = 2**40  # room: the same run trains, into the same directory
    with open_stream([tiny_store], cfg) as s:
        assert train(cfg, s, tmp_path / "run", progress=False).step == 2


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler in place (as in a terminal), whatever the test runner set."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_ctrl_c_stops_after_the_step_in_flight_and_resumes_exactly(tiny_store, tmp_path, python_sigint, monkeypatch):
    """SIGINT while a step runs (Ctrl-C, `timeout -s INT`) ends the run after that step with a checkpoint of it (a
    KeyboardInterrupt raised inside the step would leave its donated state deleted: no checkpoint could be written),
    and resuming it gives the uninterrupted run's parameters."""
    from confluence.training.step import Trainer

    cfg = _cfg(loop={"max_steps": 6, "ckpt_every": 3, "val_every": 3})
    with open_stream([tiny_store], cfg) as s:
        full = train(cfg, s, tmp_path / "full", progress=False)
    real_step = Trainer.step

    def step_interrupted(self, params, opt_state, micro, step):
        out = real_step(self, params, opt_state, micro, step)  # the inputs are donated by now
        if step == 3:  # the fourth step
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(Trainer, "step", step_interrupted)
    with pytest.raises(KeyboardInterrupt), open_stream([tiny_store], cfg) as s:
        train(cfg, s, tmp_path / "cut", progress=False)
    monkeypatch.setattr(Trainer, "step", real_step)
    assert read_checkpoint(tmp_path / "cut").step == 4  # the step in flight, not the last periodic one (3)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the run's handler is gone
    with open_stream([tiny_store], cfg) as s:
        resumed = train(cfg, s, tmp_path / "cut", resume=True, progress=False)
    for a, b in zip(_leaves(full.params), _leaves(resumed.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_step_boundary_interrupt_records_the_first_sigint_and_raises_on_the_second(python_sigint):
    with StepBoundaryInterrupt() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job: SIGINT ignored, and left so
    with StepBoundaryInterrupt() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert not stop.requested
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_the_stream_position_continues_the_same_batches(tiny_store):
    cfg = _cfg()
    with open_stream([tiny_store], cfg) as a, open_stream([tiny_store], cfg) as b:
        ref = [a.next_train().seed_ids.tolist() for _ in range(12)]
        for _ in range(5):
            b.next_train()
        pos = b.position()
        b.restore(json.loads(json.dumps(pos)))  # through JSON, as a checkpoint stores it
        assert [b.next_train().seed_ids.tolist() for _ in range(7)] == ref[5:]


def test_init_from_checkpoint_loads_the_parameters(tiny_store, tmp_path):
    cfg = _cfg(loop={"max_steps": 3, "ckpt_every": 3, "val_every": 3})
    with open_stream([tiny_store], cfg) as s:
        first = train(cfg, s, tmp_path / "a", progress=False)
    with open_stream([tiny_store], cfg) as s:
        fine = train(cfg.with_max_steps(0), s, tmp_path / "b", init_from=tmp_path / "a", progress=False)
    for a, b in zip(_leaves(first.params), _leaves(fine.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_init_from_a_checkpoint_with_other_input_codes_warns_and_loads(tiny_store, tmp_path):
    """Codes shape no parameter, so a checkpoint made without column codes loads into a run with them (the demo's
    recipe fine-tunes pretrained:small-v5; a user's `--config small` would meet this): the run says its inputs shift."""
    import dataclasses
    import warnings

    cfg = _cfg(loop={"max_steps": 3, "ckpt_every": 3, "val_every": 3})
    with open_stream([tiny_store], cfg) as s:
        first = train(cfg, s, tmp_path / "a", progress=False)
    coded = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, column_codes=1.0)).with_max_steps(0)
    with open_stream([tiny_store], coded) as s, pytest.warns(UserWarning, match=r"model\.column_codes = 0\.0 there"):
        fine = train(coded, s, tmp_path / "b", init_from=tmp_path / "a", progress=False)
    for a, b in zip(_leaves(first.params), _leaves(fine.params), strict=True):
        np.testing.assert_array_equal(a, b)
    with open_stream([tiny_store], cfg) as s, warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*input codes.*")
        train(cfg.with_max_steps(0), s, tmp_path / "c", init_from=tmp_path / "a", progress=False)


@pytest.mark.parametrize("added", [("copy_head",), ("child_rank",), ("copy_head", "child_rank"),
                                   ("time_reference",), ("copy_head", "time_reference"), ("attention_sink",),
                                   ("arrival",), ("time_wait", "time_reference")])
def test_init_from_a_checkpoint_without_added_parts_loads_the_rest(tiny_store, tmp_path, added):
    """A run with `model.copy_head` / `child_rank` / `time_reference` / `attention_sink` / `arrival` (or the time
    reference with its waits, `make demo`'s path from `pretrained:small-v5`) starts from a checkpoint made without them: every other parameter is the checkpoint's, the added parts are the new run's own
    initialisation."""
    import dataclasses

    import equinox as eqx

    from confluence.training.loop import ADDED_PARTS

    cfg = _cfg(loop={"max_steps": 3, "ckpt_every": 3, "val_every": 3})
    with open_stream([tiny_store], cfg) as s:
        first = train(cfg, s, tmp_path / "a", progress=False)
    on = {name: ("inbound", "column") if name == "attention_sink" else True for name in added}
    new_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **on)).with_max_steps(0)
    with open_stream([tiny_store], new_cfg) as s:
        fine = train(new_cfg, s, tmp_path / "b", init_from=tmp_path / "a", progress=False)
    without = fine.params
    for name in added:
        parts = ADDED_PARTS[name](without)
        none = (None,) * len(parts) if isinstance(parts, tuple) else None
        without = eqx.tree_at(ADDED_PARTS[name], without, none, is_leaf=lambda x: x is None)
    for a, b in zip(_leaves(first.params), _leaves(without), strict=True):
        np.testing.assert_array_equal(a, b)
    fresh = RelationalTransformer(new_cfg.model, key=jax.random.key(new_cfg.seed))
    # this run's tree, static settings included (training combines it with this run's static parts)
    assert jax.tree.structure(fine.params) == jax.tree.structure(eqx.partition(fresh, is_param)[0])
    for name in added:
        new = _leaves(ADDED_PARTS[name](fine.params))
        assert new
        for a, b in zip(_leaves(ADDED_PARTS[name](fresh)), new, strict=True):
            np.testing.assert_array_equal(a, b)


def test_init_from_a_time_reference_without_waits_grafts_them(tiny_store, tmp_path):
    """`model.time_wait` adds one decoder inside the time reference: a checkpoint made with the reference but
    without it loads, the decoder starting from the new run's initialisation; without the reference it is moot."""
    import dataclasses

    import equinox as eqx

    from confluence.training.loop import ADDED_PARTS

    cfg = _cfg(loop={"max_steps": 3, "ckpt_every": 3, "val_every": 3})
    ref = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, time_reference=True, time_wait=False))
    with open_stream([tiny_store], ref) as s:
        first = train(ref, s, tmp_path / "a", progress=False)
    new_cfg = dataclasses.replace(ref, model=dataclasses.replace(ref.model, time_wait=True)).with_max_steps(0)
    with open_stream([tiny_store], new_cfg) as s:
        fine = train(new_cfg, s, tmp_path / "b", init_from=tmp_path / "a", progress=False)
    shared = eqx.tree_at(ADDED_PARTS["time_wait"], fine.params, None, is_leaf=lambda x: x is None)
    for a, b in zip(_leaves(first.params), _leaves(shared), strict=True):
        np.testing.assert_array_equal(a, b)
    fresh = RelationalTransformer(new_cfg.model, key=jax.random.key(new_cfg.seed))
    for a, b in zip(_leaves(ADDED_PARTS["time_wait"](fresh)), _leaves(ADDED_PARTS["time_wait"](fine.params)),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    # waits without the time reference: nothing to graft, the checkpoint loads as it is
    plain = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, time_wait=False))
    with open_stream([tiny_store], plain) as s:
        train(plain, s, tmp_path / "c", progress=False)
    moot = dataclasses.replace(plain, model=dataclasses.replace(plain.model, time_wait=True)).with_max_steps(0)
    with open_stream([tiny_store], moot) as s:
        again = train(moot, s, tmp_path / "d", init_from=tmp_path / "c", progress=False)
    assert again.params.time_ref is None


def test_init_from_grafts_added_parts_when_only_parameterless_settings_differ(tiny_store, tmp_path):
    """`make demo`'s path: the shipped model copies medians (`copy_numbers`, which shapes no parameter) and has no
    time reference; a run copying means with the time reference still starts from it."""
    import dataclasses

    import equinox as eqx

    from confluence.training.loop import ADDED_PARTS

    cfg = _cfg(model={**tiny_run_config().to_dict()["model"], "copy_head": True, "copy_numbers": "median"},
               loop={"max_steps": 3, "ckpt_every": 3, "val_every": 3})
    with open_stream([tiny_store], cfg) as s:
        first = train(cfg, s, tmp_path / "a", progress=False)
    new_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, copy_numbers="mean",
                                                                 time_reference=True)).with_max_steps(0)
    with open_stream([tiny_store], new_cfg) as s:
        fine = train(new_cfg, s, tmp_path / "b", init_from=tmp_path / "a", progress=False)
    shared = eqx.tree_at(ADDED_PARTS["time_reference"], fine.params, None, is_leaf=lambda x: x is None)
    for a, b in zip(_leaves(first.params), _leaves(shared), strict=True):
        np.testing.assert_array_equal(a, b)
    fresh = eqx.partition(RelationalTransformer(new_cfg.model, key=jax.random.key(0)), is_param)[0]
    assert jax.tree.structure(fine.params) == jax.tree.structure(fresh)
    # a setting that shapes parameters still names itself
    other = dataclasses.replace(new_cfg, model=dataclasses.replace(new_cfg.model, d_model=32, n_heads=2))
    with open_stream([tiny_store], other) as s, pytest.raises(ConfluenceError, match="d_model"):
        train(other, s, tmp_path / "c", init_from=tmp_path / "a", progress=False)


def test_the_time_reference_changes_nothing_where_no_task_is_a_timestamp(tiny_store, tmp_path):
    """`model.time_reference` only moves timestamp predictions: trained without the store's timestamp task, every
    parameter the two models share ends bit for bit as without it (so the planted benchmark, which has no timestamp
    target, is unchanged by it)."""
    import dataclasses

    import equinox as eqx

    from confluence.training.loop import ADDED_PARTS

    weights = {"order_time": 0.0}
    cfg = _cfg(sampler={**STORE_SAMPLER, "task_weights": weights}, loop={"max_steps": 4, "val_every": 4,
                                                                         "ckpt_every": 4})
    with_ref = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, time_reference=True))
    runs = []
    for i, c in enumerate((cfg, with_ref)):
        with open_stream([tiny_store], c) as s:
            runs.append(train(c, s, tmp_path / str(i), progress=False).params)
    shared = eqx.tree_at(ADDED_PARTS["time_reference"], runs[1], None, is_leaf=lambda x: x is None)
    for a, b in zip(_leaves(runs[0]), _leaves(shared), strict=True):
        np.testing.assert_array_equal(a, b)


def test_task_weights_decide_which_tasks_training_draws(tiny_store, tmp_path):
    """`sampler.task_weights` changes what training trains on: a zero weight is never drawn, the others in
    proportion to their weights; the loop logs only the drawn tasks' target types."""
    others = ("order_status", "orders_next_30d", "country_upper", "book_genre", "customer_premium", "order_time")
    weights = {"order_rating": 3.0, "bookstore/book_expensive": 1.0, **dict.fromkeys(others, 0.0)}
    cfg = _cfg(sampler={**STORE_SAMPLER, "task_weights": weights}, loop={"max_steps": 4, "val_every": 4,
                                                                         "ckpt_every": 4})
    with open_stream([tiny_store], cfg) as s:
        probs = s.task_probabilities()
        assert probs == pytest.approx({"bookstore/order_rating": 0.75, "bookstore/book_expensive": 0.25,
                                       **{f"bookstore/{t}": 0 for t in others}})
        drawn = Counter(s.sampler.data[0].tasks[s.next_train().task_idx].name for _ in range(400))
    assert set(drawn) == {"order_rating", "book_expensive"}
    assert 0.68 < drawn["order_rating"] / 400 < 0.82
    with open_stream([tiny_store], cfg) as s:
        train(cfg, s, tmp_path / "run", progress=False)
    tags = set(read_scalars(tmp_path / "run" / "scalars.csv"))
    assert {"train/loss_numerical", "train/loss_boolean"} >= {t for t in tags if t.startswith("train/loss_")}
    # the default draws every task uniformly; "seeds" in proportion to each task's train seeds
    with open_stream([tiny_store], _cfg()) as s:
        assert list(s.task_probabilities().values()) == pytest.approx([1 / 8] * 8)
    seeds = _cfg(sampler={**STORE_SAMPLER, "task_choice": "seeds"})
    with open_stream([tiny_store], seeds) as s:
        n = {e.key: s.train_seed_ids(e).shape[0] for e in s.tasks}
        assert s.task_probabilities() == pytest.approx({k: v / sum(n.values()) for k, v in n.items()})


def test_per_task_sampler_settings_must_name_known_tasks(tiny_store):
    for setting, value in (("task_recent", {"order_ratin": 2}), ("task_weights", {"bookstore/nope": 1.0})):
        with pytest.raises(ConfigError, match=f"sampler.{setting}.*unknown task"):
            open_stream([tiny_store], _cfg(sampler={**STORE_SAMPLER, setting: value}))
    ok = _cfg(sampler={**STORE_SAMPLER, "task_recent": {"order_rating": 2},
                       "task_weights": {"bookstore/order_rating": 2.0}})
    open_stream([tiny_store], ok).close()
    zero = _cfg(sampler={**STORE_SAMPLER, "task_weights": {"order_rating": 0}, "tasks": ["order_rating"]})
    with pytest.raises(ConfigError, match="every task has weight 0"), open_stream([tiny_store], zero) as s:
        s.next_train()


def test_a_too_small_max_k_is_named(tiny_store):
    with open_stream([tiny_store], _cfg()) as s, pytest.raises(ConfluenceError, match="raise `max_k`"):
        DbTables.from_store(s.stores[0], 1)


def test_training_widens_a_too_small_max_k_as_evaluation_does(tiny_store, tmp_path):
    """A categorical target with more classes than the recipe pads to (TPC-H's 150 part types against `small`'s
    128) trains: `loss.max_k` is doubled until it fits, and the run's saved config holds the width it trained with."""
    cfg = _cfg(loss={"max_k": 2}, loop={"max_steps": 2, "val_every": 2, "ckpt_every": 2})
    with open_stream([tiny_store], cfg) as s:
        k, wide = target_max_k(s.stores[0]), fitted_max_k(2, s.stores)
        assert 2 < k <= wide and fit_max_k(cfg, s.stores).loss.max_k == wide
        assert fit_max_k(_cfg(), s.stores) == _cfg()  # wide enough already: unchanged
        res = train(cfg, s, tmp_path / "run", progress=False)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["loss"]["max_k"] == wide and res.val_losses
    assert all(np.isfinite(v) for v in res.val_losses.values())


def test_the_store_must_match_the_model_d_t(tiny_store, tmp_path):
    cfg = _cfg(model={"d_t": 16})
    with open_stream([tiny_store], cfg) as s, pytest.raises(ConfluenceError, match="set model.d_t"):
        train(cfg, s, tmp_path / "run", progress=False)


def test_gradient_accumulation_of_identical_micro_batches_equals_one_batch():
    cfg = tiny_run_config()
    db = tiny_db()
    tr = tiny_trainer(cfg)
    mesh = make_mesh()
    tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, cfg.loss.max_k)
    tabs = replicate((tb.column_embeddings, tb.categorical_embeddings), mesh)
    micro = (shard_inputs(batch_to_inputs(tiny_batch(db, task=3)), mesh), *tabs)
    outs = []
    for n in (1, 2):
        params, opt = (replicate(x, mesh) for x in tr.init_state(tiny_model(cfg.model)))
        params, opt, m = tr.step(params, opt, [micro] * n, 0)
        params, opt, m = tr.step(params, opt, [micro] * n, 1)
        outs.append(_leaves(params))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("reference,wait,expected", [(True, True, True), (True, False, False), (False, True, False)])
def test_waits_are_a_part_only_inside_the_time_reference(reference, wait, expected):
    """`has_part`: the waits' decoder lives in the time reference, so a model without the reference has none to
    graft or to miss, whatever `time_wait` says."""
    import dataclasses

    from confluence.model.config import ModelConfig
    from confluence.training.loop import has_part

    model = dataclasses.replace(ModelConfig(), time_reference=reference, time_wait=wait)
    assert has_part(model, "time_wait") is expected
    assert has_part(model, "time_reference") is reference
