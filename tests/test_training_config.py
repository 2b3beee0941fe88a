"""The configuration tree: recipes as files, `extends`, one overlay rule for files and `--set`, one error type that
names the setting, the schedule following the run length, and configs of the older flat layout."""

import json
from dataclasses import replace

import pytest

from confluence.errors import ConfigError
from confluence.sampler.config import SamplerConfig
from confluence.toolkit.config import overlay, parse_sets
from confluence.training.config import RunConfig, describe_changes, load_config, migrate, recipes


def test_recipes_are_files_and_load_by_name():
    assert {"small", "base", "demo"} <= set(recipes())
    small, base, demo = load_config("small"), load_config("base"), load_config("demo")
    assert (small.model.d_model, small.sampler.seq_len, small.loop.max_steps) == (64, 128, "auto")
    assert (small.loop.patience, demo.loop.patience) == (5, 0)  # the demo trains its fixed steps to the end
    assert (base.model.n_layers, base.sampler.batch_size, base.model.attention_impl) == (12, 32, "auto")
    # the demo's recipe: `small` plus the settings the demo measured better
    # (its model, except the column codes and arrival pretrained:small-v5 was made without, which it pins off)
    assert demo.model == replace(small.model, column_codes=0.0, time_reference_gate="learned", arrival=False)
    assert demo.loop == replace(small.loop, patience=0)
    assert (demo.loss.numeric_loss, demo.sampler.recent, demo.sampler.width_per_fk, demo.sampler.child_counts,
            demo.sampler.task_recent) == ("median", 16, True, "anchor", {"flights.dep_at": 0})
    # `small`, the recipe of `confluence train` without --config: column codes and the anchor's windowed counts
    # (docs/design/decisions.md, "Column codes"); demo and pretrain-small keep the inputs pretrained:small was made with
    assert (small.model.column_codes, small.sampler.child_counts, small.sampler.child_count_windows) == (
        1.0, "anchor", (1, 7, 30, 90, 365))
    assert demo.sampler.child_count_windows == ()
    pre = load_config("pretrain-small")
    assert (pre.model.column_codes, pre.sampler.child_counts, pre.sampler.child_count_windows) == (0.0, "none", ())
    # both pretraining recipes predict times from a visible time (docs/design/decisions.md, "The time reference in pretraining")
    assert pre.model.time_reference and load_config("pretrain-base").model.time_reference
    # ... and a "when next" time as the observation time plus a wait (docs/design/decisions.md, "Waits in pretraining")
    assert pre.model.time_wait and load_config("pretrain-base").model.time_wait
    assert RunConfig.from_dict(demo.to_dict()) == demo  # round trip through a checkpoint's JSON


