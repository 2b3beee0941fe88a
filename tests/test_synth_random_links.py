"""Link tasks of random databases (`confluence synth random`): what pretraining learns ranking from. A task's
answers are exactly the links of its window recomputed from the child table (nothing after the window, no row
that does not exist yet), the link signals make anchors re-take their own targets, the tables keep their bytes
without them, and every link task preprocesses and builds leak-free batches."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path

import duckdb
import numpy as np
import pytest

from confluence.errors import ConfigError
from confluence.preprocess.pipeline import preprocess
from confluence.sampler.links import LinkSource
from confluence.schema.metadata import parse_horizon
from confluence.store import Store
from confluence.synth.random_db import RandomSpec, generate_random, write_random
from confluence.training.config import RunConfig
from tests.fixtures.configs import seed_sampler


def _child(db, task: dict) -> tuple[str, str, str, str]:
    """The child table of a link task and its anchor key, target key and time columns."""
    child = task["description"].split("'s ", 1)[1].split(" rows link", 1)[0]
    target_col = task["description"].split("(through ", 1)[1].split(")", 1)[0]
    cols = db.metadata["tables"][child]["columns"]
    anchor_col = next(c for c, v in cols.items()
                      if v.get("foreign_key") == f"{task['anchor_table']}.{task['anchor_key']}")
    return child, anchor_col, target_col, db.metadata["tables"][child]["temporal_column"]


def _exists_by(db, table: str, key: str) -> dict:
    """Key -> the row's time (None: a static table's row, there all along)."""
    meta = db.metadata["tables"][table]
    keys = db.tables[table].column(key).to_pylist()
    tc = meta.get("temporal_column")
    times = db.tables[table].column(tc).to_pylist() if tc else [None] * len(keys)
    return dict(zip(keys, times, strict=True))


@pytest.mark.parametrize("seed", [0, 4, 5])
def test_a_link_task_answers_are_the_links_of_its_window(seed):
    """Recomputed in Python from the child table: per observation time, the (anchor, target) pairs of child rows
    in (t, t + horizon] whose anchor and target rows exist at t. Nothing later, nothing earlier, nothing missed."""
    db = generate_random(RandomSpec(seed=seed, rows=0.3))
    tasks = db.metadata.get("link_tasks", {})
    assert tasks, "this seed draws link tasks"
    con = duckdb.connect()
    for n, t in db.tables.items():
        con.register(n, t)
    for name, task in tasks.items():
        assert db.drawn["tasks"][name] == "link" and name not in db.metadata["tasks"]
        child, anchor_col, target_col, tc = _child(db, task)
        horizon = dt.timedelta(microseconds=parse_horizon(task["horizon"]))
        anchors = _exists_by(db, task["anchor_table"], task["anchor_key"])
        targets = _exists_by(db, task["target_table"], task["target_key"])
        got = defaultdict(set)
        for a, t, b in con.sql(task["query"]).fetchall():
            got[t].add((a, b))
        val, test = (dt.datetime.fromisoformat(task["split"][k]) for k in ("val_time", "test_time"))
        assert val in got and test in got and max(got) == test and sum(t < val for t in got) >= 2
        rows = db.tables[child].to_pydict()
        for t, pairs in got.items():
            want = {(a, b) for a, b, at in zip(rows[anchor_col], rows[target_col], rows[tc], strict=True)
                    if t < at <= t + horizon and a in anchors and b in targets
                    and (anchors[a] is None or anchors[a] <= t) and (targets[b] is None or targets[b] <= t)}
            assert pairs == want, (name, t)


def _repeat_share(db) -> float:
    """Over the link tasks' child rows: the share whose target the same anchor took in an earlier row."""
    shares = []
    for task in db.metadata["link_tasks"].values():
        child, anchor_col, target_col, _ = _child(db, task)
        rows = db.tables[child].to_pydict()
        seen, again, n = set(), 0, 0
        for a, b in zip(rows[anchor_col], rows[target_col], strict=True):  # rows are in time order
            if a is None or b is None:
                continue
            again, n = again + ((a, b) in seen), n + 1
            seen.add((a, b))
        shares.append(again / max(n, 1))
    return float(np.mean(shares))


def test_link_signals_make_anchors_retake_their_targets_and_off_keeps_the_draws():
    on, off = (generate_random(RandomSpec(seed=0, rows=0.3, link_signal=s)) for s in (1.0, 0.0))
    assert set(on.metadata["link_tasks"]) == set(off.metadata["link_tasks"])
    assert _repeat_share(on) > _repeat_share(off) + 0.1
    assert any(k.startswith("link_signal_") for t in on.drawn["tables"].values() for k in t)
    assert not any(k.startswith("link_signal_") for t in off.drawn["tables"].values() for k in t)
    # the signal's own generator: a table without a second parent draws the same values either way
    same = [n for n in on.tables if on.tables[n].equals(off.tables[n])]
    assert same and len(same) < len(on.tables)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_link_signal_out_of_range_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match="link_signal"):
        RandomSpec(link_signal=bad)


def test_random_link_tasks_preprocess_and_build_leak_free_batches(tmp_path: Path):
    from confluence.textenc.default import StaticEncoder

    root = write_random(tmp_path / "db", RandomSpec(seed=0, rows=0.3))
    store = Store.open(preprocess(root / "raw", root / "random.metadata.json", tmp_path / "store",
                                  encoder=StaticEncoder(), progress=False))
    meta = __import__("json").loads((root / "random.metadata.json").read_text())
    assert {t.name for t in store.link_tasks} == set(meta["link_tasks"])
    cfg = RunConfig(sampler=seed_sampler(batch_size=4, seq_len=96, max_rows=24, row_buckets=(24,),
                                         text_buckets=(64,)))
    for info in store.link_tasks:
        source = LinkSource(store, info.name, cfg)
        try:
            _, ids = next(source.train_batches(0))
            batch = source.batch(ids)
            batch.result.batch.validate()
            times = source.obs_time[ids]
            for i in range(len(ids)):  # no context row after the seed's observation time
                rows = batch.result.rows[i, :batch.result.nrows[i]]
                assert (store.row_time[rows] <= times[i]).all()
            assert batch.candidates.any()
        finally:
            source.close()
