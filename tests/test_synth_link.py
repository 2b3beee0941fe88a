"""Planted link signals: deterministic bytes, valid and preprocessable with its four link tasks, the oracle scored on
exactly the store's seeds, and each planted signal visible to the baseline it targets and to no other (co-occurrence
and attribute match both to the co-linked rows: users of one taste take items of one genre)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.errors import ConfluenceError
from confluence.evaluation.links import link_split_ids, run_link_baselines
from confluence.store import Store
from confluence.synth.planted_links import CHANNELS, PlantedLinksSpec, oracle_map, write_planted_links
from tests.fixtures.bookstore import HashEncoder

SPEC = PlantedLinksSpec(seed=0)  # the defaults: docs/design/learnability.md's numbers are this test's


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return write_planted_links(tmp_path_factory.mktemp("planted_links") / "db", SPEC)


@pytest.fixture(scope="module")
def store(planted, tmp_path_factory) -> Store:
    from confluence.preprocess.pipeline import preprocess

    out = tmp_path_factory.mktemp("planted_links_store") / "store"
    return Store.open(preprocess(planted / "raw", planted / "planted_links.metadata.json", out,
                                 encoder=HashEncoder(8), progress=False))


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _ceilings(root: Path) -> dict:
    return json.loads((root / "ceilings.json").read_text())["tasks"]


def test_the_cli_writes_the_same_bytes_and_never_overwrites(planted, tmp_path):
    out = tmp_path / "again"
    result = CliRunner().invoke(app, ["synth", "planted-links", "--out", str(out), "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert "co_occurrence" in result.output and "next: confluence preprocess" in result.output
    assert _digests(out) == _digests(planted)
    again = CliRunner().invoke(app, ["synth", "planted-links", "--out", str(out)])
    assert again.exit_code == 1 and "already exists" in again.output
    with pytest.raises(ConfluenceError, match="already exists"):
        write_planted_links(planted, SPEC)
    assert _digests(out) == _digests(planted)


def test_another_seed_draws_other_data(tmp_path):
    small = {"users": 60, "items": 40, "weeks": 20}
    a = write_planted_links(tmp_path / "a", PlantedLinksSpec(seed=1, **small))
    b = write_planted_links(tmp_path / "b", PlantedLinksSpec(seed=2, **small))
    assert _digests(a)["raw/interactions.parquet"] != _digests(b)["raw/interactions.parquet"]


def test_the_planted_draws_are_what_the_tasks_say(planted):
    """Read back from the raw tables: repeat links mostly re-take the user's own past items; co-occurrence and
    attribute-match links never do; attribute-match links mostly have the genre of the user's taste."""
    con = duckdb.connect()
    for name in ("users", "items", "interactions"):
        con.register(name, pq.read_table(planted / "raw" / f"{name}.parquet"))
    share = dict(con.execute("""
        SELECT i.channel, avg(CASE WHEN EXISTS (SELECT 1 FROM interactions p WHERE p.user_id = i.user_id
            AND p.item_id = i.item_id AND p.channel = i.channel AND p.at < date_trunc('week', i.at)) THEN 1 ELSE 0 END)
        FROM interactions i WHERE i.at > TIMESTAMP '2023-07-01' GROUP BY i.channel""").fetchall())
    match = con.execute("""SELECT avg(CASE WHEN u.taste = t.genre THEN 1 ELSE 0 END) FROM interactions i
        JOIN users u USING (user_id) JOIN items t USING (item_id) WHERE i.channel = 'attribute_match'""").fetchone()[0]
    print({**share, "attribute_match genre = taste": match})
    assert share["repeat"] > 0.7 and share["co_occurrence"] == 0 and share["attribute_match"] == 0
    assert 0.85 < match < 0.95  # 0.9 planted, plus the uniform draws' 1 in 20


def test_validates_and_preprocesses_with_the_oracle_on_the_stores_seeds(planted, store):
    """Every link task reaches the store, and its seeds and their items are exactly the oracle table's, so the
    ceiling is scored on the seeds the baselines (and any model) are."""
    meta = json.loads((planted / "planted_links.metadata.json").read_text())
    assert [t.name for t in store.link_tasks] == list(meta["link_tasks"]) == list(CHANNELS)
    users, items = store.keys("users").to_pylist(), store.keys("items").to_pylist()
    first_user, first_item = store.table("users").row_offset, store.table("items").row_offset
    ceilings = _ceilings(planted)
    for task in CHANNELS:
        arr = store.link_arrays(task)
        oracle = pq.read_table(planted / "oracle" / f"{task}.parquet")
        assert oracle.num_rows == len(arr.anchor_row), task
        got = [(users[a - first_user], int(t), sorted(items[r - first_item] for r in arr.targets[lo:hi]))
               for a, t, lo, hi in zip(arr.anchor_row, arr.obs_time, arr.offsets[:-1], arr.offsets[1:], strict=True)]
        obs = oracle.column("obs_time").cast("int64").to_pylist()
        want = list(zip(oracle.column("user_id").to_pylist(), obs, oracle.column("targets").to_pylist(), strict=True))
        assert got == want, task
        week = np.asarray(oracle.column("week"))
        for split, n, ceil in (("val", "n_val", "ceiling_val"), ("test", "n", "ceiling")):
            ids = link_split_ids(store, task, split)
            assert len(ids) == ceilings[task][n] > 500, (task, split)
            rows = oracle.take(ids)
            assert len(np.unique(week[ids])) == 8
            assert oracle_map(rows) == pytest.approx(ceilings[task][ceil]), (task, split)


def test_each_signal_is_visible_to_its_baseline_and_not_to_the_others(planted, store):
    res = run_link_baselines(store, split="val")
    ceilings = _ceilings(planted)
    print(f"\n{'task':16s} {'ceiling':>8s} {'popularity':>10s} {'recent':>8s} {'past':>8s} {'co-linked':>9s}"
          "  (MAP@10, validation)")
    maps = {}
    for task in CHANNELS:
        maps[task] = {b: res[task][b]["map"] for b in ("popularity", "recent_popularity", "past_targets", "co_linked")}
        print(f"{task:16s} {ceilings[task]['ceiling_val']:8.3f} {maps[task]['popularity']:10.3f} "
              f"{maps[task]['recent_popularity']:8.3f} {maps[task]['past_targets']:8.3f} "
              f"{maps[task]['co_linked']:9.3f}")
    ceil = {t: ceilings[t]["ceiling_val"] for t in CHANNELS}
    # repeat: the anchor's own past finds it, popularity does not
    assert maps["repeat"]["past_targets"] > maps["repeat"]["popularity"] + 0.5
    assert maps["repeat"]["past_targets"] > 0.9 * ceil["repeat"]
    # trend: last week's popularity finds it, all-time popularity does not
    assert maps["trend"]["recent_popularity"] > maps["trend"]["popularity"] + 0.12
    assert maps["trend"]["recent_popularity"] > 0.7 * ceil["trend"]
    # co-occurrence and attribute match: what other users took along with the user's own items finds them (users of
    # one taste take items of one genre), nothing else does
    for task in ("co_occurrence", "attribute_match"):
        assert ceil[task] > 0.2, task
        assert maps[task]["co_linked"] > 0.8 * ceil[task], (task, maps[task])
        others = [maps[task][b] for b in ("popularity", "recent_popularity", "past_targets")]
        assert max(others) < 0.25 * ceil[task], (task, maps[task])