def test_files_extend_recipes_and_each_other(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "small"\nseed = 5\n[sampler]\nbatch_size = 8\nrow_buckets = [8, 16]\n')
    (tmp_path / "b.json").write_text(json.dumps({"extends": "a.toml", "model": {"n_layers": 3}}))
    c = load_config(str(tmp_path / "b.json"))
    assert (c.seed, c.sampler.batch_size, c.sampler.row_buckets, c.model.n_layers, c.model.d_model) == (
        5, 8, (8, 16), 3, 64)
    (tmp_path / "loop.toml").write_text('extends = "loop.toml"\n')
    with pytest.raises(ConfigError, match="in a circle"):
        load_config(str(tmp_path / "loop.toml"))


def test_errors_name_the_setting(tmp_path):
    cases = [
        ({"sampler": {"widht": 3}}, "sampler.widht", "unknown setting"),
        ({"sampler": {"recent": 99}}, "sampler.recent", "0..width"),
        ({"sampler": {"child_counts": "some"}}, "sampler.child_counts", "'none', 'anchor', 'all'"),
        ({"sampler": {"split": {"fractions": [0.5, 0.5]}}}, "sampler.split.fractions", "list of 3"),
        ({"model": {"n_heads": 5}}, "model.d_model", "not divisible by n_heads"),
        ({"loss": {"numeric_loss": "l3"}}, "loss.numeric_loss", "'huber', 'median'"),
        ({"optim": {"lr_muon": "fast"}}, "optim.lr_muon", "must be a number"),
        ({"loop": {"max_steps": 2.5}}, "loop.max_steps", "must be an integer"),
        ({"seed": True}, "seed", "must be an integer"),
        ({"model": 3}, "model", "table of settings"),
    ]
    for change, setting, problem in cases:
        with pytest.raises(ConfigError, match=problem) as info:
            load_config("small", change)
        assert info.value.setting == setting and setting in str(info.value)
    with pytest.raises(ConfigError, match="neither a recipe"):
        load_config("nope")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(str(bad))


def test_set_values_are_read_as_json_and_fit_the_declared_types():
    sets = parse_sets(["sampler.row_buckets=[8, 16]", "optim.lr_adamw=1e-3", "sampler.child_counts=anchor",
                       "sampler.task_weights={\"a\": 2}", "loop.max_steps=1e3", "optim.total_steps=null"])
    c = load_config("small", sets)
    assert c.sampler.row_buckets == (8, 16) and c.optim.lr_adamw == 0.001 and c.sampler.child_counts == "anchor"
    assert c.sampler.task_weights == {"a": 2.0} and c.loop.max_steps == 1000 and c.optim.total_steps is None
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_sets(["model.n_layers"])
    # every section validates itself, also when built directly
    with pytest.raises(ConfigError, match="recent"):
        SamplerConfig(width=4, recent=5)
    assert overlay(SamplerConfig(), {"split": {"mode": "temporal", "t_val": 1, "t_test": 2}}).split.t_test == 2


def test_the_schedule_follows_the_run_length():
    small = load_config("small")
    o = small.optim.for_run(400)
    assert (o.warmup_steps, o.total_steps) == (20, 400)
    short = small.with_max_steps(50).optim.for_run(50)
    assert (short.warmup_steps, short.total_steps) == (2, 50)  # a 50-step run does not stop at peak learning rate
    long = small.with_max_steps(24_000)
    assert long.optim.for_run(24_000).warmup_steps == 1200
    base = load_config("base").optim  # seed 000: ~2,000 warmup steps or ~1 % of the run, whichever is larger
    assert base.for_run(100_000).warmup_steps == 2000 and base.for_run(1_000_000).warmup_steps == 10_000
    fixed = load_config("small", {"optim": {"total_steps": 400}}).with_max_steps(50).optim.for_run(50)
    assert fixed.total_steps == 400  # an explicit span is kept


def test_configs_of_the_flat_layout_still_load():
    """Checkpoints and files written before the configuration tree (one flat TrainConfig) keep working."""
    old = {"model": load_config("small").model.__dict__ | {}, "optim": {"lr_muon": 0.02, "lr_adamw": 0.003,
           "warmup_steps": 20, "total_steps": 400}, "loss": {"max_k": 128, "numeric_loss": "median"},
           "batch_size": 16, "seq_len": 128, "max_rows": 32, "grad_accum": 1, "max_steps": 400, "val_every": 100,
           "val_batches": 2, "ckpt_every": 100, "keep_checkpoints": 3, "log_every": 10, "seed": 0,
           "task_weighting": "db_uniform", "sampler": {"recent": 16, "seed": 0, "rank": 0, "world_size": 1}}
    c = RunConfig.from_dict(old)
    assert (c.sampler.batch_size, c.sampler.recent, c.sampler.task_choice, c.loop.max_steps, c.loop.val_every,
            c.optim.total_steps, c.loss.numeric_loss) == (16, 16, "database_first", 400, 100, 400, "median")
    assert migrate({"preset": "small"}) == {"extends": "small"}
    assert migrate(c.to_dict()) == c.to_dict()


def test_runs_saved_before_perm_tile_keep_their_row_orders():
    """A checkpoint's config without `sampler.perm_tile` (saved before it existed) resumes with seed 000's orders
    (0), the batches it trained on; a recipe, or a config saved since, gets the tile-aware default or its own."""
    saved = load_config("small").to_dict()
    assert saved["sampler"]["perm_tile"] == 64
    del saved["sampler"]["perm_tile"]
    assert RunConfig.from_dict(saved).sampler.perm_tile == 0
    assert RunConfig.from_dict(load_config("small").to_dict()).sampler.perm_tile == 64
    assert load_config("small").sampler.perm_tile == 64


def test_describe_changes_lists_what_differs():
    a = load_config("small")
    b = load_config("small", {"loop": {"max_steps": 800}, "sampler": {"task_weights": {"x": 2}}})
    assert describe_changes(a, b) == ["loop.max_steps: 'auto' -> 800", "sampler.task_weights: None -> {'x': 2.0}"]


def test_defaults_are_what_ships_and_the_seed_is_a_recipe():
    """The configuration classes default to the inputs `small` ships (what `confluence train` uses); the seeds'
    exact model is the recipe `seed` (`base` starts from it); a saved config that does not name an input (saved
    before it existed) reads it at the seed's value, so an old checkpoint loads as it was trained."""
    from confluence.model.config import ModelConfig
    from confluence.model.transformer import RelationalTransformer, count_params

    small, default, seed = load_config("small"), RunConfig(), load_config("seed")
    for name in ModelConfig.SEED:
        assert getattr(default.model, name) == getattr(small.model, name), name
        assert getattr(seed.model, name) == ModelConfig.SEED[name], name
    for name in SamplerConfig.SEED:
        assert getattr(default.sampler, name) == getattr(small.sampler, name), name
        assert getattr(seed.sampler, name) == SamplerConfig.SEED[name], name
    assert RunConfig.from_dict({}) == seed  # an old checkpoint's config: the seed's inputs where it names none
    assert load_config("base").model == replace(seed.model, attention_impl="auto")
    # seed 000's dimensions (B, S, D_t, D) and seed 001's SwiGLU width (8/3 D rounded up to 256)
    m = seed.model
    assert (seed.sampler.batch_size, seed.sampler.seq_len, m.d_t, m.d_model, m.d_ff) == (32, 1024, 256, 256, 768)
    # ... and the seeds' heads exactly (seed 004: 70,418 parameters at D = 256), none of the heads added since
    import jax

    one_layer = RelationalTransformer(replace(m, n_layers=1), key=jax.random.key(0))
    assert count_params(one_layer.heads) == 70_418
    shipped = RelationalTransformer(replace(default.model, n_layers=1), key=jax.random.key(0))
    assert count_params(shipped) > count_params(one_layer)  # the shipped inputs add the copy head, the time reference
