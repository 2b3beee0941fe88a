"""Planted-signal databases: small relational databases where each task's target depends on exactly one known kind
of relational signal, with the best any predictor can do on it (its ceiling) computed from the generating process.

One database holds every signal, each behind its own task, so one preprocessing and one training run cover them all:

    regions (static) <- stores (static) <- customers (static) <- orders (temporal) [-> couriers (static)]
                                                  [<- visits (temporal)]

| task | signal | target | Bayes predictor |
|---|---|---|---|
| `customers.tier` | same-row categorical -> categorical | tier = map(segment), else a uniform class | map(segment) |
| `customers.flag` | same-row numbers -> boolean | flag ~ Bernoulli(sigmoid(a x1 - b x2 + c)) | sigmoid(a x1 - b x2 + c) |
| `customers.pref` | a parent's attribute | pref = map(store.kind), else uniform | map(store.kind) |
| `customers.zone` | a two-hop ancestor's attribute | zone ~ Bernoulli(p(region.climate)) | p(region.climate) |
| `customers.interest` | a text column's content | interest = topic of bio, else uniform | topic(bio) |
| `orders.late` | a periodic time effect (hour of day, weekday) | late ~ Bernoulli(p(hour, weekday)) | p(hour, weekday) |
| `customer_orders_30d` | count of children in a time window | orders in (t - 30 days, t] | the count itself |
| `customer_mean_amount` | mean of children's values | mean amount of orders at or before t | the mean itself |
| `customer_last_channel` | the most recent child's value | channel of the latest order at or before t | that channel |
| `orders.total` | a number close to a function of same-row numbers | quantity x unit price x lognormal(0, 0.02) | quantity x unit price |
| `orders.fee` | a number whose level moves with time | 10 x 2^(years since the start) x lognormal(0, 0.1) | 10 x 2^years |
| `customer_amount_90d` | a sum of children's values in a time window | sum of amounts in (t - 90 days, t] | the sum itself |
| `orders.handling` (with `couriers`) | a parent's form: the mean of many earlier siblings' values | the courier's hidden mean + N(0, 15) minutes | the courier's mean |
| `orders.handover` (with `couriers`) | two parents of one table compared | the courier's hidden mean - the relay courier's + N(0, 5) | that difference |
| `customer_next_visit` (with `visits`) | a "when next" time on a database of decades | the customer's first visit after t | last visit + the plan's gap, its conditional median |

The last six are the root causes of losses to LightGBM found on real databases (docs/design/learnability.md): they are
drawn from a second, a third and a fourth generator, so the columns of the first nine signals keep their bytes. The
two courier tasks, only in a database drawn with `couriers` > 0 (`synth planted --couriers 16`; without, the database is byte for byte
what it was before it existed), stands for a match decided by the teams' form: a courier carries about a thousand
orders, one order's handling time says little about its courier (noise 15 minutes against a spread of 12 between
couriers), and only the mean over many of the courier's earlier orders tells it; the courier's row says nothing (its
`vehicle` is drawn apart). `orders.handover` stands for a match's goal difference: each order also names a relay
courier (another one, through a second foreign key to `couriers`), and the hand-over time is the difference of the
two couriers' forms, so a predictor must tell which of the order's two courier rows is which. They are opt-in
because the courier on every order changes what the other signals' contexts hold (docs/design/learnability.md).
`customer_next_visit`, only with `visits` (`synth planted --visits`), stands for a "when next" time measured on a
database of decades (a sports database's next match date): each customer has a visible `plan` (fortnightly,
monthly, quarterly), visits at gaps of the plan's days x lognormal(0, 0.15), and a date of birth (`born_on`, 1940-2004) that
stretches the database's times over 80 years, as real people's birth dates do; so a week is a few thousandths of
the database's time scale. The Bayes predictor is the median of the next visit given the plan and the latest visit
at or before t (the gaps are independent, so nothing earlier tells more).

`noise` is the share of rows whose categorical target is redrawn uniformly (and it sets the flip rate of the
booleans' generating probabilities); the derived (windowed) targets are exact functions of the visible past, so their
ceiling is perfect. Class imbalance (segment shares 0.6 / 0.3 / 0.1, a negative intercept for `flag`), NULLs in
nuisance columns and in order amounts, and dangling foreign keys (orders of customers that do not exist) are planted
too. Everything is drawn from one `numpy` generator seeded by `seed`: the same seed gives the same bytes.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from confluence.errors import ConfigError
from confluence.evaluation.metrics import (
    binary_metrics,
    categorical_metrics,
    headline_metric,
    regression_metrics,
)
from confluence.stypes import SemanticType
from confluence.synth.output import Contents, write_generated
from confluence.toolkit.config import non_negative, positive

CLIMATES = ("arid", "humid", "polar", "temperate")
ZONE_P = {"arid": 0.9, "humid": 0.1, "polar": 0.9, "temperate": 0.1}  # P(zone | climate)
STORE_KINDS = ("K1", "K2", "K3", "K4")
PREFS = ("P1", "P2", "P3", "P4")
SEGMENTS = ("A", "B", "C")  # one-letter codes on purpose: they embed almost alike as text (../shared/findings.md)
SEGMENT_SHARES = (0.6, 0.3, 0.1)
TIERS = ("X", "Y", "Z")
CHANNELS = ("web", "app", "shop")
TOPICS = {
    "sports": ("football", "tennis", "running", "cycling", "swimming", "marathon", "goalkeeper", "stadium"),
    "cooking": ("recipes", "baking", "pasta", "spices", "bread", "kitchen", "soup", "dessert"),
    "travel": ("flights", "hotels", "beaches", "mountains", "passport", "islands", "museums", "trains"),
}
FILLER = ("i", "really", "like", "enjoy", "and", "often", "about", "weekends", "with", "friends", "new", "my")
FLAG_COEF = (3.0, -2.0, -1.0)  # flag logit = a x1 + b x2 + c (c < 0: about 30 % positives)
START = dt.datetime(2022, 1, 1)
DAYS = 730  # two years of orders
OBS_EVERY_DAYS = 61  # observation times of the derived tasks: every other month after the first 60 days
FEE_START = 10.0  # orders.fee at the start; it doubles every year (FEE_GROWTH)
FEE_GROWTH = 2.0
YEAR_S = 365.25 * 86400
TOTAL_NOISE = 0.02  # orders.total = quantity x unit_price x lognormal(0, TOTAL_NOISE)
FEE_NOISE = 0.1
VEHICLES = ("bike", "car", "van")
HANDLING_MEAN = 45.0  # minutes: the couriers' mean handling times are HANDLING_MEAN + COURIER_SPREAD x N(0, 1) ...
COURIER_SPREAD = 12.0
HANDLING_NOISE = 15.0  # ... and an order's handling time is its courier's + HANDLING_NOISE x N(0, 1)
HANDOVER_NOISE = 5.0  # an order's hand-over time: its courier's mean - its relay courier's + HANDOVER_NOISE x N(0, 1)
PLANS = ("fortnightly", "monthly", "quarterly")  # with `visits`: a customer's visits come at the plan's gap ...
PLAN_SHARES = (0.2, 0.4, 0.4)
PLAN_DAYS = (14.0, 30.0, 91.0)
VISIT_NOISE = 0.15  # ... x lognormal(0, VISIT_NOISE)
VISIT_TAIL_DAYS = 240  # visits go on this long after the orders' period, so every observation time has a next one
BORN_FIRST, BORN_LAST = dt.date(1940, 1, 1), dt.date(2004, 12, 31)  # the customers' dates of birth: decades of times


@dataclass(frozen=True)
class PlantedSpec:
    """Sizes and noise of a planted database."""

    seed: int = 0
    customers: int = 1500
    stores: int = 30
    regions: int = 6
    orders_per_customer: float = 12.0  # mean; per-customer rates are gamma-distributed (heavy-tailed fan-out)
    # > 0: each order gets one of this many couriers and `orders.handling` (16: ~1,100 orders each); out of the repr
    # and the ceilings' spec when 0, so a database without couriers keeps its bytes
    couriers: int = field(default=0, repr=False)
    # True: customers get a `plan` and a date of birth, a `visits` table and `customer_next_visit`; out of the repr
    # and the ceilings' spec when False, so a database without visits keeps its bytes
    visits: bool = field(default=False, repr=False)
    noise: float = 0.1  # share of categorical targets redrawn uniformly; boolean probabilities pulled toward 0.5
    dangling: float = 0.01  # share of orders whose customer does not exist
    null_rate: float = 0.05  # NULLs in nuisance columns and in order amounts

    def __post_init__(self) -> None:
        positive(self, "customers", "stores", "regions")
        non_negative(self, "orders_per_customer", "couriers")
        for name in ("noise", "dangling", "null_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(name, f"must be in [0, 1), got {getattr(self, name)}")


@dataclass
class PlantedDatabase:
    """The tables, their reviewed metadata, and per task its signal and Bayes predictions."""

    tables: dict[str, pa.Table]
    metadata: dict[str, Any]
    bayes: dict[str, pa.Table]  # task -> anchor key [, obs_time], target, bayes prediction(s)
    ceilings: dict[str, dict[str, Any]]  # task -> {signal, stype, metric, ceiling, n, ...}


def _pull(p: np.ndarray, noise: float) -> np.ndarray:
    """A boolean probability with label noise: with rate `noise` the label is a fair coin."""
    return (1.0 - noise) * p + noise * 0.5


def _noisy_map(rng: np.random.Generator, mapped: np.ndarray, k: int, noise: float) -> np.ndarray:
    """Class indices: `mapped`, except a `noise` share redrawn uniformly over the k classes (maybe the same)."""
    redraw = rng.random(mapped.size) < noise
    return np.where(redraw, rng.integers(0, k, mapped.size), mapped)


def _map_posterior(mapped: np.ndarray, k: int, noise: float) -> np.ndarray:
    """P(class | signal) of `_noisy_map`: 1 - noise + noise / k on the mapped class, noise / k elsewhere."""
    post = np.full((mapped.size, k), noise / k)
    post[np.arange(mapped.size), mapped] += 1.0 - noise
    return post


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def late_probability(hour: np.ndarray, weekday: np.ndarray) -> np.ndarray:
    """P(late) of an order from its time alone: evening hours (17-21) and weekends are late."""
    evening = (hour >= 17) & (hour <= 21)
    weekend = weekday >= 5
    return np.where(evening, 0.7, 0.1) + np.where(weekend, 0.2, 0.0)


def fee_level(seconds: np.ndarray) -> np.ndarray:
    """The level of `orders.fee` at `seconds` after the start (its MAE-optimal prediction: the noise's median is
    1): FEE_START, doubling every year."""
    return FEE_START * FEE_GROWTH ** (np.asarray(seconds, dtype=np.float64) / YEAR_S)


def text_topic(bio: str) -> str | None:
    """The topic whose words a biography uses (the Bayes predictor of `customers.interest`)."""
    words = set(bio.split())
    for topic, vocab in TOPICS.items():
        if words & set(vocab):
            return topic
    return None


def generate(spec: PlantedSpec = PlantedSpec()) -> PlantedDatabase:
    """Draw a planted database (module docstring) from `spec`; deterministic in `spec`."""
    rng = np.random.default_rng(spec.seed)
    noise = spec.noise
    # regions and stores: the ancestors
    climate = rng.integers(0, len(CLIMATES), spec.regions)
    regions = pa.table({
        "region_id": pa.array(np.arange(1, spec.regions + 1), pa.int64()),
        "climate": [CLIMATES[i] for i in climate],
        "population": pa.array(np.round(rng.lognormal(12, 1, spec.regions)), pa.float64()),
    })
    store_region = rng.integers(0, spec.regions, spec.stores)
    kind = rng.integers(0, len(STORE_KINDS), spec.stores)
    stores = pa.table({
        "store_id": pa.array(np.arange(1, spec.stores + 1), pa.int64()),
        "region_id": pa.array(store_region + 1, pa.int64()),
        "kind": [STORE_KINDS[i] for i in kind],
        "size_m2": pa.array(np.round(rng.uniform(50, 500, spec.stores), 1), pa.float64()),
    })
    # customers: same-row, parent, two-hop and text signals
    n = spec.customers
    cust_store = rng.integers(0, spec.stores, n)
    segment = rng.choice(len(SEGMENTS), n, p=SEGMENT_SHARES)
    tier_map = np.array([2, 0, 1])  # A -> Z, B -> X, C -> Y: not the identity of the codes' order
    tier = _noisy_map(rng, tier_map[segment], len(TIERS), noise)
    x1, x2 = np.round(rng.standard_normal(n), 4), np.round(rng.standard_normal(n), 4)  # as stored
    p_flag = _pull(_sigmoid(FLAG_COEF[0] * x1 + FLAG_COEF[1] * x2 + FLAG_COEF[2]), noise)
    flag = rng.random(n) < p_flag
    pref_map = np.array([1, 3, 0, 2])  # store kind -> preference
    pref = _noisy_map(rng, pref_map[kind[cust_store]], len(PREFS), noise)
    p_zone = _pull(np.array([ZONE_P[c] for c in CLIMATES])[climate[store_region[cust_store]]], noise)
    zone = rng.random(n) < p_zone
    topic_names = list(TOPICS)
    topic = rng.integers(0, len(topic_names), n)
    bios = []
    for t in topic:
        words = list(rng.choice(TOPICS[topic_names[t]], size=2, replace=False))
        words += list(rng.choice(FILLER, size=int(rng.integers(3, 7))))
        bios.append(" ".join(rng.permutation(words)))
    interest = _noisy_map(rng, topic, len(topic_names), noise)
    nuisance = rng.standard_normal(n)
    customers = pa.table({
        "customer_id": pa.array(np.arange(1, n + 1), pa.int64()),
        "store_id": pa.array(cust_store + 1, pa.int64()),
        "segment": [SEGMENTS[i] for i in segment],
        "tier": [TIERS[i] for i in tier],
        "x1": pa.array(x1, pa.float64()),
        "x2": pa.array(x2, pa.float64()),
        "x3": pa.array([None if rng.random() < spec.null_rate else round(float(v), 4) for v in nuisance],
                       pa.float64()),
        "flag": pa.array(flag),
        "pref": [PREFS[i] for i in pref],
        "zone": pa.array(zone),
        "bio": bios,
        "interest": [topic_names[i] for i in interest],
    })
    # orders: a heavy-tailed number per customer, times over two years, per-customer mean amounts
    rate = rng.gamma(0.8, spec.orders_per_customer / 0.8, n)
    counts = rng.poisson(rate)
    owner = np.repeat(np.arange(n), counts)
    m = owner.size
    seconds = np.sort(rng.integers(0, DAYS * 86400, m))
    owner = rng.permutation(owner)  # times sorted, owners shuffled: each customer's orders spread over the period
    ordered_at = [START + dt.timedelta(seconds=int(s)) for s in seconds]
    hour = np.array([t.hour for t in ordered_at])
    weekday = np.array([t.weekday() for t in ordered_at])
    p_late = _pull(late_probability(hour, weekday), noise)
    late = rng.random(m) < p_late
    mu = np.round(rng.lognormal(3.5, 0.6, n), 2)
    amount = np.round(mu[owner] * rng.lognormal(0, 0.25, m), 2)
    amount_null = rng.random(m) < spec.null_rate
    channel = rng.integers(0, len(CHANNELS), m)
    cust_id = owner + 1
    dangling = rng.random(m) < spec.dangling
    cust_id = np.where(dangling, n + 1 + rng.integers(0, n, m), cust_id)
    # the root-cause signals, from a second generator: the draws above (and their bytes) do not move
    rng2 = np.random.default_rng([spec.seed, 2])
    quantity = rng2.integers(1, 10, m)
    unit_price = np.round(rng2.lognormal(2.5, 0.5, m), 2)
    total_bayes = quantity * unit_price
    total = np.round(total_bayes * rng2.lognormal(0, TOTAL_NOISE, m), 2)
    fee_bayes = fee_level(seconds)
    fee = np.round(fee_bayes * rng2.lognormal(0, FEE_NOISE, m), 2)
    orders = pa.table({
        "order_id": pa.array(np.arange(1, m + 1), pa.int64()),
        "customer_id": pa.array(cust_id, pa.int64()),
        "ordered_at": pa.array(ordered_at, pa.timestamp("us")),
        "amount": pa.array([None if z else float(a) for a, z in zip(amount, amount_null, strict=True)], pa.float64()),
        "channel": [CHANNELS[i] for i in channel],
        "late": pa.array(late),
        "quantity": pa.array(quantity, pa.int64()),
        "unit_price": pa.array(unit_price, pa.float64()),
        "total": pa.array(total, pa.float64()),
        "fee": pa.array(fee, pa.float64()),
    })
    tables = {"regions": regions, "stores": stores, "customers": customers, "orders": orders}

    ids = np.arange(1, n + 1)
    bayes: dict[str, pa.Table] = {
        "customers.tier": _cat_table("customer_id", ids, tier, _map_posterior(tier_map[segment], 3, noise), TIERS),
        "customers.flag": pa.table({"customer_id": ids, "target": flag, "bayes": p_flag}),
        "customers.pref": _cat_table("customer_id", ids, pref,
                                     _map_posterior(pref_map[kind[cust_store]], 4, noise), PREFS),
        "customers.zone": pa.table({"customer_id": ids, "target": zone, "bayes": p_zone}),
        "customers.interest": _cat_table("customer_id", ids, interest, _map_posterior(topic, 3, noise),
                                         tuple(topic_names)),
        "orders.late": pa.table({"order_id": np.arange(1, m + 1), "target": late, "bayes": p_late}),
        "orders.total": pa.table({"order_id": np.arange(1, m + 1), "target": total, "bayes": total_bayes}),
        "orders.fee": pa.table({"order_id": np.arange(1, m + 1), "target": fee, "bayes": fee_bayes}),
    }
    if spec.couriers:  # a parent's form, from a third generator (every column above keeps its bytes)
        rng3 = np.random.default_rng([spec.seed, 3])
        courier_mean = HANDLING_MEAN + COURIER_SPREAD * rng3.standard_normal(spec.couriers)
        courier = rng3.integers(0, spec.couriers, m)
        handling_bayes = courier_mean[courier]
        handling = np.round(handling_bayes + HANDLING_NOISE * rng3.standard_normal(m), 1)
        relay = rng3.integers(0, spec.couriers - 1, m) if spec.couriers > 1 else courier
        relay = np.where(relay >= courier, relay + 1, relay) if spec.couriers > 1 else relay  # never the courier
        handover_bayes = courier_mean[courier] - courier_mean[relay]
        handover = np.round(handover_bayes + HANDOVER_NOISE * rng3.standard_normal(m), 1)
        tables["couriers"] = pa.table({
            "courier_id": pa.array(np.arange(1, spec.couriers + 1), pa.int64()),
            "vehicle": [VEHICLES[i] for i in rng3.integers(0, len(VEHICLES), spec.couriers)],
        })
        tables["orders"] = orders.append_column("courier_id", pa.array(courier + 1, pa.int64())).append_column(
            "handling", pa.array(handling, pa.float64())).append_column(
            "relay_courier_id", pa.array(relay + 1, pa.int64())).append_column(
            "handover", pa.array(handover, pa.float64()))
        bayes["orders.handling"] = pa.table({"order_id": np.arange(1, m + 1), "target": handling,
                                             "bayes": handling_bayes})
        bayes["orders.handover"] = pa.table({"order_id": np.arange(1, m + 1), "target": handover,
                                             "bayes": handover_bayes})
    if spec.visits:  # a "when next" time on a span of decades, from a fourth generator
        tables["customers"], tables["visits"] = _visits(np.random.default_rng([spec.seed, 4]), customers)
    bayes |= _derived_bayes(tables)
    if spec.visits:
        bayes["customer_next_visit"] = _next_visit_bayes(tables)
    metadata = planted_metadata(spec)
    return PlantedDatabase(tables, metadata, bayes, {t: ceiling(t, b) for t, b in bayes.items()})


def _visits(rng: np.random.Generator, customers: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The customers with their `plan` and `born_on`, and their visits: from a phase before the start, one visit
    per gap of the plan's days x lognormal(0, VISIT_NOISE), to VISIT_TAIL_DAYS after the orders' period."""
    n = customers.num_rows
    plan = rng.choice(len(PLANS), n, p=PLAN_SHARES)
    span = (BORN_LAST - BORN_FIRST).days
    born = [BORN_FIRST + dt.timedelta(days=int(d)) for d in rng.integers(0, span + 1, n)]
    end = (DAYS + VISIT_TAIL_DAYS) * 86400
    owner, at = [], []
    for i in range(n):
        gap = PLAN_DAYS[plan[i]] * 86400
        t = -rng.random() * gap
        while t < end:
            owner.append(i + 1)
            at.append(int(round(t)))
            t += gap * rng.lognormal(0.0, VISIT_NOISE)
    order = np.lexsort((np.asarray(owner), np.asarray(at)))
    at_s = np.asarray(at, np.int64)[order]
    visits = pa.table({
        "visit_id": pa.array(np.arange(1, len(at_s) + 1), pa.int64()),
        "customer_id": pa.array(np.asarray(owner, np.int64)[order], pa.int64()),
        "visited_at": pa.array([START + dt.timedelta(seconds=int(s)) for s in at_s], pa.timestamp("us")),
    })
    customers = customers.append_column("plan", pa.array([PLANS[i] for i in plan])).append_column(
        "born_on", pa.array(born, pa.date32()))
    return customers, visits


