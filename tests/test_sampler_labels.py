"""Labelled task rows in the context (`confluence.sampler.labels`): properties over random databases and sampler
settings. No label is known after the seed's observation time; the seed's own label never appears; a phase reads
only the labels of the splits it may (training and validation: train; test: train and validation); the label
cells are visible cells of the task's column; with `labels = 0` the batches are byte-identical to those before
labelled context existed."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import cache

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confluence.errors import ConfigError, ConfluenceError
from confluence.sampler import BatchStream, Sampler, SplitConfig
from confluence.sampler.labels import VIA_LABEL, label_times
from confluence.sampler.splits import split_seed_ids, task_split
from confluence.schema.metadata import parse_horizon
from confluence.store.format import NO_CUTOFF
from confluence.stypes import US_PER_DAY
from confluence.stypes import SemanticType as ST
from tests.fixtures.bookstore import build_bookstore
from tests.fixtures.configs import seed_sampler
from tests.fixtures.graphs import DAY, Col, Tab, TaskSpec, build_store, random_store

BASE = seed_sampler(batch_size=8, seq_len=64, width=2, max_rows=32, row_buckets=(8, 32), text_buckets=(8, 32),
                     split=SplitConfig(fractions=(0.6, 0.3, 0.1)))
HORIZON = "10 days"
# the rule, written out (not read from the module under test): which splits' labels each phase may show
MAY_READ = {"train": ("train",), "val": ("train",), "test": ("train", "val")}


@cache
def history_store(seed: int):
    """Shops (static) with sales (temporal) and a derived task with many labels per shop: the sales of the next
    10 days, observed every 5 days; plus cell-masking tasks on both tables."""
    rng = np.random.default_rng(seed)
    n_shop, n_sale = int(rng.integers(4, 12)), int(rng.integers(60, 200))
    shop = Tab("shop", [Col("shop_id", ST.IDENTIFIER, np.arange(n_shop)),
                        Col("size", ST.NUMERICAL, rng.standard_normal(n_shop))], None)
    day = rng.integers(0, 100, n_sale).astype(np.int64)
    sale = Tab("sale", [Col("sale_id", ST.IDENTIFIER, np.arange(n_sale)),
                        Col("shop", ST.IDENTIFIER, rng.integers(0, n_shop, n_sale), fk="shop"),
                        Col("amount", ST.NUMERICAL, rng.standard_normal(n_sale)),
                        Col("at", ST.TIMESTAMP, day * DAY)], "at")
    query = ("WITH obs AS (SELECT unnest(generate_series(TIMESTAMP '1970-01-01', TIMESTAMP '1970-04-01', "
             "INTERVAL 5 DAY)) AS obs_time) "
             "SELECT s.shop_id, o.obs_time, (SELECT count(*) FROM sale x WHERE x.shop = s.shop_id AND x.at > "
             "o.obs_time AND x.at <= o.obs_time + INTERVAL 10 DAY) AS target FROM shop s, obs o")
    tasks = [TaskSpec("next_sales", "shop", ST.NUMERICAL, query=query, horizon=HORIZON),
             TaskSpec("amount", "sale", ST.NUMERICAL, column="amount"),
             TaskSpec("size", "shop", ST.NUMERICAL, column="size")]
    from tests.fixtures.graphs import _ROOT

    return build_store([shop, sale], tasks, _ROOT / f"history_{seed}", f"history{seed}")


def _phases(sampler: Sampler, stream: BatchStream, e, n_train: int = 3):
    """(context, build results) of training batches of `e`'s task and of its val and test passes."""
    out = []
    name = e.task.name
    for ctx, split in (("train", "train"), ("val", "val"), ("test", "test")):
        ids = sampler.seed_ids(split, name, e.db_idx)
        for lo in range(0, min(len(ids), n_train * sampler.config.batch_size), sampler.config.batch_size):
            out.append((ctx, sampler.build(name, ids[lo: lo + sampler.config.batch_size], e.db_idx, context=ctx)))
    return out


