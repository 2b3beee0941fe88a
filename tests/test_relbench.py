"""RelBench datasets with their task tables, end to end on a small RelBench-format folder written here exactly as
RelBench writes one (`Table.save`: pandas -> Arrow with `fkey_col_to_pkey_table` / `pkey_col` / `time_col` JSON in
the Parquet schema metadata; `db/<table>.parquet`, `tasks/<task>/{train,val,test}.parquet`): draft-metadata ->
preprocess -> a short training -> evaluate with RelBench's result layout."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn import metrics as skm
from typer.testing import CliRunner

from confluence.cli.eval_cmds import results_lines
from confluence.cli.main import app
from confluence.errors import MetadataError
from confluence.evaluation.baselines import split_ids
from confluence.evaluation.evaluate import evaluate
from confluence.evaluation.relbench import relbench_results
from confluence.inference.predictor import load_model
from confluence.preprocess.pipeline import preprocess
from confluence.sampler import Sampler, SplitConfig
from confluence.schema.draft import draft_metadata
from confluence.schema.metadata import parse_metadata, parse_time, save_metadata
from confluence.schema.validate import validate_against_data
from confluence.sources import DataWarning, open_source
from confluence.store import Store
from confluence.stypes import SemanticType
from confluence.training.loop import open_stream, train
from tests.fixtures.bookstore import HashEncoder
from tests.fixtures.configs import seed_sampler
from tests.fixtures.model import tiny_run_config

D_T = 16
VAL_TS, TEST_TS = pd.Timestamp("2021-07-01"), pd.Timestamp("2021-10-01")
DELTA = pd.Timedelta(days=30)


def save_table(df: pd.DataFrame, path: Path, fkeys: dict[str, str], pkey: str | None, time_col: str | None) -> None:
    """RelBench's `Table.save` (relbench/base/table.py): the frame as Arrow, the keys as JSON schema metadata."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = {"fkey_col_to_pkey_table": fkeys, "pkey_col": pkey, "time_col": time_col}
    table = table.replace_schema_metadata({**table.schema.metadata,
                                           **{k: json.dumps(v).encode("utf-8") for k, v in meta.items()}})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _timestamps(review: pd.DataFrame, split: str) -> pd.DatetimeIndex:
    """RelBench's task timestamps (relbench/base/task_base.py `_get_table`)."""
    if split == "train":
        return pd.date_range(start=VAL_TS - DELTA, end=review.review_time.min(), freq=-DELTA)
    if split == "val":
        return pd.date_range(start=VAL_TS, end=min(VAL_TS + DELTA * 2, TEST_TS - DELTA), freq=DELTA)
    return pd.date_range(start=TEST_TS, end=min(TEST_TS + DELTA, review.review_time.max() - DELTA), freq=DELTA)