def next_visit_median(last_us: np.ndarray, obs_us: np.ndarray, plan_days: np.ndarray) -> np.ndarray:
    """The Bayes prediction of `customer_next_visit` under MAE: the median of last + G given last + G > obs, where
    G = plan days x lognormal(0, VISIT_NOISE) (epoch microseconds in and out)."""
    from scipy.special import ndtr, ndtri

    gap_us = plan_days * 86400e6
    waited = np.maximum(obs_us - last_us, 0).astype(np.float64)
    with np.errstate(divide="ignore"):
        z = np.log(waited / gap_us) / VISIT_NOISE  # -inf where the last visit is at the observation time
    below = ndtr(z)
    q = np.clip(below + (1.0 - below) / 2.0, 0.5, 1.0 - 1e-12)
    return last_us + gap_us * np.exp(VISIT_NOISE * ndtri(q))


def _next_visit_bayes(tables: dict[str, pa.Table]) -> pa.Table:
    """`customer_next_visit`'s rows (DuckDB over the tables) with the Bayes prediction from the customer's plan and
    latest visit at or before the observation time."""
    con = duckdb.connect()
    try:
        con.execute("SET threads = 1")
        for name in ("customers", "visits"):
            con.register(name, tables[name])
        t = con.sql(f"WITH q AS ({NEXT_VISIT_QUERY.format(obs=_obs_sql())}) SELECT q.customer_id, q.obs_time, "
                    "q.next_visit_at AS target, max(v.visited_at) AS last_at, any_value(c.plan) AS plan "
                    "FROM q JOIN visits v ON v.customer_id = q.customer_id AND v.visited_at <= q.obs_time "
                    "JOIN customers c ON c.customer_id = q.customer_id GROUP BY ALL "
                    "ORDER BY q.customer_id, q.obs_time").to_arrow_table()
    finally:
        con.close()
    days = np.asarray([PLAN_DAYS[PLANS.index(p)] for p in t.column("plan").to_pylist()])
    bayes = next_visit_median(_epoch_us(t.column("last_at")), _epoch_us(t.column("obs_time")), days)
    return pa.table({"customer_id": t.column("customer_id"), "obs_time": t.column("obs_time"),
                     "target": t.column("target"),
                     "bayes": pa.array(np.round(bayes).astype(np.int64), pa.int64()).cast(pa.timestamp("us"))})