def _check(sampler: Sampler, e, ctx: str, res) -> int:
    """Assert every property of one built batch; returns how many labels it showed."""
    store = sampler.stores[e.db_idx]
    t = e.task
    horizon = store.meta["database"]["tasks"][t.name].get("horizon")
    lt = label_times(t.obs_time, bool(t.is_derived), None if horizon is None else parse_horizon(horizon), t.name)
    cfg = task_split(store, t.name, sampler.config.split)
    allowed = np.concatenate([split_seed_ids(t.name, t.anchor_row, t.obs_time, cfg, sp) for sp in MAY_READ[ctx]])
    x, shown = res.batch, 0
    for b in range(x.batch_size):
        if not x.seq_valid[b]:
            continue
        labs = res.labels[b][res.labels[b] >= 0]
        seed, obs, anchor = int(x.seed_ids[b]), int(x.obs_times[b]), int(x.anchor_rows[b])
        assert len(set(labs.tolist())) == len(labs)
        for s in labs:
            assert lt[s] <= obs, f"label {s} known at {lt[s]} shown at observation time {obs}"
            assert s != seed
            assert not (t.anchor_row[s] == anchor and t.obs_time[s] == obs)
            if not t.is_derived:
                assert t.anchor_row[s] != anchor
            assert s in allowed, f"{ctx} context shows label {s} of another split"
        # the label rows: after the walk's rows, one visible cell of the task's column (+ the observation time)
        nr, n_lab = int(res.nrows[b]), len(labs)
        walk_rows = nr - n_lab
        assert (res.via[b, walk_rows:nr] == VIA_LABEL).all() and (res.via[b, :walk_rows] != VIA_LABEL).all()
        rows_of = x.seq_row_ids[b, : int(res.n_real[b])]
        lab_cells = rows_of >= walk_rows
        assert lab_cells.sum() == n_lab * (2 if t.obs_col >= 0 else 1)
        assert not x.is_target[b, : int(res.n_real[b])][lab_cells].any()
        assert (x.column_ids[b, : int(res.n_real[b])][lab_cells & (x.semantic_types[b, : len(rows_of)] ==
                                                                  t.target_stype)] == t.target_col).all()
        assert x.is_target[b, 0] and x.column_ids[b, 0] == t.target_col  # the query is still there, hidden
        for j, s in enumerate(labs):  # linked to its anchor row when that row is in the context
            in_ctx = np.flatnonzero(res.rows[b, :walk_rows] == t.anchor_row[s])
            if in_ctx.size:
                assert x.fk_adj[b, walk_rows + j, in_ctx[0]]
        # no cell of a walked row is after the observation time (the walk's own guarantee, unchanged)
        if obs != NO_CUTOFF:
            ages = x.row_age[b, : int(res.n_real[b])]
            assert (ages[ages != -1.0] >= 0).all()
        shown += n_lab
    return shown


@pytest.mark.parametrize("seed", [0, 1, 2])
@given(k=st.integers(1, 6), width=st.integers(1, 4), temporal=st.booleans(), sseed=st.integers(0, 3))
def test_labels_respect_time_own_label_and_splits(seed, k, width, temporal, sseed):
    store = history_store(seed)
    split = (SplitConfig(mode="temporal", t_val=40 * US_PER_DAY, t_test=70 * US_PER_DAY) if temporal
             else SplitConfig(seed=sseed, fractions=(0.6, 0.2, 0.2)))
    cfg = replace(BASE, labels=k, width=width, split=split)
    with Sampler([store], cfg, seed=sseed) as sampler, BatchStream(sampler) as stream:
        total = 0
        for e in sampler.entries:
            for ctx, res in _phases(sampler, stream, e):
                total += _check(sampler, e, ctx, res)
    assert total > 0  # the property is not vacuous


