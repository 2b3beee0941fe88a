"""Which columns a task relies on (`evaluate --importance`, confluence.evaluation.importance): the shuffle touches
only the column's own cells, the model's importance is a real re-scoring, LightGBM's gain lands on columns."""

import numpy as np

from confluence.evaluation.importance import VALUE_FIELDS, feature_column, shuffled_column
from tests.test_eval_end_to_end import shop  # noqa: F401  (the trained tiny model on a small shop database)


def test_a_shuffle_moves_one_columns_values_and_nothing_else(shop):  # noqa: F811
    from confluence.inference.predictor import Predictor, load_model

    store, run, _ = shop
    p = Predictor(load_model(run), store, draws=1)
    task = p.store.tasks[0].name
    ids = p.seed_ids("test", task)[:16]
    batches = [p.stream.sampler.build(task, ids[:8], context="test").batch,
               p.stream.sampler.build(task, ids[8:16], context="test").batch]
    counts = {}
    for b in batches:
        for c in np.unique(b.column_ids[~b.is_padding & ~b.is_target]):
            counts[int(c)] = counts.get(int(c), 0) + 1
    col = max(counts, key=counts.get)
    out = shuffled_column(batches, col, np.random.default_rng(0))
    for b, o in zip(batches, out, strict=True):
        mine = (b.column_ids == col) & ~b.is_target & ~b.is_padding
        for f in VALUE_FIELDS:
            x, y = getattr(b, f), getattr(o, f)
            np.testing.assert_array_equal(x[~mine], y[~mine])  # every other cell, the target cell included
        for f in ("column_ids", "seq_row_ids", "semantic_types", "is_target", "fk_adj"):
            np.testing.assert_array_equal(getattr(b, f), getattr(o, f))
    before = np.sort(np.concatenate([b.numeric_values[(b.column_ids == col) & ~b.is_target & ~b.is_padding]
                                     for b in batches]))
    after = np.sort(np.concatenate([o.numeric_values[(o.column_ids == col) & ~o.is_target & ~o.is_padding]
                                    for o in out]))
    np.testing.assert_array_equal(before, after)  # the same values, moved
    p.close()


def test_evaluate_reports_each_tasks_importance_beside_lightgbm(shop):  # noqa: F811
    from confluence.evaluation.evaluate import evaluate
    from confluence.evaluation.report import importance_html
    from confluence.store import Store

    store, run, _ = shop
    task = Store.open(store).tasks[0].name
    res = evaluate(run, store, split="test", tasks=[task], max_seeds=40, gbdt=True, importance=24, draws=1)
    for name, r in res.items():
        if "importance" not in r or "model" not in r["importance"]:
            continue
        m = r["importance"]["model"]
        assert m["columns"] and np.isfinite(m["base"]) and m["seeds"] > 0
        assert list(m["columns"].values()) == sorted(m["columns"].values(), reverse=True)
        shares = r["importance"]["gbdt_gain_share"]
        assert all(0.0 <= v <= 1.0 for v in shares.values()) and set(m["columns"]) <= set(shares)
        page = importance_html(r["importance"])
        assert "what it relies on" in page and next(iter(m["columns"])) in page
        again = evaluate(run, store, split="test", tasks=[name], max_seeds=40, gbdt=False, importance=24, draws=1)
        assert again[name]["importance"]["model"] == m  # deterministic
        break
    else:
        raise AssertionError(f"no task got an importance: {list(res)}")


def test_a_lightgbm_feature_is_credited_to_the_column_it_reads():
    assert feature_column("flights.sched_dep_time") == "flights.sched_dep_time"
    assert feature_column("p:flights.tailnum->planes.year") == "planes.year"
    assert feature_column("sib:flights.carrier<-flights.carrier:mean:flights.dep_delay") == "flights.dep_delay"
    assert feature_column("sib:flights.carrier<-flights.carrier:count") == "flights.carrier"
    assert feature_column("obs_days") is None
