"""The link head (issue 53): link batches (candidates are the target table's rows in the context, positives those in
the answer, nothing after the observation time), training it on a link task, ranking and evaluating beside the
baselines, and the CLI's `train-links` / `evaluate` on its checkpoint."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.errors import ConfluenceError
from confluence.evaluation.links import evaluate_links
from confluence.inference.links import LinkRanker
from confluence.inference.predictor import LoadedModel, load_model
from confluence.preprocess.pipeline import preprocess
from confluence.sampler.links import LinkSource, link_split_ids
from confluence.store import Store
from confluence.store.format import STATIC_TIME
from tests.fixtures.bookstore import HashEncoder, write_bookstore, write_metadata
from tests.fixtures.model import tiny_model, tiny_run_config
from tests.test_links import meta_with

TASK = "customer_books"
SAMPLER = {"batch_size": 8, "seq_len": 96, "max_rows": 32, "row_buckets": [32], "text_buckets": [64]}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    tmp = tmp_path_factory.mktemp("link_model")
    return Store.open(preprocess(write_bookstore(tmp, size="small"), write_metadata(tmp, meta_with()), tmp / "store",
                                 encoder=HashEncoder(8), progress=False))


@pytest.fixture(scope="module")
def run(store, tmp_path_factory):
    from confluence.training.links import train_links

    out = tmp_path_factory.mktemp("link_run") / "run"
    losses: list[float] = []
    train_links(store, TASK, out, tiny_run_config(sampler=SAMPLER), steps=30, on_step=lambda s, x: losses.append(x))
    assert len(losses) == 30 and all(np.isfinite(losses))
    return out


def test_candidates_are_the_target_rows_of_the_context_and_nothing_is_from_the_future(store):
    source = LinkSource(store, TASK, tiny_run_config(sampler=SAMPLER))
    try:
        arr = store.link_arrays(TASK)
        ids = link_split_ids(store, TASK, "val")[:8]
        batch = source.batch(ids)
        books = store.table("books")
        rows = batch.rows
        assert batch.candidates.any() and batch.positives.any()
        assert ((rows[batch.candidates] >= books.row_offset)
                & (rows[batch.candidates] < books.row_offset + books.num_rows)).all()
        assert not (batch.positives & ~batch.candidates).any()
        row_time = np.asarray(store.row_time)
        for i, s in enumerate(ids):
            truth = arr.targets[arr.offsets[s]:arr.offsets[s + 1]]
            assert (batch.positives[i] == (batch.candidates[i] & np.isin(rows[i], truth))).all()
            seen = rows[i, :batch.result.nrows[i]]
            t = row_time[seen]
            assert ((t == STATIC_TIME) | (t <= arr.obs_time[s])).all()  # no row after the observation time
            assert rows[i, 0] == arr.anchor_row[s] and not batch.candidates[i, 0]
    finally:
        source.close()


def test_a_trained_link_head_ranks_and_is_evaluated_beside_the_baselines(store, run):
    loaded = load_model(run)
    ranker = LinkRanker(loaded, store, TASK)
    try:
        coef = ranker.calibrate(200)
        # intercept; in-context logit, in context; catalogue logit; place, in list x (catalogue + 4 baselines);
        # the pair counts (the anchor's links and their recency, the row's links overall, recent and forecast)
        assert coef.shape == (19,) and np.isfinite(coef).all()
        sel = ranker.selection  # the way of ranking chosen on held-out calibration folds, and why
        groups = ranker.feature_groups()
        assert sel["choice"] in groups and set(sel["calibration_map"]) == set(groups)
        assert sel["calibration_map"][sel["choice"]] == max(sel["calibration_map"].values())
        unused = np.setdiff1d(np.arange(18), groups[sel["choice"]])
        assert (coef[1:][unused] == 0).all()
        ids = link_split_ids(store, TASK, "val")[:20]
        ranked = ranker.rank(ids)
    finally:
        ranker.close()
    books = store.table("books")
    assert ranked.shape == (20, 5)
    for row in ranked:
        got = row[row >= 0]
        assert len(set(got.tolist())) == len(got)
        assert ((got >= books.row_offset) & (got < books.row_offset + books.num_rows)).all()
    res = evaluate_links(loaded, store, split="val", max_seeds=60)[TASK]
    assert 0.0 <= res["model"]["map"] <= 1.0 and res["model"]["n"] == res["baseline"]["n"]
    assert {"diff", "ci_low", "ci_high", "a_not_worse"} <= set(res["model_vs_baseline"])


def test_the_pair_counts_are_a_setting_the_ranker_reads_from_the_run(store, run):
    from dataclasses import replace

    loaded = load_model(run)
    assert loaded.config.link.pair_counts and loaded.config.link.forecast_windows == 4  # the defaults
    off = replace(loaded, config=replace(loaded.config, link=replace(loaded.config.link, pair_counts=False)))
    plain = replace(loaded, config=replace(loaded.config, link=replace(loaded.config.link, forecast_windows=0)))
    widths = {}
    for name, lm in (("on", loaded), ("off", off), ("no forecast", plain)):
        ranker = LinkRanker(lm, store, TASK)
        try:
            widths[name] = len(ranker.feature_groups()["model"])
            arr = store.link_arrays(TASK)
            ids = link_split_ids(store, TASK, "val")[:3]
            found = ranker._candidates(np.asarray(arr.anchor_row)[ids], np.asarray(arr.obs_time)[ids])
            assert all(x.shape[1] == widths[name] for _, x in found)
        finally:
            ranker.close()
    assert widths == {"on": 18, "off": 13, "no forecast": 17}


def test_a_checkpoint_without_a_link_head_is_refused_by_name(store, tmp_path):
    loaded = LoadedModel(model=tiny_model(), config=tiny_run_config(), step=0, path=tmp_path)
    with pytest.raises(ConfluenceError, match="no link head"):
        LinkRanker(loaded, store, TASK)


def test_the_cli_trains_and_evaluates_a_link_task_and_never_writes_into_a_users_folder(store, run, tmp_path):
    runner = CliRunner()
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("keep me")
    res = runner.invoke(app, ["train-links", "--db", str(store.path), "--task", TASK, "--out", str(users),
                              "--steps", "2", "--force", "--no-progress"])
    assert res.exit_code != 0 and (users / "notes.txt").read_text() == "keep me", res.output
    res = runner.invoke(app, ["train-links", "--db", str(store.path), "--task", "nope", "--out", str(tmp_path / "r")])
    assert res.exit_code != 0 and "no link task 'nope'" in res.output
    res = runner.invoke(app, ["evaluate", "--checkpoint", str(run), "--db", str(store.path), "--split", "val",
                              "--max-seeds", "40"])
    assert res.exit_code == 0, res.output
    assert "link to books" in res.output and "model" in res.output and "map" in res.output


def test_fewer_train_seeds_than_a_batch_still_make_batches(store):
    """A link task with fewer train seeds than a batch trains on short batches instead of waiting forever."""
    from confluence.sampler.links import train_and_calibration_ids

    fit, _ = train_and_calibration_ids(store, TASK)
    cfg = tiny_run_config(sampler={**SAMPLER, "batch_size": len(fit) + 5})
    source = LinkSource(store, TASK, replace(cfg, link=replace(cfg.link, catalogue=False)))
    try:
        batches = source.train_batches(0)
        (e0, first), (e1, second) = next(batches), next(batches)
        assert (e0, e1) == (0, 1) and sorted(first.tolist()) == sorted(fit.tolist()) == sorted(second.tolist())
    finally:
        source.close()
    # with the catalogue side, a batch holds the seeds of one observation time, and an epoch every one of them
    source = LinkSource(store, TASK, cfg)
    obs = np.asarray(store.link_arrays(TASK).obs_time)
    try:
        batches = source.train_batches(0)
        epoch = []
        while True:
            e, ids = next(batches)
            if e > 0:
                break
            assert len(np.unique(obs[ids])) == 1
            epoch.append(ids)
        assert sorted(np.concatenate(epoch).tolist()) == sorted(fit.tolist())
    finally:
        source.close()


def test_the_catalogue_side_reads_each_target_row_from_its_own_context_and_nothing_later(store):
    """A target row's own context starts at that row and holds no row after the observation time it is read at
    (the catalogue side's leak rule); an anchor asked at any time gets the context its seed gets."""
    source = LinkSource(store, TASK, tiny_run_config(sampler=SAMPLER))
    row_time = np.asarray(store.row_time)
    books = store.table("books")
    arr = store.link_arrays(TASK)
    try:
        rows = np.arange(books.row_offset, books.row_offset + min(books.num_rows, source.item_batch_size))
        for t in np.unique(arr.obs_time)[:3]:
            res = source.item_batch(rows, np.full(len(rows), t))
            for i, r in enumerate(rows):
                seen = res.rows[i, :res.nrows[i]]
                assert seen[0] == r
                assert ((row_time[seen] == STATIC_TIME) | (row_time[seen] <= t)).all()
        ids = link_split_ids(store, TASK, "val")[:8]
        by_seed = source.batch(ids)
        by_anchor = source.anchor_batch(arr.anchor_row[ids], arr.obs_time[ids])
        assert (by_seed.rows == by_anchor.rows).all() and (by_seed.candidates == by_anchor.candidates).all()
        assert not by_anchor.positives.any()  # asked as anchors, no answer is known
    finally:
        source.close()


def test_catalogue_samples_hold_part_of_each_answer_and_uniform_rows():
    from confluence.sampler.links import catalogue_sample

    offsets = np.array([0, 3, 4, 6])
    targets = np.array([10, 11, 12, 15, 10, 19])
    rows, truth = catalogue_sample(np.array([0, 1, 2]), offsets, targets, (10, 20), 1, 5, np.random.default_rng(0))
    assert (np.diff(rows) > 0).all() and ((rows >= 10) & (rows < 20)).all()
    for i, s in enumerate([0, 1, 2]):
        answer = targets[offsets[s]:offsets[s + 1]]
        assert (truth[i] == np.isin(rows, answer)).all() and truth[i].any()


def test_the_ranker_reaches_rows_outside_the_context_and_its_shortlist_is_the_exact_top_k(store, run):
    from confluence.targets.link import top_k

    ranker = LinkRanker(load_model(run), store, TASK)
    try:
        arr = store.link_arrays(TASK)
        ids = link_split_ids(store, TASK, "val")[:6]
        anchors, times = arr.anchor_row[ids], arr.obs_time[ids]
        ctx, queries = ranker.contexts(anchors, times)
        short = ranker.shortlists(queries, times)
        first = ranker.source.catalog[0]
        for i in range(len(ids)):
            keys = ranker.catalogue_keys(int(ranker.catalogue_time(times[i:i + 1])[0]))
            scores = keys @ queries[i]
            brute = np.lexsort((np.arange(len(scores)), -scores))[:ranker.shortlist] + first
            assert (short[i][short[i] >= 0] == brute).all()
            idx, _ = top_k(queries[i:i + 1], keys, 3)
            assert (idx[0] + first == brute[:3]).all()
            lists = ranker.lists(anchors[i:i + 1], times[i:i + 1])[0]
            cand, x = ranker.features(*ctx[i], lists, queries[i], int(times[i]), short[i])
            assert x.shape == (len(cand), 13) and set(short[i][short[i] >= 0]) <= set(cand.tolist())
    finally:
        ranker.close()


def test_the_catalogue_loss_is_a_sampled_softmax_of_each_answer_against_the_non_answers():
    import jax.numpy as jnp

    from confluence.model.loss import catalogue_loss

    logits = np.array([[2.0, 0.0, 1.0, 5.0], [0.5, 0.5, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0]], np.float32)
    truth = np.array([[1, 0, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]], bool)
    seq_valid = np.array([True, True, False])
    item_valid = np.array([True, True, True, False])  # the last column is padding
    got = float(catalogue_loss(jnp.asarray(logits), jnp.asarray(truth), jnp.asarray(seq_valid),
                               jnp.asarray(item_valid)))
    # seed 0: answers 2.0 and 1.0 against the one non-answer 0.0; seed 1 has no answer, seed 2 is padding
    want = np.mean([-np.log(np.exp(s) / (np.exp(s) + 1.0)) for s in (2.0, 1.0)])
    assert abs(got - want) < 1e-5
    shifted = float(catalogue_loss(jnp.asarray(logits + 3.0), jnp.asarray(truth), jnp.asarray(seq_valid),
                                   jnp.asarray(item_valid)))
    assert abs(shifted - got) < 1e-5  # a score shared by every row changes nothing
    binary = float(catalogue_loss(jnp.asarray(logits), jnp.asarray(truth), jnp.asarray(seq_valid),
                                  jnp.asarray(item_valid), "binary"))
    assert binary > 0 and abs(binary - got) > 1e-3


def test_the_catalogue_is_read_at_the_start_of_the_questions_day_and_a_bounded_number_of_times_is_kept(store, run):
    from confluence.inference.links import KEPT_TIMES
    from confluence.stypes import US_PER_DAY

    times = np.array([5 * US_PER_DAY + 7, 5 * US_PER_DAY, -3], dtype=np.int64)
    assert LinkRanker.catalogue_time(times).tolist() == [5 * US_PER_DAY, 5 * US_PER_DAY, -US_PER_DAY]
    ranker = LinkRanker(load_model(run), store, TASK)
    try:
        ranker.source.item_batch_size = 64  # fewer passes over the small table
        first = ranker.catalogue_keys(0)
        for day in range(1, KEPT_TIMES + 3):
            ranker.catalogue_keys(day * US_PER_DAY)
        assert len(ranker._keys) == KEPT_TIMES and 0 not in ranker._keys
        assert (ranker.catalogue_keys(0) == first).all()  # recomputed alike
    finally:
        ranker.close()
def test_evaluate_writes_relbenchs_recommendation_layout_for_a_link_run(store, run, tmp_path):
    """`evaluate --relbench-json` on a link run: per split, RelBench's metric names and `pred`, [n, k] target keys
    per (source key, timestamp) row, whose MAP@k by RelBench's formula is the file's."""
    import json

    from tests.test_links import _relbench_map

    out = tmp_path / "relbench.json"
    res = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(run), "--db", str(store.path), "--max-seeds", "40",
                                   "--relbench-json", str(out)])
    assert res.exit_code == 0, res.output
    assert "split val" in res.output and "split test" in res.output
    data = json.loads(out.read_text())
    info = data["tasks"][TASK]
    assert info == {"task_type": "link_prediction", "eval_k": 5, "src_entity_table": "customers",
                    "src_entity_col": "customer_id", "dst_entity_table": "books", "dst_entity_col": "book_id",
                    "time_col": "observed_at", "n": info["n"]}
    arr, books, customers = store.link_arrays(TASK), store.table("books"), store.table("customers")
    book_keys, customer_keys = store.keys("books").to_pylist(), store.keys("customers").to_pylist()
    seed_of = {(customer_keys[a - customers.row_offset], t): s
               for s, (a, t) in enumerate(zip(arr.anchor_row.tolist(), arr.obs_time.tolist(), strict=True))}
    from confluence.schema.relbench import iso

    for split in ("val", "test"):
        metrics, pred = data["model"][TASK][split], data["predictions"][TASK][split]
        assert set(metrics) == {"link_prediction_precision", "link_prediction_recall", "link_prediction_map", "ndcg"}
        assert len(pred["src"]) == len(pred["timestamp"]) == len(pred["pred"]) <= 40
        assert all(len(p) == 5 for p in pred["pred"])
        assert set(data["baselines"]) >= {"popularity", "recent_popularity", "past_targets"}
        isin, counts = [], []
        by_iso = {iso(t): t for t in arr.obs_time.tolist()}
        for src, ts, p in zip(pred["src"], pred["timestamp"], pred["pred"], strict=True):
            s = seed_of[(src, by_iso[ts])]
            truth = [book_keys[r - books.row_offset] for r in arr.targets[arr.offsets[s]:arr.offsets[s + 1]]]
            assert {x for x in p if x is not None} <= set(book_keys)
            isin.append(np.isin(np.array(p, dtype=object), np.array(truth, dtype=object)))
            counts.append(len(truth))
        assert info["n"][split] == sum(c > 0 for c in counts)
        assert metrics["link_prediction_map"] == pytest.approx(_relbench_map(np.stack(isin), np.array(counts)))