def test_the_stream_asks_for_each_phases_labels():
    """Training batches are built in the training context (train labels); a split's pass, the train split's too,
    with the labels of that split's phase (same batches as built directly with that context)."""
    store = history_store(0)
    cfg = replace(BASE, labels=4, prefetch=0, tasks=("next_sales", "amount"),
                  split=SplitConfig(mode="temporal", t_val=40 * US_PER_DAY, t_test=70 * US_PER_DAY))
    with BatchStream(Sampler([store], cfg, seed=1)) as stream:
        sampler = stream.sampler
        asked: list[str] = []
        real = sampler.label_args

        def spy(data, db_idx, context):
            asked.append(context)
            return real(data, db_idx, context)

        sampler.label_args = spy
        for _ in range(4):
            stream.next_train()
        assert set(asked) == {"training"}
        for split in ("train", "val", "test"):
            ids = sampler.seed_ids(split, "next_sales")[:8]
            got = next(stream.split(split, "next_sales"))
            want = sampler.build("next_sales", ids, context=split).batch
            for k, v in want.arrays().items():
                np.testing.assert_array_equal(got.arrays()[k], v, err_msg=f"{split} {k}")


def test_anchor_predictions_never_show_the_anchors_own_tuple():
    """An ad-hoc anchor task (predict --anchors, the service) may read every label known at its time."""
    store = history_store(0)
    with Sampler([store], replace(BASE, labels=4), seed=1) as sampler:
        e = sampler.entry("next_sales")
        rows, obs = e.task.anchor_row[-8:], e.task.obs_time[-8:]
        res = sampler.build(sampler.anchor_task("next_sales", rows, obs), np.arange(8), context="all")
        horizon = parse_horizon(HORIZON)
        assert (res.labels >= 0).sum() > 0
        for b in range(8):
            for s in res.labels[b][res.labels[b] >= 0]:
                assert e.task.obs_time[s] + horizon <= obs[b]
                assert not (e.task.anchor_row[s] == rows[b] and e.task.obs_time[s] == obs[b])


def test_the_anchors_own_earlier_labels_come_first():
    store = history_store(1)
    with Sampler([store], replace(BASE, labels=3), seed=0) as sampler:
        e = sampler.entry("next_sales")
        late = np.flatnonzero(e.task.obs_time >= 60 * US_PER_DAY)
        res = sampler.build("next_sales", late[:8], context="all")
        h = parse_horizon(HORIZON)
        for b in range(8):
            s = int(late[b])
            own = np.flatnonzero((e.task.anchor_row == e.task.anchor_row[s]) & (e.task.obs_time + h <= e.task.obs_time[s]))
            want = own[np.argsort(-e.task.obs_time[own], kind="stable")][:3]
            np.testing.assert_array_equal(np.sort(res.labels[b][: len(want)]), np.sort(want))


def test_a_derived_task_without_a_horizon_is_named():
    store = random_store(5, n_tables=3, max_rows=30)  # cell-masking tasks only: fine without horizons
    Sampler([store], replace(BASE, labels=2)).close()
    from tests.fixtures.graphs import _ROOT

    shop = Tab("shop", [Col("shop_id", ST.IDENTIFIER, np.arange(3)), Col("t", ST.TIMESTAMP, np.arange(3) * DAY)], "t")
    no_h = build_store([shop], [TaskSpec("later", "shop", ST.BOOLEAN, query=(
        "SELECT shop_id, t AS obs_time, shop_id > 0 AS target FROM shop"))], _ROOT / "no_horizon", "no_horizon")
    with pytest.raises(ConfluenceError, match="'no_horizon/later' is a derived task without a horizon"):
        Sampler([no_h], replace(BASE, labels=2))
    Sampler([no_h], BASE).close()  # labels = 0 needs none


def test_bad_label_settings_are_named():
    from confluence.errors import ConfigError

    with pytest.raises(ConfigError, match="labels"):
        replace(BASE, labels=40)  # 2 x 40 cells do not fit beside a walk in S = 64
    with pytest.raises(ConfigError, match="labels"):
        replace(BASE, labels=-1)


