"""Planted link signals: a small users / items / interactions database whose four link tasks ("which items will
this user interact with in the next week?") each depend on one known kind of link signal, with the MAP@k of the
generator's own oracle ranking (it knows the planted probabilities) as that task's ceiling.

    users (static) <- interactions (temporal, weekly) -> items (static)

Every interaction has a `channel`; task `<channel>` asks for a user's interactions of that channel in the 7 days
after a weekly observation time. Each week a user is active in each channel with the user's own rate (Beta, mean
`activity`) and then draws 1-3 items from the channel's distribution, which depends only on the planted state at
the week's start (the user's past items of the channel, the attributes, the trend schedule):

| task | signal | how an active user's items are drawn | the baseline it is visible to |
|---|---|---|---|
| `repeat` | repeat | 0.85: an item of their own past in proportion to its count; else uniform | past targets |
| `co_occurrence` | co-occurrence with other users | 0.9: a new item of the hidden cluster of one of their past items (clusters of 8: users who took one item took others of its cluster); else a new item | none |
| `attribute_match` | attribute match | 0.9: a new item whose `genre` is the user's `taste`; else a new item | none |
| `trend` | a recent-popularity trend | 0.7: an item of the week's hot set (2 items turn hot each week, their weight rising and falling over 6 weeks); else uniform | recent popularity |

The oracle ranks all items by the drawing probabilities of the seed's week (ties by item id); its MAP@k on a
split's seeds is that task's ceiling. It knows what no ranker sees directly (the clusters, the hot items of the
coming week), which the past reveals only statistically, so a model's gap to it is an upper bound on what is left.
Ranking by the per-draw probability is not exactly MAP-optimal for sets of 1-3 items, so a ranker can tie it (past
targets on `repeat` do, within 0.01).
Everything is drawn from one `numpy` generator seeded by `seed`: the same seed gives the same bytes.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from confluence.errors import ConfigError
from confluence.synth.output import Contents, write_generated
from confluence.targets import link as L
from confluence.toolkit.config import positive

CHANNELS = ("repeat", "co_occurrence", "attribute_match", "trend")
SIGNALS = {
    "repeat": "a user re-takes items of their own past",
    "co_occurrence": "a user takes new items that co-occur with their past items in other users' histories",
    "attribute_match": "a user takes new items whose genre matches their taste",
    "trend": "items' popularity rises and falls week by week (recent popularity)",
}
GENRES = ("jazz", "rock", "pop", "folk", "blues", "soul", "funk", "metal", "punk", "disco", "opera", "techno",
          "house", "reggae", "ska", "swing", "gospel", "grunge", "ambient", "salsa")
REGIONS = ("north", "south", "east", "west", "central")
START = dt.datetime(2023, 1, 2)  # a Monday: week w is (START + 7w days, START + 7(w + 1) days]
WEEK_S = 7 * 86400
REPEAT = 0.85  # share of a repeat draw taken from the user's own past
CONTINUE = 0.9  # share of a co-occurrence draw taken from the clusters of the user's past items
CLUSTER = 8  # items per hidden co-occurrence cluster
MATCH = 0.9  # share of an attribute-match draw taken from the user's genre
HOT = 0.7  # share of a trend draw taken from the hot items
HOT_PER_WEEK = 2  # items that turn hot each week
HOT_RAMP = (0.25, 0.5, 1.0, 1.0, 0.5, 0.25)  # a hot item's weight by weeks since it turned hot


@dataclass(frozen=True)
class PlantedLinksSpec:
    """Sizes of a planted link database."""

    seed: int = 0
    users: int = 1250
    items: int = 480  # a multiple of CLUSTER and of len(GENRES): 24 items per genre
    weeks: int = 52  # the last 8 observation weeks are test, the 8 before validation
    activity: float = 0.12  # mean weekly probability that a user is active in a channel
    k: int = 10

    def __post_init__(self) -> None:
        positive(self, "users", "items", "k")
        if self.items % CLUSTER or self.items % len(GENRES):
            raise ConfigError("items", f"must be a multiple of {CLUSTER} and {len(GENRES)}, got {self.items}")
        if self.weeks < 20:
            raise ConfigError("weeks", f"must be at least 20 (train, 8 validation and 8 test weeks), got {self.weeks}")
        if not 0.0 < self.activity < 1.0:
            raise ConfigError("activity", f"must be in (0, 1), got {self.activity}")


@dataclass
class PlantedLinksDatabase:
    """The tables, their metadata with the four link tasks, per task the oracle's ranking of every seed, and the
    ceilings."""

    tables: dict[str, pa.Table]
    metadata: dict[str, Any]
    oracle: dict[str, pa.Table]  # task -> user_id, obs_time, week, targets (item ids), oracle (top-k item ids)
    ceilings: dict[str, dict[str, Any]]  # task -> {signal, metric, ceiling (test), n, ceiling_val, n_val}


def week_start(week: int) -> dt.datetime:
    """Observation time of `week`: its interactions are in (week_start, week_start + 7 days]."""
    return START + dt.timedelta(days=7 * week)


def split_weeks(spec: PlantedLinksSpec) -> tuple[int, int]:
    """First validation and first test week: the last 16 weeks, 8 each."""
    return spec.weeks - 16, spec.weeks - 8


def _hot_schedule(rng: np.random.Generator, spec: PlantedLinksSpec) -> np.ndarray:
    """[weeks, items] trend weights: each week (from before the first, so week 0 has a full hot set) HOT_PER_WEEK
    items that are not hot turn hot, weighted HOT_RAMP by the weeks since."""
    span = len(HOT_RAMP)
    ramp = np.zeros((spec.weeks + span, spec.items))
    for s in range(spec.weeks + span - 1):
        free = np.flatnonzero(ramp[s] == 0)
        new = rng.choice(free, HOT_PER_WEEK, replace=False)
        for age, weight in enumerate(HOT_RAMP):
            if s + age < len(ramp):
                ramp[s + age, new] = weight
    return ramp[span - 1:span - 1 + spec.weeks]


def _new_items(p_focus: np.ndarray, taken: np.ndarray, share: float) -> np.ndarray:
    """Rows of `share` x (p_focus restricted to untaken items, renormalized) + the rest uniform over untaken items
    (all the mass there when the focus has none left)."""
    free = ~taken
    focus = p_focus * free
    mass = focus.sum(axis=1, keepdims=True)
    w = np.where(mass > 0, share, 0.0)
    focus = np.divide(focus, mass, out=np.zeros_like(focus), where=mass > 0)
    uniform = free / np.maximum(free.sum(axis=1, keepdims=True), 1)
    return w * focus + (1.0 - w) * uniform


def channel_probabilities(channel: str, counts: np.ndarray, *, week: int, taste: np.ndarray, genre: np.ndarray,
                          cluster: np.ndarray, hot: np.ndarray) -> np.ndarray:
    """[users, items]: each user's per-draw item probabilities in `channel` for `week`, from `counts` (their
    interactions of this channel before the week), the users' tastes, the items' genres and hidden clusters, and
    the trend schedule."""
    n_users, n_items = counts.shape
    if channel == "repeat":
        total = counts.sum(axis=1, keepdims=True)
        own = np.divide(counts, total, out=np.zeros(counts.shape), where=total > 0)
        return np.where(total > 0, REPEAT * own + (1 - REPEAT) / n_items, 1.0 / n_items)
    taken = counts > 0
    if channel == "co_occurrence":
        onehot = cluster[:, None] == np.arange(cluster.max() + 1)[None, :]  # [items, clusters]
        per_cluster = taken.astype(np.float64) @ onehot  # the user's taken items per cluster
        # a past item drawn uniformly, then a new item of its cluster uniformly: weight m_c / (remaining in c)
        remaining = CLUSTER - per_cluster
        w = np.divide(per_cluster, remaining, out=np.zeros_like(per_cluster), where=remaining > 0)
        return _new_items(w[:, cluster], taken, CONTINUE)
    if channel == "attribute_match":
        return _new_items((genre[None, :] == taste[:, None]).astype(np.float64), taken, MATCH)
    if channel == "trend":
        p = HOT * hot[week] / hot[week].sum() + (1 - HOT) / n_items
        return np.broadcast_to(p, (n_users, n_items))
    raise ValueError(f"unknown channel {channel!r}")


def _draw(rng: np.random.Generator, p: np.ndarray, n: int) -> np.ndarray:
    """[rows, n] item indices, each row's n draws (with replacement) from its distribution."""
    cum = np.cumsum(p, axis=1)
    cum /= cum[:, -1:]
    u = rng.random((len(p), n))
    return np.minimum((cum[:, None, :] < u[:, :, None]).sum(axis=2), p.shape[1] - 1)