def _epoch_us(column: pa.ChunkedArray) -> np.ndarray:
    """A timestamp column as int64 epoch microseconds."""
    return np.asarray(column.cast(pa.timestamp("us")).cast(pa.int64()), np.int64)


def _cat_table(key: str, ids: np.ndarray, target: np.ndarray, post: np.ndarray, classes: tuple[str, ...]) -> pa.Table:
    cols: dict[str, Any] = {key: ids, "target": [classes[i] for i in target]}
    for j, c in enumerate(classes):
        cols[f"p_{c}"] = post[:, j]
    return pa.table(cols)


def _obs_times() -> list[dt.datetime]:
    return [START + dt.timedelta(days=d) for d in range(60, DAYS + 1, OBS_EVERY_DAYS)]


def _obs_sql() -> str:
    times = ", ".join(f"TIMESTAMP '{t:%Y-%m-%d %H:%M:%S}'" for t in _obs_times())
    return f"SELECT unnest([{times}]) AS obs_time"


# the derived tasks' queries: the targets are exact functions of what is visible at the observation time
# (rows whose time is at or before it: the sampler's rule)
DERIVED_QUERIES = {
    "customer_orders_30d": (
        "WITH obs AS ({obs}) SELECT c.customer_id, o.obs_time, count(x.order_id)::DOUBLE AS n_orders_30d "
        "FROM customers c CROSS JOIN obs o LEFT JOIN orders x ON x.customer_id = c.customer_id "
        "AND x.ordered_at > o.obs_time - INTERVAL 30 DAY AND x.ordered_at <= o.obs_time "
        "GROUP BY c.customer_id, o.obs_time ORDER BY c.customer_id, o.obs_time",
        "n_orders_30d", "numerical", "count of children in a time window",
        "orders of the customer in the 30 days up to the observation time"),
    "customer_mean_amount": (
        "WITH obs AS ({obs}) SELECT c.customer_id, o.obs_time, avg(x.amount) AS mean_amount "
        "FROM customers c CROSS JOIN obs o JOIN orders x ON x.customer_id = c.customer_id "
        "AND x.ordered_at <= o.obs_time AND x.amount IS NOT NULL "
        "GROUP BY c.customer_id, o.obs_time ORDER BY c.customer_id, o.obs_time",
        "mean_amount", "numerical", "mean of children's values",
        "mean amount of the customer's orders up to the observation time"),
    "customer_last_channel": (
        "WITH obs AS ({obs}) SELECT c.customer_id, o.obs_time, arg_max(x.channel, x.ordered_at) AS last_channel "
        "FROM customers c CROSS JOIN obs o JOIN orders x ON x.customer_id = c.customer_id "
        "AND x.ordered_at <= o.obs_time "
        "GROUP BY c.customer_id, o.obs_time ORDER BY c.customer_id, o.obs_time",
        "last_channel", "categorical", "the most recent child's value",
        "channel of the customer's latest order up to the observation time"),
    "customer_amount_90d": (
        "WITH obs AS ({obs}) SELECT c.customer_id, o.obs_time, coalesce(sum(x.amount), 0)::DOUBLE AS amount_90d "
        "FROM customers c CROSS JOIN obs o LEFT JOIN orders x ON x.customer_id = c.customer_id "
        "AND x.ordered_at <= o.obs_time AND x.ordered_at > o.obs_time - INTERVAL 90 DAY "
        "GROUP BY c.customer_id, o.obs_time ORDER BY c.customer_id, o.obs_time",
        "amount_90d", "numerical", "a sum of children's values in a time window",
        "total amount of the customer's orders in the 90 days up to the observation time"),
}