# batch fields added after the digests below were recorded (each has its own tests)
LATER_FIELDS = frozenset({"child_rank", "arrival", "wait_ref", "wait_scale"})


def _digest(stores, cfg) -> str:
    h = hashlib.sha256()
    with BatchStream(Sampler(stores, cfg, seed=3)) as s:
        batches = [s.next_train() for _ in range(6)]
        for e in s.tasks:
            for sp in ("val", "test"):
                batches += list(s.split(sp, e.task.name, e.db_idx))
        for b in batches:
            for k, v in sorted(b.arrays().items()):
                if k in LATER_FIELDS:
                    continue
                h.update(k.encode())
                h.update(np.ascontiguousarray(v).tobytes())
    return h.hexdigest()


def test_without_labels_batches_are_byte_identical_to_before_labelled_context(tmp_path):
    """Digests of these batches as built at 57972cc, before labelled context existed (same stores, same config;
    seed 000's row orders, which every batch had then: `perm_tile = 0`)."""
    from confluence.store import Store

    assert _digest([random_store(21, n_tables=5, max_rows=80)], replace(BASE, perm_tile=0)) == \
        "c06043464e64a296adb8e8a8fc65a25ca97b393c1435bbe13725f106b5ad00a0"
    book = Store.open(build_bookstore(tmp_path, "tiny", dim=8))
    assert _digest([book], replace(BASE, seq_len=96, perm_tile=0)) == \
        "ac806dc432582a27bd4842ca047bbcb3eb25cb6d392536b53f511bba04397227"


def test_sample_show_renders_the_labelled_rows():
    from typer.testing import CliRunner

    from confluence.cli.main import app

    store = history_store(2)
    e_ids = np.flatnonzero(store.task_arrays("next_sales").obs_time >= 50 * US_PER_DAY)
    r = CliRunner().invoke(app, ["sample", "show", "--db", str(store.path), "--task", "next_sales", "--seed-index",
                                 str(int(e_ids[0])), "--set", "sampler.labels=4", "--phase", "all"])
    assert r.exit_code == 0, r.output
    assert "label #" in r.output and "LABEL (a known answer, visible)" in r.output and " label " in r.output
    bad = CliRunner().invoke(app, ["sample", "show", "--db", str(store.path), "--task", "next_sales", "--set",
                                   "sampler.labels=4", "--phase", "later"])
    assert bad.exit_code == 1 and "unknown label context 'later'" in bad.output