def generate_links(spec: PlantedLinksSpec = PlantedLinksSpec()) -> PlantedLinksDatabase:
    """Draw a planted link database (module docstring) from `spec`; deterministic in `spec`."""
    rng = np.random.default_rng(spec.seed)
    n_users, n_items = spec.users, spec.items
    taste = rng.integers(0, len(GENRES), n_users)
    genre = rng.permutation(np.arange(n_items) % len(GENRES))
    cluster = rng.permutation(np.arange(n_items) // CLUSTER)
    hot = _hot_schedule(rng, spec)
    rate = rng.beta(2.0, 2.0 / spec.activity - 2.0, n_users)  # mean `activity`
    users = pa.table({
        "user_id": pa.array(np.arange(1, n_users + 1), pa.int64()),
        "taste": [GENRES[i] for i in taste],
        "age": pa.array(rng.integers(18, 80, n_users), pa.int64()),
        "region": [REGIONS[i] for i in rng.integers(0, len(REGIONS), n_users)],
    })
    items = pa.table({
        "item_id": pa.array(np.arange(1, n_items + 1), pa.int64()),
        "genre": [GENRES[i] for i in genre],
        "price": pa.array(np.round(rng.lognormal(2.5, 0.6, n_items), 2), pa.float64()),
    })
    counts = {c: np.zeros((n_users, n_items), np.int64) for c in CHANNELS}
    rows: list[tuple[np.ndarray, ...]] = []  # per (week, channel): user, item, seconds, channel index
    seeds: dict[str, list[tuple[np.ndarray, ...]]] = {c: [] for c in CHANNELS}  # week, user, draws, oracle top-k
    for week in range(spec.weeks):
        for ci, channel in enumerate(CHANNELS):
            active = np.flatnonzero(rng.random(n_users) < rate)
            n = 1 + rng.binomial(2, 0.25, len(active))
            p = channel_probabilities(channel, counts[channel][active], week=week, taste=taste[active],
                                      genre=genre, cluster=cluster, hot=hot)
            draws = _draw(rng, p, 3)
            used = np.arange(3)[None, :] < n[:, None]
            top = np.argsort(-p, axis=1, kind="stable")[:, :spec.k]
            seeds[channel].append((np.full(len(active), week), active, np.where(used, draws, -1), top))
            who, item = np.repeat(active, n), draws[used]
            np.add.at(counts[channel], (who, item), 1)
            seconds = week * WEEK_S + rng.integers(1, WEEK_S, len(who))
            rows.append((who, item, seconds, np.full(len(who), ci)))
    who, item, seconds, chan = (np.concatenate(c) for c in zip(*rows, strict=True))
    order = np.lexsort((item, who, seconds))
    who, item, seconds, chan = who[order], item[order], seconds[order], chan[order]
    interactions = pa.table({
        "interaction_id": pa.array(np.arange(1, len(who) + 1), pa.int64()),
        "user_id": pa.array(who + 1, pa.int64()),
        "item_id": pa.array(item + 1, pa.int64()),
        "at": pa.array(np.datetime64(START, "s") + seconds.astype("timedelta64[s]"), pa.timestamp("us")),
        "channel": [CHANNELS[i] for i in chan],
    })
    tables = {"users": users, "items": items, "interactions": interactions}
    oracle = {c: _oracle_table(spec, s) for c, s in seeds.items()}
    return PlantedLinksDatabase(tables, links_metadata(spec), oracle, {c: ceiling(c, oracle[c], spec)
                                                                       for c in CHANNELS})


def _oracle_table(spec: PlantedLinksSpec, parts: list[tuple[np.ndarray, ...]]) -> pa.Table:
    """Per seed (a user active in the week): user id, observation time, week, its distinct items (the truth) and
    the oracle's top k, item ids (1-based) throughout; sorted by (user, time) as the store sorts seeds."""
    week, user, draws, top = (np.concatenate(c) for c in zip(*parts, strict=True))
    order = np.lexsort((week, user))
    week, user, draws, top = week[order], user[order], draws[order], top[order]
    truth = [sorted({int(d) + 1 for d in row if d >= 0}) for row in draws]
    obs = np.datetime64(START, "s") + (week * WEEK_S).astype("timedelta64[s]")
    return pa.table({
        "user_id": pa.array(user + 1, pa.int64()),
        "obs_time": pa.array(obs, pa.timestamp("us")),
        "week": pa.array(week, pa.int64()),
        "targets": pa.array(truth, pa.list_(pa.int64())),
        "oracle": pa.array((top + 1).tolist(), pa.list_(pa.int64())),
    })


def oracle_map(rows: pa.Table) -> float:
    """MAP@k of the oracle on `rows` of an oracle table (`PlantedLinksDatabase.oracle`, or
    `oracle/<task>.parquet`, any subset of its rows), by `confluence.targets.link.metrics`."""
    if rows.num_rows == 0:
        return float("nan")
    pred = np.array(rows.column("oracle").to_pylist(), dtype=np.int64)
    truth = rows.column("targets").to_pylist()
    counts = np.array([len(t) for t in truth], dtype=np.int64)
    flat = np.array([x for t in truth for x in t], dtype=np.int64)
    return L.metrics(pred, counts, flat)["map"]


def ceiling(task: str, oracle: pa.Table, spec: PlantedLinksSpec) -> dict[str, Any]:
    """The oracle's MAP@k on `task`'s test seeds (`ceiling`) and validation seeds (`ceiling_val`)."""
    val, test = split_weeks(spec)
    week = np.asarray(oracle.column("week"))
    on_test = oracle.filter(pa.array(week >= test))
    on_val = oracle.filter(pa.array((week >= val) & (week < test)))
    return {"signal": SIGNALS[task], "metric": f"map@{spec.k}", "ceiling": oracle_map(on_test),
            "n": on_test.num_rows, "ceiling_val": oracle_map(on_val), "n_val": on_val.num_rows}


def link_query(spec: PlantedLinksSpec, channel: str) -> str:
    """The link task's query: per weekly observation time, each user's items of `channel` in the next 7 days."""
    first, last = week_start(0), week_start(spec.weeks - 1)
    return (f"WITH obs AS (SELECT unnest(generate_series(TIMESTAMP '{first:%Y-%m-%d}', TIMESTAMP '{last:%Y-%m-%d}', "
            "INTERVAL 7 DAY)) AS obs_time) "
            "SELECT i.user_id, o.obs_time, i.item_id FROM obs o JOIN interactions i "
            "ON i.at > o.obs_time AND i.at <= o.obs_time + INTERVAL 7 DAY "
            f"WHERE i.channel = '{channel}'")


def links_metadata(spec: PlantedLinksSpec) -> dict[str, Any]:
    """The reviewed metadata of a planted link database: three tables and the four link tasks."""
    val, test = split_weeks(spec)
    split = {"val_time": f"{week_start(val):%Y-%m-%d}", "test_time": f"{week_start(test):%Y-%m-%d}"}
    link_tasks = {
        c: {"query": link_query(spec, c), "anchor_table": "users", "anchor_key": "user_id",
            "observation_time_column": "obs_time", "target_table": "items", "target_key": "item_id",
            "horizon": "7 days", "k": spec.k, "split": split,
            "description": f"the items a user takes through channel '{c}' in the week after the observation time; "
                           f"planted: {SIGNALS[c]}"}
        for c in CHANNELS}
    return {
        "name": f"planted_links{spec.seed}",
        "description": f"planted link-signal database (confluence synth planted-links, {spec})",
        "tables": {
            "users": {"primary_key": "user_id", "columns": {
                "user_id": {"stype": "identifier"}, "taste": {"stype": "categorical"},
                "age": {"stype": "numerical"}, "region": {"stype": "categorical"}}},
            "items": {"primary_key": "item_id", "columns": {
                "item_id": {"stype": "identifier"}, "genre": {"stype": "categorical"},
                "price": {"stype": "numerical"}}},
            "interactions": {"primary_key": "interaction_id", "temporal_column": "at", "columns": {
                "interaction_id": {"stype": "identifier"},
                "user_id": {"stype": "identifier", "foreign_key": "users.user_id"},
                "item_id": {"stype": "identifier", "foreign_key": "items.item_id"},
                "at": {"stype": "timestamp"}, "channel": {"stype": "categorical"}}},
        },
        "tasks": {},
        "link_tasks": link_tasks,
    }


def write_planted_links(out: str | Path, spec: PlantedLinksSpec = PlantedLinksSpec(), *,
                        overwrite: bool = False) -> Path:
    """Generate and write a planted link database under `out` (appearing atomically):

    * `raw/<table>.parquet`: the raw database;
    * `planted_links.metadata.json`: its metadata with the four link tasks;
    * `ceilings.json`: per task its signal and the oracle's MAP@k on the test (and validation) seeds;
    * `oracle/<task>.parquet`: per seed (user id, observation time) its items and the oracle's top k, to score
      the ceiling on exactly the seeds a benchmark evaluates.

    Refuses an existing `out` unless `overwrite`."""

    def build() -> Contents:
        db = generate_links(spec)
        clean = {t: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in c.items()}
                 for t, c in db.ceilings.items()}  # no seeds in a split: null, not JSON's invalid NaN
        return ({"raw": db.tables, "oracle": db.oracle},
                {"planted_links.metadata.json": db.metadata,
                 "ceilings.json": {"spec": spec.__dict__, "tasks": clean}})

    return write_generated(out, build, overwrite=overwrite)