def write_relbench_folder(root: Path, hidden_test: bool = False) -> Path:
    """A small RelBench dataset folder: customers, products and their reviews over two years; task folders
    `user-churn` (binary), `item-sales` (regression), `review-rating` (an autocomplete task: its target is a column
    of the entity table) and `user-item-purchase` (link prediction: a link task). `hidden_test`: item-sales' test table
    without its target, as RelBench's `get_table("test")` returns it."""
    rng = np.random.default_rng(0)
    n_cust, n_prod = 40, 12
    customer = pd.DataFrame({"customer_id": np.arange(n_cust), "age": rng.integers(18, 80, n_cust).astype(float),
                             "country": rng.choice(["fr", "de", "it"], n_cust)})
    product = pd.DataFrame({"product_id": np.arange(n_prod), "category": rng.choice(["a", "b", "c"], n_prod),
                            "price": rng.uniform(5, 50, n_prod).round(2)})
    rows = []
    start = pd.Timestamp("2020-01-01")
    activity = rng.uniform(0.2, 3.0, n_cust)  # reviews per month: some customers churn, some do not
    for c in range(n_cust):
        k = rng.poisson(activity[c] * 24)
        times = start + pd.to_timedelta(np.sort(rng.uniform(0, 730, k)), unit="D")
        for t in times:
            rows.append((c, int(rng.integers(0, n_prod)), t.floor("s"), float(rng.integers(1, 6)),
                         bool(rng.random() < 0.7)))
    review = pd.DataFrame(rows, columns=["customer_id", "product_id", "review_time", "rating", "verified"])
    review = review.sort_values("review_time").reset_index(drop=True)
    review.insert(0, "review_id", np.arange(len(review)))
    save_table(customer, root / "db" / "customer.parquet", {}, "customer_id", None)
    save_table(product, root / "db" / "product.parquet", {}, "product_id", None)
    save_table(review, root / "db" / "review.parquet", {"customer_id": "customer", "product_id": "product"},
               "review_id", "review_time")
    for split in ("train", "val", "test"):
        churn, sales, purchase = [], [], []
        for t in _timestamps(review, split):
            window = review[(review.review_time > t) & (review.review_time <= t + DELTA)]
            past = review[(review.review_time > t - DELTA) & (review.review_time <= t)]
            for c in sorted(past.customer_id.unique()):
                churn.append((t, c, int(c not in set(window.customer_id))))
            for p, n in window.groupby("product_id").size().items():
                sales.append((t, p, float(n)))
            for c, items in window.groupby("customer_id").product_id:
                purchase.append((t, c, sorted(set(items))))
        churn_df = pd.DataFrame(churn, columns=["timestamp", "customer_id", "churn"])
        sales_df = pd.DataFrame(sales, columns=["timestamp", "product_id", "sales"])
        if hidden_test and split == "test":
            sales_df = sales_df[["timestamp", "product_id"]]  # RelBench's masked test table: no target
        save_table(churn_df, root / "tasks" / "user-churn" / f"{split}.parquet", {"customer_id": "customer"}, None,
                   "timestamp")
        save_table(sales_df, root / "tasks" / "item-sales" / f"{split}.parquet", {"product_id": "product"}, None,
                   "timestamp")
        save_table(pd.DataFrame(purchase, columns=["timestamp", "customer_id", "product_id"]),
                   root / "tasks" / "user-item-purchase" / f"{split}.parquet",
                   {"customer_id": "customer", "product_id": "product"}, None, "timestamp")
        # an autocomplete task (relbench/base/task_autocomplete.py): the entity table's own rows, time and column
        lo, hi = {"train": (review.review_time.min(), VAL_TS - pd.Timedelta(seconds=1)),
                  "val": (VAL_TS, TEST_TS - pd.Timedelta(seconds=1)), "test": (TEST_TS, review.review_time.max())}[split]
        rows = review[(review.review_time > lo) & (review.review_time <= hi)]
        save_table(rows[["review_time", "review_id", "rating"]].reset_index(drop=True),
                   root / "tasks" / "review-rating" / f"{split}.parquet", {"review_id": "review"}, None, "review_time")
    return root


RB_TASKS = {"item-sales": SemanticType.NUMERICAL, "review-rating": SemanticType.NUMERICAL,
            "user-churn": SemanticType.BOOLEAN}
TASK_KEYS = {"item-sales": ("product_id", "timestamp"), "review-rating": ("review_id", "review_time"),
             "user-churn": ("customer_id", "timestamp")}


def _draft(root: Path, tmp: Path) -> tuple[object, list[DataWarning], list[str], Path]:
    with open_source(root) as raw, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        meta = draft_metadata(raw, name="rel-toy")
        validate_against_data(meta, raw)  # the draft validates against its own data
        tables = list(raw.tables)
    save_metadata(meta, tmp / "rel-toy.metadata.json")
    return meta, [w.message for w in caught if isinstance(w.message, DataWarning)], tables, \
        tmp / "rel-toy.metadata.json"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("relbench")
    root = write_relbench_folder(tmp / "rel-toy")
    meta, warned, tables, meta_path = _draft(root, tmp)
    store = preprocess(root, meta_path, tmp / "store", encoder=HashEncoder(D_T), progress=False)
    return {"tmp": tmp, "root": root, "meta": meta, "warned": warned, "tables": tables, "meta_path": meta_path,
            "store": store}


@pytest.fixture(scope="module")
def run(dataset):
    cfg = tiny_run_config(model={"d_t": D_T}, sampler={"row_buckets": [16], "text_buckets": [64], "width": 4,
                                                       "max_rows": 16, "seq_len": 48, "batch_size": 8},
                          loop={"max_steps": 24, "ckpt_every": 24, "val_every": 24})
    with open_stream([dataset["store"]], cfg) as stream:
        train(cfg, stream, dataset["tmp"] / "run", progress=False)
    return dataset["tmp"] / "run"