def test_no_sibling_labels_through_an_excluded_foreign_key():
    """A sale's tier is its shop's (tier = shop id mod 3) and the task hides the sale's shop: siblings through that
    foreign key would give the tier away, so the labels are all drawn among the task's recent ones (phase 4), and
    the seed's shop is no more common among them than chance makes it."""
    from tests.fixtures.graphs import _ROOT

    rng = np.random.default_rng(4)
    n_shop, n_sale = 6, 150
    shop = Tab("shop", [Col("shop_id", ST.IDENTIFIER, np.arange(n_shop))], None)
    sale_shop = rng.integers(0, n_shop, n_sale)
    sale = Tab("sale", [Col("sale_id", ST.IDENTIFIER, np.arange(n_sale)),
                        Col("shop", ST.IDENTIFIER, sale_shop, fk="shop"),
                        Col("tier", ST.CATEGORICAL, sale_shop % 3),
                        Col("at", ST.TIMESTAMP, rng.integers(0, 100, n_sale).astype(np.int64) * DAY)], "at")
    store = build_store([shop, sale], [TaskSpec("tier", "sale", ST.CATEGORICAL, column="tier", exclude=["shop"])],
                        _ROOT / "cut_siblings", "cut_siblings")
    k = 5
    with Sampler([store], replace(BASE, labels=k, split=SplitConfig(fractions=(0.7, 0.2, 0.1))), seed=2) as sampler:
        t = sampler.entry("tier").task
        pool = sampler.seed_ids("train", "tier")
        lt = t.obs_time[pool]
        by_time = pool[np.lexsort((pool, lt))][::-1]
        same_shop = shown = 0
        built = [(b, s, res) for ids in np.split(sampler.seed_ids("train", "tier")[-24:], 3)
                 for res in [sampler.build("tier", ids, context="train")] for b, s in enumerate(ids)]
        for b, s, res in built:
            labs = res.labels[b][res.labels[b] >= 0]
            walk_rows = int(res.nrows[b]) - len(labs)
            in_ctx = set(res.rows[b, :walk_rows].tolist())
            known = [c for c in by_time if t.obs_time[c] <= t.obs_time[s]]
            oldest = t.obs_time[known[: 16 * k][-1]]  # the window: the 16 k latest known, and ties with the oldest
            window = {c for c in known if t.obs_time[c] >= oldest and t.anchor_row[c] != t.anchor_row[s]
                      and t.anchor_row[c] not in in_ctx}
            assert set(labs.tolist()) <= window and len(labs) == min(k, len(window))
            same_shop += int(sum(sale_shop[t.anchor_row[c] - t.anchor_row.min()] == sale_shop[t.anchor_row[s] -
                                 t.anchor_row.min()] for c in labs))
            shown += len(labs)
        assert shown >= 100 and same_shop < shown / 3  # chance: about 1 in 6; siblings through the shop: all


def test_evaluate_answers_a_task_the_checkpoint_never_trained_on(tmp_path):
    """`confluence evaluate --checkpoint C --db D --task T` for a task C never trained on: scored beside the trivial
    baselines with its labelled history as context, and reported as not trained on (zero-shot)."""
    import json

    from typer.testing import CliRunner

    from confluence.cli.main import app
    from confluence.training.loop import open_stream, train
    from tests.fixtures.model import tiny_run_config

    store = history_store(0)
    cfg = tiny_run_config(sampler={"batch_size": 4, "seq_len": 64, "max_rows": 32, "row_buckets": [8, 32],
                                   "text_buckets": [8, 32], "labels": 4, "tasks": ["amount"],
                                   "split": {"mode": "temporal", "t_val": 40 * US_PER_DAY,
                                             "t_test": 70 * US_PER_DAY}},
                          loop={"max_steps": 4, "ckpt_every": 4, "val_every": 4})
    with open_stream([store], cfg) as stream:
        train(cfg, stream, tmp_path / "run", progress=False)
    out = tmp_path / "m.json"
    res = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(tmp_path / "run"), "--db", str(store.path),
                                   "--split", "test", "--task", "next_sales", "--task", "amount", "--json", str(out),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    got = json.loads(out.read_text())
    zero_shot, trained = got["next_sales"], got["amount"]
    assert zero_shot["info"].get("trained_on_task") is False, got
    assert trained["info"]["trained_on_task"] is True
    assert zero_shot["info"]["context_labels"] == 4 and zero_shot["info"]["n_eval"] > 0
    assert np.isfinite(zero_shot["model"]["mae"]) and "baseline" in zero_shot
    assert "not trained on" in res.output.split("next_sales", 1)[1].split("\n", 1)[0]


def test_a_derived_task_without_an_observation_time_needs_no_horizon():
    """A derived task with no observation-time column (a function of its anchor row, e.g. upper(country)) is
    observed at the row's time: its labels are known then, like a cell's, without a horizon."""
    from confluence.sampler.labels import task_horizon

    store = build_bookstore(_ROOT_DIR() / "no_obs_horizon", "small", dim=8)
    from confluence.store import Store

    s = Store.open(store)
    assert task_horizon(s, "country_upper") == 0  # no observation time, no horizon given
    assert task_horizon(s, "orders_next_30d") == 0  # "0 seconds", as its metadata says
    with Sampler([s], replace(BASE, labels=3, tasks=("country_upper",))) as sampler:
        res = sampler.build("country_upper", sampler.seed_ids("train", "country_upper")[-8:], context="train")
        assert (res.labels >= 0).any()