# with `visits`: a "when next" time, looking forward from the observation time (its horizon covers any gap)
NEXT_VISIT_QUERY = (
    "WITH obs AS ({obs}) SELECT c.customer_id, o.obs_time, min(v.visited_at) AS next_visit_at "
    "FROM customers c CROSS JOIN obs o JOIN visits v ON v.customer_id = c.customer_id AND v.visited_at > o.obs_time "
    "GROUP BY c.customer_id, o.obs_time ORDER BY c.customer_id, o.obs_time")
NEXT_VISIT_HORIZON = "365 days"

SIGNALS = {
    "customers.tier": ("same-row categorical -> categorical", "categorical"),
    "customers.flag": ("same-row numbers -> boolean", "boolean"),
    "customers.pref": ("a parent's attribute", "categorical"),
    "customers.zone": ("a two-hop ancestor's attribute", "boolean"),
    "customers.interest": ("a text column's content", "categorical"),
    "orders.late": ("a periodic time effect (hour of day, weekday)", "boolean"),
    "orders.total": ("a number close to a function of same-row numbers", "numerical"),
    "orders.fee": ("a number whose level moves with time", "numerical"),
    "orders.handling": ("a parent's form: the mean of many earlier siblings' values", "numerical"),
    "orders.handover": ("two parents of one table compared: one's form against the other's", "numerical"),
} | {k: (v[3], v[2]) for k, v in DERIVED_QUERIES.items()} | {
    "customer_next_visit": ("a \"when next\" time on a database of decades", "timestamp")}
