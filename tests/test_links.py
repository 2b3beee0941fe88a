"""Link tasks ("which rows of that table will this row link to next?"): their metadata and its errors, their
materialization into the store, the ranking metrics against hand-computed values and RelBench's formula, and the
baselines' leak-freedom (a seed sees only links known at its observation time)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confluence.errors import MetadataError
from confluence.evaluation.links import baseline_rankings, link_split_ids, run_link_baselines
from confluence.preprocess.links import group_links
from confluence.preprocess.pipeline import preprocess
from confluence.schema.metadata import parse_metadata
from confluence.store import Store
from confluence.targets import link as L
from tests.fixtures.bookstore import HashEncoder, bookstore_metadata, write_bookstore, write_metadata

QUERY = ("SELECT o.customer_id, w.obs AS observed_at, o.book_id FROM "
         "(SELECT DISTINCT date_trunc('week', ordered_at) AS obs FROM orders) w "
         "JOIN orders o ON o.ordered_at > w.obs AND o.ordered_at <= w.obs + INTERVAL 30 DAY")


def link_task(**over) -> dict:
    task = {"query": QUERY, "anchor_table": "customers", "anchor_key": "customer_id",
            "observation_time_column": "observed_at", "target_table": "books", "target_key": "book_id",
            "horizon": "30 days", "k": 5, "split": {"val_time": "2024-08-01", "test_time": "2024-09-15"},
            "description": "the books a customer orders in the 30 days after a week starts"}
    task.update(over)
    return {k: v for k, v in task.items() if v is not None}


def meta_with(**over) -> dict:
    meta = bookstore_metadata()
    meta["link_tasks"] = {"customer_books": link_task(**over)}
    return meta


# -- metadata ------------------------------------------------------------------------------------------------------
def test_a_link_task_parses_and_round_trips():
    meta = parse_metadata(meta_with())
    task = meta.link_tasks["customer_books"]
    assert (task.target_table, task.k, task.horizon_us) == ("books", 5, 30 * 86_400_000_000)
    assert parse_metadata(meta.to_json()).to_json() == meta.to_json()
    assert "customer_books" not in meta.tasks  # cell and derived tasks are untouched by link tasks


@pytest.mark.parametrize("over, expected", [
    ({"target_table": "shelves"}, "target_table 'shelves' is not a table of the database"),
    ({"horizon": None}, "missing required field 'horizon'"),
    ({"horizon": "a month"}, "field 'horizon'"),
    ({"k": 0}, "field 'k' must be a whole number from 1 to 1000"),
    ({"k": "10"}, "field 'k' must be a whole number"),
    ({"split": None}, "missing required field 'split'"),
    ({"target_key": None}, "missing required field 'target_key'"),
    ({"target_column": "book_id"}, "unknown field 'target_column' (a link task's target is 'target_table'"),
])
def test_bad_link_tasks_are_named(over, expected):
    with pytest.raises(MetadataError) as err:
        parse_metadata(meta_with(**over))
    assert any(expected in p and "link task 'customer_books'" in p for p in err.value.problems), err.value.problems


def test_a_target_table_without_a_primary_key_is_named():
    meta = meta_with()
    meta["tables"]["books"].pop("primary_key")
    for col in meta["tables"]["orders"]["columns"].values():
        col.pop("foreign_key", None) if col.get("foreign_key", "").startswith("books.") else None
    with pytest.raises(MetadataError) as err:
        parse_metadata(meta)
    assert any("target_table 'books' has no primary key" in p for p in err.value.problems), err.value.problems


def test_keys_that_match_no_row_are_named_against_the_data(tmp_path):
    from confluence.schema.validate import load_and_validate
    from confluence.sources import open_source

    bad = QUERY.replace("o.book_id FROM", "CASE WHEN o.order_id % 7 = 0 THEN 'nope' ELSE o.book_id END AS book_id"
                        " FROM")
    src = write_bookstore(tmp_path, size="small")
    with open_source(src) as raw, pytest.raises(MetadataError) as err:
        load_and_validate(write_metadata(tmp_path, meta_with(query=bad)), raw)
    found = [p for p in err.value.problems if "link task 'customer_books'" in p]
    assert found and "target_key 'book_id' that matches no 'books' row (e.g. 'nope'" in found[0], found


# -- the store -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    tmp = tmp_path_factory.mktemp("links")
    path = preprocess(write_bookstore(tmp, size="small"), write_metadata(tmp, meta_with()), tmp / "store",
                      encoder=HashEncoder(8), progress=False)
    return Store.open(path)


def test_the_store_holds_each_seeds_distinct_target_rows(store, tmp_path):
    import duckdb

    from tests.fixtures.bookstore import bookstore_tables

    tables = bookstore_tables("small")
    con = duckdb.connect()
    for name, t in tables.items():
        con.register(name, t)
    rows = con.execute(QUERY).fetchall()
    expect: dict[tuple, set] = {}
    for c, t, b in rows:
        expect.setdefault((c, t), set()).add(b)
    info, arr = store.link_task("customer_books"), store.link_arrays("customer_books")
    assert info.num_seeds == len(expect) and info.num_links == sum(len(v) for v in expect.values())
    cust = store.table("customers")
    cust_keys = store.keys("customers").to_pylist()
    book_keys = store.keys("books").to_pylist()
    first_book = store.table("books").row_offset
    got = {}
    for i in range(info.num_seeds):
        key = cust_keys[arr.anchor_row[i] - cust.row_offset]
        when = np.datetime64(int(arr.obs_time[i]), "us").astype(object)
        got[(key, when)] = {book_keys[r - first_book] for r in arr.targets[arr.offsets[i]:arr.offsets[i + 1]]}
    assert got == expect
    order = np.lexsort((arr.obs_time, arr.anchor_row))
    assert (order == np.arange(len(order))).all()  # seeds sorted by (anchor row, time)


def test_a_link_task_changes_no_cell_tasks_batches(store, tmp_path):
    """Adding a link task to a database leaves every other column's index and every cell task's batches as they
    were (its two columns come last), so a database gains link tasks without retraining its cell-task models."""
    import hashlib

    from confluence.sampler.config import SamplerConfig
    from confluence.sampler.sampler import Sampler
    from tests.fixtures.bookstore import bookstore_metadata

    plain = Store.open(preprocess(write_bookstore(tmp_path, size="small"), write_metadata(tmp_path,
                                  bookstore_metadata()), tmp_path / "store", encoder=HashEncoder(8), progress=False))
    n = plain.meta["num_columns"] if "num_columns" in plain.meta else len(plain.meta["columns"])
    assert [c for c in store.meta["columns"]][:n] == [c for c in plain.meta["columns"]][:n]
    cfg = SamplerConfig(batch_size=4, seq_len=96, max_rows=32, row_buckets=(32,), text_buckets=(64,))

    def digests(st: Store) -> dict[str, str]:
        sampler = Sampler([st], cfg, seed=0)
        try:
            out = {}
            for task in st.tasks:
                res = sampler.build(task.name, np.arange(min(4, task.num_seeds)))
                b = res.batch
                out[task.name] = hashlib.sha256(b"".join(np.ascontiguousarray(getattr(b, f)).tobytes()
                                                         for f in sorted(vars(b)) if isinstance(getattr(b, f),
                                                                                                  np.ndarray))
                                                ).hexdigest()
            return out
        finally:
            sampler.close()

    assert digests(store) == digests(plain)


def test_group_links_collapses_repeats():
    res = group_links(np.array([3, 1, 3, 3, 1]), np.array([5, 5, 5, 5, 9]), np.array([7, 2, 7, 4, 2]))
    assert res.anchor_row.tolist() == [1, 1, 3] and res.obs_time.tolist() == [5, 9, 5]
    assert res.offsets.tolist() == [0, 1, 2, 4] and res.targets.tolist() == [2, 2, 4, 7]
    assert res.duplicates == 1 and res.query_rows == 5


# -- metrics -------------------------------------------------------------------------------------------------------
def test_map_at_k_by_hand():
    # seed 0: truth {1, 2, 3}; ranked [1, 9, 2, 8] -> hits at 1 and 3: AP = (1/1 + 2/3) / min(3, 4) = 5/9
    # seed 1: truth {5}; ranked [6, 5, 7, 8] -> hit at 2: AP = (1/2) / 1
    pred = np.array([[1, 9, 2, 8], [6, 5, 7, 8]])
    counts, flat = np.array([3, 1]), np.array([1, 2, 3, 5])
    m = L.metrics(pred, counts, flat)
    assert m["map"] == pytest.approx((5 / 9 + 1 / 2) / 2)
    assert m["precision"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert m["recall"] == pytest.approx((2 / 3 + 1) / 2)
    dcg0, idcg0 = 1 + 1 / np.log2(4), 1 + 1 / np.log2(3) + 1 / np.log2(4)
    assert m["ndcg"] == pytest.approx((dcg0 / idcg0 + (1 / np.log2(3)) / 1) / 2)
    assert m["n"] == 2


def _relbench_map(pred_isin: np.ndarray, dst_count: np.ndarray) -> float:
    """RelBench's `link_prediction_map`, restated: seeds with no destination are dropped; the precision at each
    rank times the hit, summed, over the destination count clipped at k."""
    keep = dst_count > 0
    pred_isin, dst_count = pred_isin[keep], dst_count[keep]
    k = pred_isin.shape[1]
    precision = np.cumsum(pred_isin, axis=1) / (np.arange(k) + 1)
    return float(((precision * pred_isin).sum(axis=1) / dst_count.clip(max=k)).mean())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_map_equals_relbench_formula(seed):
    rng = np.random.default_rng(seed)
    n, k, catalog = int(rng.integers(1, 12)), int(rng.integers(1, 8)), int(rng.integers(3, 30))
    truth = [rng.choice(catalog, size=int(rng.integers(1, catalog)), replace=False) for _ in range(n)]
    pred = np.stack([rng.choice(catalog, size=min(k, catalog), replace=False) for _ in range(n)])
    counts = np.array([len(t) for t in truth])
    flat = np.concatenate(truth)
    isin = np.stack([np.isin(p, t) for p, t in zip(pred, truth, strict=True)])
    assert L.metrics(pred, counts, flat)["map"] == pytest.approx(_relbench_map(isin, counts))


def test_a_repeated_or_missing_row_scores_nothing():
    pred = np.array([[4, 4, -1]])
    m = L.metrics(pred, np.array([2]), np.array([4, 5]))
    assert m["precision"] == pytest.approx(1 / 3) and m["map"] == pytest.approx(1 / 2)


# -- baselines -----------------------------------------------------------------------------------------------------
def test_baselines_are_leak_free(store):
    """A seed observed at T ranks the same whatever the links of seeds observed after T - horizon are: they are
    not yet known at T. Checked at every test observation time, the later links replaced by random rows."""
    info, arr = store.link_task("customer_books"), store.link_arrays("customer_books")
    test_ids = link_split_ids(store, "customer_books", "test")
    times = np.unique(np.asarray(arr.obs_time)[test_ids])
    assert len(test_ids) > 10 and len(times) > 2
    books = store.table("books")
    seed_time = np.repeat(np.asarray(arr.obs_time), np.diff(arr.offsets))
    rng = np.random.default_rng(0)
    for t in times:
        ids = test_ids[np.asarray(arr.obs_time)[test_ids] == t]
        before = baseline_rankings(store, "customer_books", ids)
        targets = np.array(arr.targets).copy()
        future = seed_time > t - info.horizon_us
        assert future.any()
        targets[future] = rng.integers(books.row_offset, books.row_offset + books.num_rows, int(future.sum()))
        shuffled = type(arr)(arr.anchor_row, arr.obs_time, arr.offsets, targets)

        class Shuffled:
            def __getattr__(self, name):
                return getattr(store, name)

            def link_arrays(self, name, _arrays=shuffled):
                return _arrays

        after = baseline_rankings(Shuffled(), "customer_books", ids)
        for name in before:
            assert (before[name] == after[name]).all(), (name, t)
        # the ranker's pair counts of every book, its forecast too, read the same known links
        every = [np.arange(books.row_offset, books.row_offset + books.num_rows)] * len(ids)
        counts = [L.pair_counts_at(a.anchor_row, a.obs_time, a.offsets, a.targets, info.horizon_us,
                                   (books.row_offset, books.row_offset + books.num_rows),
                                   np.asarray(arr.anchor_row)[ids], np.asarray(arr.obs_time)[ids], every,
                                   forecast_windows=2)
                  for a in (arr, shuffled)]
        assert all((x == y).all() for x, y in zip(*counts, strict=True)), t
        assert any(x[:, 0].any() for x in counts[0])  # some anchor's own link was counted
        assert any((before[n] >= 0).any() for n in before)  # something known was ranked


def test_past_targets_rank_the_anchors_own_known_links_first():
    # anchor 0: seeds at t=0 (targets 10, 11), t=5 (target 11); horizon 2; evaluated seed at t=9 (target 12)
    anchor, obs = np.array([0, 0, 0, 1]), np.array([0, 5, 9, 0])
    offsets, targets = np.array([0, 2, 3, 4, 5]), np.array([10, 11, 11, 12, 13])
    fill = np.array([[13, 11, 12]])
    out = L.past_targets(anchor, obs, offsets, targets, 2, np.array([2]), 3, fill=fill)
    assert out.tolist() == [[11, 10, 13]]  # 11 twice, 10 once, then popularity without repeats
    pop = L.popularity(anchor, obs, offsets, targets, 2, (10, 14), np.array([2]), 3)
    assert pop.tolist() == [[11, 10, 13]]  # known by t=7: 10, 11, 11, 13 (seed at t=9 not yet)


def test_co_linked_ranks_what_other_anchors_linked_to_along_with_the_anchors_own_targets():
    # seeds at t=1 (horizon 0): a0 -> {10, 11}, a1 -> {10, 12}, a2 -> {11, 12, 13}; a0 again at t=5 -> {14}
    anchor, obs = np.array([0, 1, 2, 0]), np.array([1, 1, 1, 5])
    offsets, targets = np.array([0, 2, 4, 7, 8]), np.array([10, 11, 10, 12, 11, 12, 13, 14])
    fill = np.array([[19, 12, 18, 17]] * 3)
    out = L.co_linked_at(anchor, obs, offsets, targets, 0, (10, 20), np.array([0, 3, 0]), np.array([2, 2, 1]), 4,
                         fill=fill)
    # a0 at t=2: 12 through a1 and a2, 13 through a2; its own 10, 11 left out; then the fill without repeats
    assert out[0].tolist() == [12, 13, 19, 18]
    assert out[1].tolist() == [19, 12, 18, 17]  # an anchor with no known link: the fill alone
    # at t=1 nothing is known yet (a seed's links are known from its time + horizon on, here t=1 itself)
    assert L.co_linked_at(anchor, obs, offsets, targets, 1, (10, 20), np.array([0]), np.array([1]), 2).tolist() \
        == [[-1, -1]]


def test_pair_counts_say_how_much_and_how_lately_from_known_links_only():
    # horizon 2; a0's seeds at t=0 -> {10, 11}, t=4 -> {11}, t=9 -> {12}; a1's at t=3 -> {11, 13}
    anchor, obs = np.array([0, 0, 0, 1]), np.array([0, 4, 9, 3])
    offsets, targets = np.array([0, 2, 3, 4, 6]), np.array([10, 11, 11, 12, 11, 13])
    rows = [np.array([10, 11, 12, 13]), np.array([11])]
    got = L.pair_counts_at(anchor, obs, offsets, targets, 2, (10, 14), np.array([0, 1]), np.array([7, 5]), rows)
    # a0 at T=7 knows seeds up to t=5: 10 once (t=0), 11 twice (latest t=4), not 12 (t=9); every anchor: 10 once,
    # 11 three times, 13 once; the last horizon before t=5 is (3, 5]: only the t=4 link to 11
    assert got[0].tolist() == [[1, 2 / 7, 1, 0], [2, 2 / 3, 3, 1], [0, 0, 0, 0], [0, 0, 1, 0]]
    # a1 at T=5 knows up to t=3: its own 11 (t=3, recency 2 / 2), and 11 twice overall; (1, 3]: a1's link
    assert got[1].tolist() == [[1, 1.0, 2, 1]]
    # with a forecast: one column more, the rest unchanged; it is fitted at the start of the cutoff's day (here 0,
    # these times being microseconds) and with too little history to learn from it is the count of the horizon
    # before that, (-2, 0]: a0's t=0 links to 10 and 11
    more = L.pair_counts_at(anchor, obs, offsets, targets, 2, (10, 14), np.array([0, 1]), np.array([7, 5]), rows,
                            forecast_windows=2)
    assert [x[:, :4].tolist() for x in more] == [x.tolist() for x in got]
    assert [x[:, 4].tolist() for x in more] == [[1, 1, 0, 0], [1]]
    assert L.pair_count_names(2)[4:] == ("row_forecast",)


def test_run_link_baselines_scores_every_baseline(store):
    res = run_link_baselines(store, split="test")["customer_books"]
    assert set(res) >= {"popularity", "recent_popularity", "past_targets", "co_linked", "baseline", "info"}
    assert res["info"]["k"] == 5 and res["info"]["n_eval"] == res["popularity"]["n"] > 0
    for name in ("popularity", "recent_popularity", "past_targets", "co_linked"):
        assert 0.0 <= res[name]["map"] <= 1.0


@pytest.mark.parametrize("query, refusal", [
    ("SELECT o.customer_id, o.ordered_at AS observed_at, o.book_id FROM orders o WHERE o.order_id NOT IN (SELECT"
     " length(column0) FROM read_csv('/etc/passwd', header = false, columns = {'column0': 'VARCHAR'}))",
     "read_csv"),
    ("SELECT customer_id, ordered_at AS observed_at, book_id FROM orders); ATTACH 'x.db' AS pwn; SELECT (1",
     "its query fails"),  # closing the subquery it is wrapped in: a parse error, nothing attached
])
def test_a_hostile_link_query_is_refused_and_writes_nothing(tmp_path, query, refusal):
    """A link task's SQL is untrusted like every task's: validation names the task and refuses to run it, and
    preprocessing writes no store."""
    from confluence.errors import ConfluenceError

    src = write_bookstore(tmp_path, size="small")
    out = tmp_path / "store"
    with pytest.raises(ConfluenceError) as err:
        preprocess(src, write_metadata(tmp_path, meta_with(query=query)), out, encoder=HashEncoder(8),
                   progress=False)
    assert "link task 'customer_books'" in str(err.value) and refusal in str(err.value), str(err.value)
    assert not out.exists() and not (tmp_path / "x.db").exists() and not (src / "x.db").exists()


# -- exact top-k ---------------------------------------------------------------------------------------------------
@st.composite
def _top_k_case(draw) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Queries and keys of small whole numbers (many equal scores), k from 1 to past the number of keys, and a
    block of a few queries (several blocks a call)."""
    d, n, m = draw(st.integers(1, 4)), draw(st.integers(1, 9)), draw(st.integers(0, 12))
    whole = st.integers(-2, 2).map(float)

    def matrix(rows: int) -> np.ndarray:
        cells = draw(st.lists(whole, min_size=rows * d, max_size=rows * d))
        return np.array(cells, dtype=np.float32).reshape(rows, d)

    return matrix(n), matrix(m), draw(st.integers(1, m + 3)), draw(st.integers(1, 4))


@settings(max_examples=200, deadline=None)
@given(_top_k_case())
def test_top_k_equals_a_full_sort(case):
    """`top_k` is the full sort of every key by score (descending, index ascending on ties) cut at k; past the
    number of keys it pads with -1 and -inf."""
    queries, keys, k, block = case
    idx, val = L.top_k(queries, keys, k, block=block)
    assert idx.shape == val.shape == (len(queries), k)
    for q, got_idx, got_val in zip(queries, idx, val, strict=True):
        scores = [float(np.dot(q.astype(np.float64), key)) for key in keys.astype(np.float64)]
        order = sorted(range(len(keys)), key=lambda j: (-scores[j], j))[:k]
        want_idx = order + [-1] * (k - len(order))
        want_val = [scores[j] for j in order] + [-np.inf] * (k - len(order))
        assert got_idx.tolist() == want_idx
        assert got_val.tolist() == want_val