def test_the_link_head_reads_each_rows_encoded_values_beside_its_final_state(store):
    """`model.link_values`: each row's state gains the mean of its cells' encoded states (h0, the question cell not
    among them), and the question the anchor row's (row 0); off, the final states alone. It shapes no parameter."""
    import jax
    import jax.numpy as jnp

    from confluence.model.inputs import DbTables
    from confluence.model.transformer import RelationalTransformer
    from confluence.training.links import link_inputs

    cfg = tiny_run_config(sampler=SAMPLER, model={"link_head": True, "link_values": True})
    on = RelationalTransformer(cfg.model, key=jax.random.key(0))
    off = RelationalTransformer(replace(cfg.model, link_values=False), key=jax.random.key(0))
    source = LinkSource(store, TASK, cfg)
    try:
        batch = source.batch(link_split_ids(store, TASK, "val")[:8])
    finally:
        source.close()
    inputs = link_inputs(batch)
    t = DbTables.for_model(store, cfg.loss.max_k, cfg.model)
    col, cat = jnp.asarray(t.column_embeddings), jnp.asarray(t.categorical_embeddings)
    n = batch.candidates.shape[1]
    q1, r1 = map(np.asarray, on.link_states(inputs, col, cat, n))
    q0, r0 = map(np.asarray, off.link_states(inputs, col, cat, n))
    h0 = np.asarray(on._states(inputs, col, cat)[0], np.float64)
    cells = ~inputs["is_padding"] & ~inputs["is_target"]
    for b in range(len(q1)):
        for r in range(n):
            member = cells[b] & (inputs["seq_row_ids"][b] == r)
            want = h0[b, member].mean(axis=0) if member.any() else np.zeros(h0.shape[-1])
            np.testing.assert_allclose(r1[b, r] - r0[b, r], want, atol=1e-5)
            if r == 0:
                assert member.any()  # the anchor row shows cells besides its question
                np.testing.assert_allclose(q1[b] - q0[b], want, atol=1e-5)


def test_a_saved_link_run_keeps_how_it_read_rows_and_fine_tuning_reads_them_as_its_own_config_says(store, run,
                                                                                                tmp_path):
    """A checkpoint saved before `link_values` existed read final states alone and loads so; a run started from
    any checkpoint reads rows as its own config says (the setting shapes no parameter)."""
    import json

    from confluence.training.config import RunConfig
    from confluence.training.links import train_links

    assert RunConfig.from_dict({"model": {"link_head": True}}).model.link_values is False
    assert RunConfig().model.link_values is True
    assert json.loads((run / "config.json").read_text())["model"]["link_values"] is False
    cfg = tiny_run_config(sampler=SAMPLER, model={"link_values": True})
    train_links(store, TASK, tmp_path / "tuned", cfg, steps=1, init_from=run)
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["model"]["link_values"] is True
    loaded = load_model(tmp_path / "tuned")  # and it ranks and is evaluated reading them so
    assert loaded.model.cfg.link_values is True
    res = evaluate_links(loaded, store, split="val", max_seeds=20)[TASK]
    assert 0.0 <= res["model"]["map"] <= 1.0 and res["model"]["n"] == res["baseline"]["n"]