def _ROOT_DIR():
    from tests.fixtures.graphs import _ROOT

    return _ROOT


def test_labels_off_hides_the_labels_of_a_share_of_training_contexts_only():
    """`labels_off = p`: about a share p of training contexts show no label (drawn per seed and epoch, so the same
    batch twice is the same); the others, and every walk, are exactly those of `labels_off = 0`; validation and
    test contexts always show their labels."""
    store = history_store(1)
    split = SplitConfig(mode="temporal", t_val=40 * US_PER_DAY, t_test=70 * US_PER_DAY)
    on, off = replace(BASE, labels=4, split=split), replace(BASE, labels=4, labels_off=0.5, split=split)
    with Sampler([store], on, seed=3) as a, Sampler([store], off, seed=3) as b:
        ids = a.seed_ids("train", "next_sales")
        hidden = shown = 0
        for lo in range(0, min(len(ids), 64), 8):
            chunk = ids[lo: lo + 8]
            full, part = a.build("next_sales", chunk), b.build("next_sales", chunk)  # training contexts
            again = b.build("next_sales", chunk)
            np.testing.assert_array_equal(part.labels, again.labels)
            for i in range(len(chunk)):
                n = int(res_n(part, i))
                walk = int(full.nrows[i]) - int(res_n(full, i))
                np.testing.assert_array_equal(part.rows[i, :walk], full.rows[i, :walk])  # the walk is unchanged
                if n == 0 and res_n(full, i) > 0:
                    hidden += 1
                elif n:
                    shown += 1
                    np.testing.assert_array_equal(part.labels[i], full.labels[i])
        assert hidden >= 8 and shown >= 8  # about half of the 64 contexts each way
        for split in ("train", "val", "test"):  # evaluating a split, the train split too, shows every label
            sids = a.seed_ids(split, "next_sales")[:8]
            np.testing.assert_array_equal(a.build("next_sales", sids, context=split).labels,
                                          b.build("next_sales", sids, context=split).labels)
    with pytest.raises(ConfigError, match="labels_off"):
        replace(BASE, labels=4, labels_off=1.0)


def res_n(res, i: int) -> int:
    return int((res.labels[i] >= 0).sum())


def test_task_labels_sets_one_tasks_number_of_labels():
    """`task_labels` gives one task its own number of labelled rows: a task set to 0 gets exactly the batches of a
    run without labels (the whole context for its rows), one set to 2 those of a run with 2, the rest `labels`."""
    store = history_store(3)
    per = replace(BASE, labels=4, task_labels={"next_sales": 0, "amount": 2})
    ids = np.arange(BASE.batch_size)
    for task, ref in (("next_sales", BASE), ("amount", replace(BASE, labels=2)), ("size", replace(BASE, labels=4))):
        for context in ("train", "test"):
            a = Sampler([store], per, seed=5).build(task, ids, context=context).batch
            b = Sampler([store], ref, seed=5).build(task, ids, context=context).batch
            for k, v in vars(a).items():
                if isinstance(v, np.ndarray):
                    np.testing.assert_array_equal(v, getattr(b, k), err_msg=f"{task} {context}: {k}")
    with pytest.raises(ConfigError, match="task_labels"):
        replace(BASE, labels=4, task_labels={"amount": 5})