@pytest.fixture(scope="module")
def model(run):
    return load_model(run)  # once for the Python evaluations (the CLI loads its own)


def _file_rows(root: Path, task: str) -> dict[tuple[int, int], str]:
    """(entity key, observation time in epoch µs) -> the split file the row came from."""
    key, time = TASK_KEYS[task]
    out = {}
    for split in ("train", "val", "test"):
        df = pd.read_parquet(root / "tasks" / task / f"{split}.parquet")
        us = df[time].astype("datetime64[us]").astype("int64")
        out.update({(int(k), int(t)): split for k, t in zip(df[key], us, strict=True)})
    return out


def test_draft_makes_one_task_per_entity_task_folder(dataset):
    meta = dataset["meta"]
    for name, stype in RB_TASKS.items():
        task = meta.tasks[name]
        assert task.target_stype == stype, name
        assert task.split is not None and task.split.column == "split"
        assert "2021-07-01" <= task.split.val_time < "2021-10-01" <= task.split.test_time  # the files' first rows
        assert "inferred from the values" in task.reason and "RelBench does not record the task type" in task.reason
    churn = meta.tasks["user-churn"]
    assert (churn.anchor_table, churn.anchor_key, churn.observation_time_column) == ("customer", "customer_id",
                                                                                     "timestamp")
    assert (churn.split.val_time, churn.split.test_time) == ("2021-07-01 00:00:00", "2021-10-01 00:00:00")
    assert "only 0 and 1" in churn.reason
    # the horizon (labelled context) is RelBench's timedelta, the step between observation times; an autocomplete
    # target is known at its row's time
    assert churn.horizon == meta.tasks["item-sales"].horizon == "30 days" and "horizon 30 days" in churn.reason
    assert meta.tasks["review-rating"].horizon == "0 seconds"
    # the link-prediction folder is a link task with the same split; its destination lists are unnested
    assert "user-item-purchase" not in meta.tasks
    link = meta.link_tasks["user-item-purchase"]
    assert (link.anchor_table, link.anchor_key, link.target_table, link.target_key) == ("customer", "customer_id",
                                                                                        "product", "product_id")
    assert (link.split.val_time, link.split.test_time, link.horizon) == ("2021-07-01 00:00:00",
                                                                         "2021-10-01 00:00:00", "30 days")
    assert "unnest" in link.query and "eval_k" in link.reason
    assert [w for w in dataset["warned"] if w.code == "relbench_task_skipped"] == []
    assert "user-item-purchase (link prediction)" in meta.description
    # an autocomplete task's target leaves the database (RelBench removes it), so no row can show it
    assert meta.tables["review"].columns["rating"].stype == SemanticType.IGNORED
    assert "review.rating" not in meta.tasks
    # cell-masking tasks take RelBench's cut-offs; those of static tables (contexts without a cut-off) are left out
    cells = [t for t in meta.tasks.values() if t.is_cell_masking(meta)]
    assert cells and all(t.split is not None and t.split.column is None for t in cells)
    assert not any(n.startswith(("customer.", "product.")) for n in meta.tasks)
    assert "static tables customer, product" in meta.description


def test_task_tables_never_become_tables_of_the_graph(dataset):
    db_tables = ["customer", "product", "review"]
    assert dataset["tables"] == db_tables and list(dataset["meta"].tables) == db_tables
    store = Store.open(dataset["store"])
    assert [t.name for t in store.tables] == db_tables
    rows = sum(pq.read_metadata(dataset["root"] / "db" / f"{t}.parquet").num_rows for t in db_tables)
    assert store.num_rows == rows  # not one task-table row among the graph's rows
    assert not any(c.table not in (None, *db_tables) for c in store.columns)
    # a metadata file that lists a task table as a table of the database is refused
    bad = dataset["meta"].to_json()
    bad["tables"]["user-churn/train"] = {"columns": {"customer_id": {"stype": "identifier"}}}
    with open_source(dataset["root"]) as raw:
        assert raw.fetchall('SELECT count(*) FROM relbench_tasks."user-churn/train"')[0][0] > 0
        with pytest.raises(MetadataError, match="table 'user-churn/train': in the metadata but not in the data"):
            validate_against_data(parse_metadata(bad), raw)