# the signals behind the losses to LightGBM on real databases: judged against LightGBM (docs/design/learnability.md)
ROOT_CAUSES = ("orders.total", "orders.fee", "customer_amount_90d", "orders.handling", "orders.handover",
               "customer_next_visit")


def derived_query(task: str) -> str:
    return DERIVED_QUERIES[task][0].format(obs=_obs_sql())


def _derived_bayes(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """Targets of the derived tasks (DuckDB over the tables) with their Bayes prediction: the target itself."""
    con = duckdb.connect()
    try:
        con.execute("SET threads = 1")
        for name, t in tables.items():
            con.register(name, t)
        out = {}
        for task, (_, col, stype, _, _) in DERIVED_QUERIES.items():
            t = con.sql(derived_query(task)).to_arrow_table()
            target = t.column(col)
            t = t.drop([col]).append_column("target", target)
            if stype == "categorical":
                for c in CHANNELS:
                    t = t.append_column(f"p_{c}", pa.compute.cast(pa.compute.equal(target, c), pa.float64()))
            else:
                t = t.append_column("bayes", target)
            out[task] = t
        return out
    finally:
        con.close()


def bayes_metrics(task: str, rows: pa.Table) -> dict[str, float]:
    """The metrics (`confluence.evaluation.metrics`) of the Bayes predictor on `rows` of `task`'s Bayes table
    (`PlantedDatabase.bayes`, or `bayes/<task>.parquet`, any subset of its rows)."""
    stype = SIGNALS[task][1]
    if stype == "timestamp":
        from confluence.targets.timestamp import timestamp_metrics

        return timestamp_metrics(_epoch_us(rows.column("target")), _epoch_us(rows.column("bayes")))
    if stype == "boolean":
        return binary_metrics(np.asarray(rows.column("target"), bool), np.asarray(rows.column("bayes")))
    if stype == "categorical":
        classes = [c[2:] for c in rows.column_names if c.startswith("p_")]
        post = np.stack([np.asarray(rows.column(f"p_{c}")) for c in classes], axis=1)
        index = {c: i for i, c in enumerate(classes)}
        return categorical_metrics(np.array([index[v] for v in rows.column("target").to_pylist()]), post)
    return regression_metrics(np.asarray(rows.column("target")), np.asarray(rows.column("bayes")))


def ceiling(task: str, bayes: pa.Table) -> dict[str, Any]:
    """The headline metric of the Bayes predictor on all rows of `task` (`bayes` as `PlantedDatabase.bayes`)."""
    signal, stype = SIGNALS[task]
    metric = headline_metric(SemanticType.parse(stype))[0]
    return {"signal": signal, "stype": stype, "metric": metric, "ceiling": bayes_metrics(task, bayes)[metric],
            "n": bayes.num_rows}


def planted_metadata(spec: PlantedSpec) -> dict[str, Any]:
    """The reviewed metadata of a planted database: tables, semantic types, keys and the tasks."""
    cell = {
        "customers.tier": ("tier", "categorical", "tier, planted as a map of the same row's segment"),
        "customers.flag": ("flag", "boolean", "flag, planted from the same row's x1 and x2"),
        "customers.pref": ("pref", "categorical", "preference, planted as a map of the store's kind"),
        "customers.zone": ("zone", "boolean", "zone, planted from the store's region's climate"),
        "customers.interest": ("interest", "categorical", "interest, planted as the topic of the bio"),
        "orders.late": ("late", "boolean", "late, planted from the order's hour of day and weekday"),
        "orders.total": ("total", "numerical", "total, planted as quantity x unit price (2 % noise)"),
        "orders.fee": ("fee", "numerical", "fee, planted to double every year"),
    }
    if spec.couriers:
        cell["orders.handling"] = ("handling", "numerical", "handling time, planted around the courier's hidden mean")
        cell["orders.handover"] = ("handover", "numerical",
                                   "hand-over time, planted as the courier's hidden mean less the relay courier's")
    tasks: dict[str, Any] = {}
    for task, (col, stype, desc) in cell.items():
        table = task.split(".")[0]
        key = "customer_id" if table == "customers" else "order_id"
        tasks[task] = {"query": f'SELECT "{key}", "{col}" FROM "{table}"', "anchor_table": table, "anchor_key": key,
                       "target_column": col, "target_stype": stype, "description": desc}
    for task, (_, col, stype, _, desc) in DERIVED_QUERIES.items():
        tasks[task] = {"query": derived_query(task), "anchor_table": "customers", "anchor_key": "customer_id",
                       "target_column": col, "target_stype": stype, "observation_time_column": "obs_time",
                       "horizon": "0 seconds", "description": desc}  # each target looks back from obs_time
    if spec.visits:
        tasks["customer_next_visit"] = {
            "query": NEXT_VISIT_QUERY.format(obs=_obs_sql()), "anchor_table": "customers",
            "anchor_key": "customer_id", "target_column": "next_visit_at", "target_stype": "timestamp",
            "observation_time_column": "obs_time", "horizon": NEXT_VISIT_HORIZON,
            "description": "time of the customer's first visit after the observation time"}
    meta = {
        "name": f"planted{spec.seed}",
        "description": f"planted-signal database (confluence synth planted, {spec}"
                       + (f", couriers={spec.couriers}" if spec.couriers else "")
                       + (", visits=True" if spec.visits else "") + ")",
        "tables": {
            "regions": {"primary_key": "region_id", "columns": {
                "region_id": {"stype": "identifier"}, "climate": {"stype": "categorical"},
                "population": {"stype": "numerical"}}},
            "stores": {"primary_key": "store_id", "columns": {
                "store_id": {"stype": "identifier"},
                "region_id": {"stype": "identifier", "foreign_key": "regions.region_id"},
                "kind": {"stype": "categorical"}, "size_m2": {"stype": "numerical"}}},
            "customers": {"primary_key": "customer_id", "columns": {
                "customer_id": {"stype": "identifier"},
                "store_id": {"stype": "identifier", "foreign_key": "stores.store_id"},
                "segment": {"stype": "categorical"}, "tier": {"stype": "categorical"},
                "x1": {"stype": "numerical"}, "x2": {"stype": "numerical"}, "x3": {"stype": "numerical"},
                "flag": {"stype": "boolean"}, "pref": {"stype": "categorical"}, "zone": {"stype": "boolean"},
                "bio": {"stype": "text", "description": "free-form biography"},
                "interest": {"stype": "categorical"}}},
            "orders": {"primary_key": "order_id", "temporal_column": "ordered_at", "columns": {
                "order_id": {"stype": "identifier"},
                "customer_id": {"stype": "identifier", "foreign_key": "customers.customer_id"},
                "ordered_at": {"stype": "timestamp"}, "amount": {"stype": "numerical"},
                "channel": {"stype": "categorical"}, "late": {"stype": "boolean"},
                "quantity": {"stype": "numerical"}, "unit_price": {"stype": "numerical"},
                "total": {"stype": "numerical"}, "fee": {"stype": "numerical"}}},
        },
        "tasks": tasks,
    }
    if spec.couriers:
        meta["tables"]["orders"]["columns"] |= {
            "courier_id": {"stype": "identifier", "foreign_key": "couriers.courier_id"},
            "handling": {"stype": "numerical", "description": "minutes from order to hand-over"},
            "relay_courier_id": {"stype": "identifier", "foreign_key": "couriers.courier_id",
                                 "description": "the courier who takes the order over"},
            "handover": {"stype": "numerical", "description": "minutes the hand-over to the relay courier took"}}
        meta["tables"]["couriers"] = {"primary_key": "courier_id", "columns": {
            "courier_id": {"stype": "identifier"}, "vehicle": {"stype": "categorical"}}}
    if spec.visits:
        meta["tables"]["customers"]["columns"] |= {
            "plan": {"stype": "categorical", "description": "how often the customer visits"},
            "born_on": {"stype": "timestamp", "description": "date of birth"}}
        meta["tables"]["visits"] = {"primary_key": "visit_id", "temporal_column": "visited_at", "columns": {
            "visit_id": {"stype": "identifier"},
            "customer_id": {"stype": "identifier", "foreign_key": "customers.customer_id"},
            "visited_at": {"stype": "timestamp"}}}
    return meta


def write_planted(out: str | Path, spec: PlantedSpec = PlantedSpec(), *, overwrite: bool = False) -> Path:
    """Generate and write a planted database under `out` (appearing atomically):

    * `raw/<table>.parquet`: the raw database;
    * `planted.metadata.json`: its reviewed metadata with its tasks;
    * `ceilings.json`: per task its signal, headline metric and the Bayes predictor's value on all its rows;
    * `bayes/<task>.parquet`: per task row (anchor key [, obs_time]) the target and the Bayes prediction, to score
      the ceiling on exactly the rows a benchmark evaluates.

    Refuses an existing `out` unless `overwrite`."""

    def build() -> Contents:
        db = generate(spec)
        clean = {t: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in c.items()}
                 for t, c in db.ceilings.items()}
        return ({"raw": db.tables, "bayes": db.bayes},
                {"planted.metadata.json": db.metadata,
                 "ceilings.json": {"spec": {k: v for k, v in spec.__dict__.items()
                                            if k not in ("couriers", "visits") or v},
                                   "tasks": clean}})

    return write_generated(out, build, overwrite=overwrite)