# ----------------------------------------------------------------------------------------------- matches
@cache
def fleet_store(seed: int):
    """Planes (static) whose maker is a function of their model, with seats (a discrete number) and an engine
    code; flights (temporal) with a categorical flight number whose flights share a late flag. Cell-masking tasks:
    the maker (also once with the model excluded), the late flag."""
    rng = np.random.default_rng(seed)
    n_plane, n_flight = int(rng.integers(60, 120)), int(rng.integers(150, 300))
    n_model = int(rng.integers(6, 12))
    model = rng.integers(0, n_model, n_plane)
    maker_of = rng.integers(0, 3, n_model)
    plane = Tab("plane", [Col("plane_id", ST.IDENTIFIER, np.arange(n_plane)),
                          Col("model", ST.CATEGORICAL, model),
                          Col("seats", ST.NUMERICAL, (50 + 10 * model).astype(np.float64)),
                          Col("engine", ST.CATEGORICAL, rng.integers(0, 2, n_plane)),
                          Col("maker", ST.CATEGORICAL, maker_of[model])], None)
    number = rng.integers(0, 20, n_flight)
    late_of = rng.random(20) < 0.5
    flight = Tab("flight", [Col("flight_id", ST.IDENTIFIER, np.arange(n_flight)),
                            Col("plane", ST.IDENTIFIER, rng.integers(0, n_plane, n_flight), fk="plane"),
                            Col("number", ST.CATEGORICAL, number),
                            Col("late", ST.BOOLEAN, late_of[number]),
                            Col("at", ST.TIMESTAMP, rng.integers(0, 100, n_flight).astype(np.int64) * DAY)], "at")
    tasks = [TaskSpec("maker", "plane", ST.CATEGORICAL, column="maker"),
             TaskSpec("maker_blind", "plane", ST.CATEGORICAL, column="maker", exclude=["model", "seats"]),
             TaskSpec("late", "flight", ST.BOOLEAN, column="late")]
    from tests.fixtures.graphs import _ROOT

    return build_store([plane, flight], tasks, _ROOT / f"fleet_{seed}", f"fleet{seed}")


def _target_values(t, ids: np.ndarray) -> np.ndarray:
    if int(t.target_stype) == int(ST.BOOLEAN):
        return np.unpackbits(t.tgt_bits, bitorder="little")[ids]
    return np.asarray(t.tgt_u32)[ids]


@pytest.mark.parametrize("seed", [0, 1])
@given(k=st.integers(1, 6), m=st.integers(1, 6), temporal=st.booleans(), sseed=st.integers(0, 3))
def test_matched_labels_share_a_value_and_keep_every_rule(seed, k, m, temporal, sseed):
    """Matches obey the rules of every label (time, own label, splits), and a static table without parents shows
    its matches first: each of the first min(m, k) labels shares a matched column's value with the anchor row."""
    store = fleet_store(seed)
    split = (SplitConfig(mode="temporal", t_val=40 * US_PER_DAY, t_test=70 * US_PER_DAY) if temporal
             else SplitConfig(seed=sseed, fractions=(0.6, 0.2, 0.2)))
    m = min(m, k)
    cfg = replace(BASE, labels=k, label_match=m, split=split)
    with Sampler([store], cfg, seed=sseed) as sampler, BatchStream(sampler) as stream:
        total, matched = 0, 0
        for e in sampler.entries:
            for ctx, res in _phases(sampler, stream, e):
                total += _check(sampler, e, ctx, res)
                if e.task.name != "maker":
                    continue
                index = sampler.label_index("maker", 0, ctx)
                names = [sampler.data[0].column_names[c] for c in index.m_cols]
                assert names[:2] == ["plane.seats", "plane.model"] or names[:2] == ["plane.model", "plane.seats"]
                vals = index.m_row_val
                for b in range(res.batch.batch_size):
                    if not res.batch.seq_valid[b]:
                        continue
                    a = int(res.batch.anchor_rows[b]) - index.a_lo
                    labs = res.labels[b][res.labels[b] >= 0]
                    pool_share = [(vals[:, a] == vals[:, int(e.task.anchor_row[s]) - index.a_lo]).any()
                                  for s in labs[:m]]
                    # matches come first while the anchor's value has known labels left
                    n_same = int(np.sum(pool_share))
                    assert pool_share == [True] * n_same + [False] * (len(pool_share) - n_same)
                    matched += n_same
    assert total > 0 and (matched > 0 or temporal)  # not vacuous (a temporal split puts static rows in test)