def test_every_row_lands_in_the_split_of_its_file(dataset):
    store = Store.open(dataset["store"])
    # the run's configured split (hash) is overridden by the task's own
    sampler = Sampler([store], seed_sampler(split=SplitConfig(mode="hash")))
    for task in RB_TASKS:
        files = _file_rows(dataset["root"], task)
        arrays = store.task_arrays(task)
        info = store.table(store.task(task).anchor_table)
        keys = np.asarray(store.keys(info.name))[np.asarray(arrays.anchor_row) - info.row_offset]
        stored = [(int(k), int(t)) for k, t in zip(keys, np.asarray(arrays.obs_time), strict=True)]
        assert sorted(stored) == sorted(files), task  # exactly the files' rows, each once
        for split in ("train", "val", "test"):
            want = sorted(k for k, s in files.items() if s == split)
            for ids in (split_ids(store, task, split), sampler.seed_ids(split, task)):
                assert sorted(stored[i] for i in ids) == want, (task, split)
    # no training seed of any task (cell-masking ones too) is observed at or after the first validation time
    val_us = min(parse_time(t.split.val_time) for t in dataset["meta"].tasks.values())
    cutoff = (val_us - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    for task in store.tasks:
        ids = sampler.seed_ids("train", task.name)
        assert len(ids) and np.asarray(store.task_arrays(task.name).obs_time)[ids].max() < cutoff, task.name
    sampler.close()


def test_the_split_column_guards_the_cut_offs(dataset):
    moved = dataset["meta"].to_json()
    moved["tasks"]["user-churn"]["split"]["val_time"] = "2021-05-15"  # the last train rows (06-01) would be val
    with open_source(dataset["root"]) as raw:
        with pytest.raises(MetadataError, match=r"task 'user-churn': \d+ of \d+ row\(s\) are not in the split"
                                                r" their column 'split' names"):
            validate_against_data(parse_metadata(moved), raw)
    moved["tasks"]["user-churn"]["split"]["val_time"] = "July 2021"
    with pytest.raises(MetadataError, match=r"task 'user-churn': field 'split.val_time' 'July 2021' is not an ISO"):
        parse_metadata(moved)
    moved["tasks"]["user-churn"]["split"] = {"val_time": "2021-10-01", "test_time": "2021-07-01"}
    with pytest.raises(MetadataError, match="task 'user-churn': field 'split' needs val_time < test_time"):
        parse_metadata(moved)


def _sklearn(stype: SemanticType, y: np.ndarray, p: np.ndarray, train_std: float | None) -> dict[str, float]:
    """RelBench's metric functions (relbench/metrics.py), written out with scikit-learn."""
    if stype == SemanticType.BOOLEAN:
        return {"average_precision": skm.average_precision_score(y, p), "accuracy": skm.accuracy_score(y, p > 0.5),
                "f1": skm.f1_score(y, p >= 0.5, zero_division=0.0), "roc_auc": skm.roc_auc_score(y, p)}
    mae = skm.mean_absolute_error(y, p)
    return {"r2": skm.r2_score(y, p), "mae": mae, "rmse": skm.root_mean_squared_error(y, p), "nmae": mae / train_std}


@pytest.mark.slow
def test_evaluate_writes_relbench_results(dataset, run, model):
    out = dataset["tmp"] / "relbench.json"
    res = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(run), "--db", str(dataset["store"]),
                                   "--relbench-json", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["dataset"] == "rel-toy" and doc["checkpoint_step"] == 24
    assert sorted(doc["tasks"]) == sorted(RB_TASKS)  # the RelBench tasks, not the cell-masking ones
    by_split = {s: evaluate(model, dataset["store"], split=s, tasks=list(RB_TASKS), max_seeds=None, keep_rows=True)
                for s in ("val", "test")}
    files = {t: _file_rows(dataset["root"], t) for t in RB_TASKS}
    for task, stype in RB_TASKS.items():
        kind = "binary_classification" if stype == SemanticType.BOOLEAN else "regression"
        assert doc["tasks"][task]["task_type"] == kind
        trivial = ["majority"] if stype == SemanticType.BOOLEAN else ["mean", "median"]
        for split in ("val", "test"):
            rows = by_split[split][task]["rows"]
            assert doc["tasks"][task]["n"][split] == len(rows.truth) == sum(s == split for s in files[task].values())
            for name, pred, block in [("model", rows.pred, doc["model"])] + [
                    (b, rows.trivial[b], doc["baselines"][b]) for b in trivial]:
                got, want = block[task][split], _sklearn(stype, rows.truth, pred, rows.train_std)
                assert list(got) == list(want), (task, name)
                assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (task, split, name)
    assert "gbdt" not in doc["baselines"]


def test_hidden_test_labels_are_predicted_not_scored(tmp_path, dataset, model):
    root = write_relbench_folder(tmp_path / "rel-toy", hidden_test=True)
    meta, _, _, meta_path = _draft(root, tmp_path)
    assert "hidden labels" in meta.tasks["item-sales"].reason
    store = preprocess(root, meta_path, tmp_path / "store", encoder=HashEncoder(D_T), progress=False)
    n_test = sum(s == "test" for s in _file_rows(dataset["root"], "item-sales").values())
    assert len(split_ids(Store.open(store), "item-sales", "test")) == n_test  # the rows exist, for prediction
    by_split = {s: evaluate(model, store, split=s, tasks=["item-sales"], max_seeds=None, keep_rows=True)
                for s in ("val", "test")}
    assert "no labels in split 'test'" in by_split["test"]["item-sales"]["info"]["note"]
    assert "model" not in by_split["test"]["item-sales"]
    lines = results_lines(by_split["test"], "test")  # the console says so, at 80 columns
    assert any("no labels in split 'test'" in line for line in lines) and max(map(len, lines)) <= 80
    doc = relbench_results(by_split, dataset="rel-toy")
    assert doc["model"]["item-sales"]["test"] is None and doc["model"]["item-sales"]["val"]["mae"] >= 0
    assert "no labels" in doc["tasks"]["item-sales"]["notes"]["test"]


def test_relbench_json_needs_val_or_test(dataset, run):
    res = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(run), "--db", str(dataset["store"]),
                                   "--relbench-json", str(dataset["tmp"] / "x.json"), "--split", "train"])
    assert res.exit_code == 1 and "--relbench-json reports val and test" in res.output