def test_matches_never_use_the_target_or_an_excluded_column():
    store = fleet_store(0)
    with Sampler([store], replace(BASE, labels=4, label_match=2), seed=0) as sampler:
        names = lambda task: [sampler.data[0].column_names[c] for c in sampler.label_index(task).m_cols]  # noqa: E731
        assert set(names("maker")) == {"plane.model", "plane.seats", "plane.engine"}
        assert names("maker_blind") == ["plane.engine"]  # model and seats excluded, the target never
        assert names("late") == ["flight.number"]  # a timestamp or a foreign key is never matched on


def test_matched_labels_tell_the_answer_where_random_ones_do_not():
    """The maker is a function of the model: matched labels vote for the anchor's own maker; random labels of a
    static table vote at about the share of the commonest maker."""
    store = fleet_store(1)
    split = SplitConfig(seed=0, fractions=(0.6, 0.2, 0.2))
    agree = {}
    for m in (0, 4):
        with Sampler([store], replace(BASE, labels=4, label_match=m, split=split), seed=0) as sampler:
            t = sampler.entry("maker", 0).task
            ids = sampler.seed_ids("val", "maker", 0)
            hits = []
            for lo in range(0, len(ids), BASE.batch_size):
                res = sampler.build("maker", ids[lo: lo + BASE.batch_size], 0, context="val")
                for b, seed in enumerate(ids[lo: lo + BASE.batch_size]):
                    labs = res.labels[b][res.labels[b] >= 0]
                    hits.extend((_target_values(t, labs) == _target_values(t, np.array([seed]))[0]).tolist())
            agree[m] = float(np.mean(hits))
    assert agree[4] == 1.0, agree  # four matches on the model or its seats: always the same maker
    assert agree[0] < 0.8, agree


def test_without_matches_the_batches_are_unchanged():
    """label_match = 0 (the default) builds exactly the batches of before the setting; > 0 changes only labels."""
    store = fleet_store(0)
    ids = np.arange(BASE.batch_size)
    digests = {}
    for m in (None, 0, 3):
        cfg = replace(BASE, labels=3) if m is None else replace(BASE, labels=3, label_match=m)
        with Sampler([store], cfg, seed=0) as sampler:
            res = sampler.build("maker", ids, 0)
            walk = res.nrows - (res.labels >= 0).sum(axis=1)
            digests[m] = (hashlib.sha256(res.labels.tobytes()).hexdigest(), walk.tolist())
    assert digests[None] == digests[0]
    assert digests[3][0] != digests[0][0] and digests[3][1] == digests[0][1]


def test_bad_label_match_is_named():
    with pytest.raises(ConfigError, match="label_match"):
        replace(BASE, labels=2, label_match=3)
    with pytest.raises(ConfigError, match="label_match"):
        replace(BASE, labels=2, label_match=-1)


def test_task_label_match_sets_one_tasks_matches():
    """`task_label_match` gives one task its own number of matches: at 0 its contexts are those of a run without
    matches, byte for byte, while the other tasks keep theirs."""
    store = fleet_store(0)
    ids = np.arange(BASE.batch_size)

    def labels(cfg, task):
        with Sampler([store], cfg, seed=0) as sampler:
            return sampler.build(task, ids, 0).labels

    per = replace(BASE, labels=3, label_match=3, task_label_match={"maker": 0})
    assert np.array_equal(labels(per, "maker"), labels(replace(BASE, labels=3), "maker"))
    assert np.array_equal(labels(per, "late"), labels(replace(BASE, labels=3, label_match=3), "late"))
    assert not np.array_equal(labels(per, "late"), labels(replace(BASE, labels=3), "late"))
    with pytest.raises(ConfigError, match="task_label_match"):
        replace(BASE, labels=2, task_label_match={"maker": 3})