def test_task_folders_that_cannot_keep_their_split_are_left_out_saying_why(tmp_path, dataset):
    root = shutil.copytree(dataset["root"], tmp_path / "rel-toy")
    churn = root / "tasks" / "user-churn"
    train, val = pq.read_table(churn / "train.parquet"), pq.read_table(churn / "val.parquet")
    early = train.slice(0, 1).cast(val.schema)  # a train row put in val (the files differ in time unit)
    pq.write_table(pa.concat_tables([val, early]), churn / "val.parquet")
    (root / "tasks" / "item-sales" / "test.parquet").unlink()
    meta, warned, _, _ = _draft(root, tmp_path)
    why = {w.column: str(w) for w in warned if w.code == "relbench_task_skipped"}
    assert "train.parquet reaches" in why["user-churn"] and "not split by time" in why["user-churn"]
    assert "no test.parquet" in why["item-sales"]
    assert "user-churn" not in meta.tasks and "item-sales" not in meta.tasks and "review-rating" in meta.tasks


def test_a_recommendation_folder_keeps_every_link_and_its_split(dataset):
    """The link task of `user-item-purchase` holds exactly the files' (customer, time, product) links, each seed in
    the split of its file."""
    from confluence.evaluation.links import link_split_ids

    store = Store.open(dataset["store"])
    arr = store.link_arrays("user-item-purchase")
    cust, prod = store.table("customer"), store.table("product")
    got = {}
    for i in range(len(arr.anchor_row)):
        key = (int(arr.anchor_row[i] - cust.row_offset), int(arr.obs_time[i]))
        got[key] = sorted(int(r - prod.row_offset) for r in arr.targets[arr.offsets[i]:arr.offsets[i + 1]])
    want, split_of = {}, {}
    for split in ("train", "val", "test"):
        df = pd.read_parquet(dataset["root"] / "tasks" / "user-item-purchase" / f"{split}.parquet")
        us = df["timestamp"].astype("datetime64[us]").astype("int64")
        for c, t, items in zip(df["customer_id"], us, df["product_id"], strict=True):
            want[(int(c), int(t))] = sorted(int(x) for x in items)
            split_of[(int(c), int(t))] = split
    assert got == want  # customer / product keys are their row numbers in this folder
    for split in ("train", "val", "test"):
        ids = link_split_ids(store, "user-item-purchase", split)
        keys = {(int(arr.anchor_row[i] - cust.row_offset), int(arr.obs_time[i])) for i in ids}
        assert keys == {k for k, s in split_of.items() if s == split}, split
