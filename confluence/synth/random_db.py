"""Random relational databases for pretraining: random schema graphs whose values come from a random structural
causal model (SCM) that flows along foreign keys and through time, so that a row's context (its parents, its
children, its history) carries signal about its masked cells and about the derived targets.

Everything is drawn from one `numpy` generator seeded by `RandomSpec.seed` (the same seed writes the same bytes):

* **schema**: 2-15 tables (`tables` fixes the number), a topology among `star` (one fact table referencing every
  dimension), `chain`, `snowflake` (a fact table, dimensions, sub-dimensions) and `random` (a random DAG of foreign
  keys, at times two foreign keys to the same parent), self-references (a table with a foreign key to itself, to an
  earlier row or NULL, so acyclic in the data), temporal tables (a timestamp column as their time, over a span of
  90 days to three years drawn per database; a table with a temporal parent is temporal, and its rows reference
  only parent rows of earlier days) and static ones;
* **columns**: 2-6 attributes per table among the seven semantic types (numerical, categorical with short codes,
  words or integers, boolean, timestamp with an hour-of-day effect, text sentences from a fixed vocabulary, ignored
  row hashes, besides the identifier keys); every type occurs somewhere in every database;
* **fan-out**: per foreign key, the parents' weights are uniform, gamma, lognormal or Zipf (heavy-tailed) with a
  drawn parameter; NULL (optional) foreign keys and a small share of dangling ones (no such parent) are planted;
* **values**: each row has a latent vector: noise plus a random linear map of each parent's latent, plus a drift in
  time (temporal tables), then optionally an AR(1) step from the same parent's previous child (history) and from
  the self-referenced row; each column is a random function (linear, a small tanh MLP, thresholds) of the latent and
  of up to three earlier columns of the same row, plus noise: a number (affine, log-normal or a count), the argmax
  of noisy class scores (categorical), a Bernoulli draw (boolean), a time and hour of day (timestamp), the topic
  and mood words of a sentence (text);
* **tasks**: cell masking on 2-4 columns (`table.column`, as `confluence synth planted`'s `customers.tier`), and on
  each database with a temporal child table derived tasks in SQL with observation times (count of children in the
  next / last window per parent row, any child in the next window, mean of a child's number and the latest child's
  category up to the observation time), only parent rows that exist at the observation time, look-ahead windows
  ending before the data does; a "when next" task; up to two link tasks ("which rows of a second parent will this
  row of the first link to next?") on temporal tables with keys to two parents, whose second key is drawn with
  link signals (repeat, latent affinity; `link_signal`). The "when next" and link tasks and the link signals come
  from generators of their own, so the rest keeps the bytes it had before them.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from confluence.errors import ConfigError
from confluence.stypes import US_PER_DAY
from confluence.synth.output import Contents, write_generated
from confluence.toolkit.config import non_negative, one_of, positive

TOPOLOGIES = ("star", "chain", "snowflake", "random")
FANOUTS = ("uniform", "gamma", "lognormal", "zipf")
FANOUT_PARAMS = {"uniform": (0.0, 0.0), "gamma": (0.2, 3.0), "lognormal": (0.3, 2.0), "zipf": (0.5, 1.6)}  # shape,
# sigma, exponent: drawn uniformly in this range per foreign key
STYPES = ("identifier", "numerical", "categorical", "boolean", "timestamp", "text", "ignored")

START = dt.datetime(2020, 1, 1)
SPANS = (90, 180, 365, 730, 1095)  # days over which a database's temporal rows spread: one drawn per database
START_US = int((START - dt.datetime(1970, 1, 1)).total_seconds()) * 1_000_000
MIN_ROWS = 8
MAX_ROWS = 3000  # per table at rows = 1.0
ROOT_ROWS = (30.0, 300.0)  # tables without parents: log-uniform in this range at rows = 1.0
MEAN_FANOUT = (0.7, 8.0)  # a child table's rows per row of its first parent: log-uniform
N_OBS = 6  # observation times of a derived task
WINDOWS = (1, 3, 7, 14, 30, 60, 90, 180, 365)  # days

TABLE_NAMES = (
    ("accounts", "account"), ("users", "user"), ("customers", "customer"), ("orders", "order"),
    ("items", "item"), ("products", "product"), ("stores", "store"), ("regions", "region"), ("cities", "city"),
    ("visits", "visit"), ("sessions", "session"), ("events", "event"), ("payments", "payment"),
    ("invoices", "invoice"), ("shipments", "shipment"), ("vendors", "vendor"), ("devices", "device"),
    ("tickets", "ticket"), ("reviews", "review"), ("posts", "post"), ("comments", "comment"), ("teams", "team"),
    ("players", "player"), ("matches", "match"), ("patients", "patient"), ("doctors", "doctor"),
    ("admissions", "admission"), ("courses", "course"), ("students", "student"), ("exams", "exam"),
    ("loans", "loan"), ("branches", "branch"), ("claims", "claim"), ("policies", "policy"), ("trips", "trip"),
    ("drivers", "driver"), ("vehicles", "vehicle"), ("sensors", "sensor"), ("readings", "reading"),
    ("campaigns", "campaign"), ("ads", "ad"), ("clicks", "click"),
)
MAX_TABLES = len(TABLE_NAMES)
ATTR_NAMES = {
    "numerical": ("amount", "score", "weight", "price", "duration", "rating", "size", "quantity", "balance",
                  "height", "age", "distance", "cost", "volume", "speed", "level"),
    "categorical": ("status", "kind", "color", "segment", "grade", "zone", "category", "tier", "channel", "brand",
                    "method", "source", "plan", "flavor"),
    "boolean": ("is_active", "flagged", "verified", "premium", "returned", "priority", "cancelled", "online",
                "approved", "urgent"),
    "timestamp": ("opened_at", "closed_at", "due_at", "updated_at", "started_at", "renewed_at", "checked_at"),
    "text": ("note", "comment_text", "review_text", "description", "summary", "title", "message"),
    "ignored": ("row_hash", "legacy_code", "import_batch", "checksum"),
}
TIME_NAMES = ("created_at", "event_time", "occurred_at", "recorded_at", "happened_at")
SELF_ROLES = ("parent", "manager", "previous", "referrer", "source")
EXTRA_ROLES = ("second", "origin", "target", "backup", "other")
ATTR_WEIGHTS = {"numerical": 0.32, "categorical": 0.26, "boolean": 0.16, "text": 0.1, "timestamp": 0.08,
                "ignored": 0.08}
CAT_WORDS = ("red", "green", "blue", "amber", "silver", "north", "south", "east", "west", "small", "large", "basic",
             "gold", "bronze", "alpha", "delta", "river", "forest", "desert", "ocean", "maple", "cedar", "lunar",
             "solar", "rapid", "steady", "urban", "rural")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
TOPIC_WORDS = (
    ("football", "tennis", "running", "cycling", "swimming", "stadium", "coach", "league"),
    ("recipes", "baking", "pasta", "spices", "bread", "kitchen", "soup", "dessert"),
    ("flights", "hotels", "beaches", "mountains", "passport", "islands", "museums", "trains"),
    ("software", "laptop", "network", "server", "update", "password", "screen", "battery"),
    ("garden", "flowers", "seeds", "soil", "roses", "harvest", "tomatoes", "compost"),
    ("music", "guitar", "concert", "album", "piano", "singer", "drums", "melody"),
    ("invoice", "refund", "payment", "discount", "price", "receipt", "budget", "fee"),
    ("doctor", "clinic", "fever", "medicine", "nurse", "therapy", "allergy", "checkup"),
)
MOODS = (("great", "excellent", "happy", "quick", "friendly", "smooth"),
         ("poor", "slow", "broken", "late", "rude", "awful"))
FILLER = ("the", "was", "and", "very", "with", "about", "really", "my", "some", "again", "today", "it")


@dataclass(frozen=True)
class RandomSpec:
    """What a random database may be; what is not fixed here is drawn from `seed`."""

    seed: int = 0
    tables: int | None = None  # number of tables; None: drawn in min_tables..max_tables
    min_tables: int = 2
    max_tables: int = 15
    topology: str | None = None  # star / chain / snowflake / random; None: drawn
    rows: float = 1.0  # scale of every table's row count (1.0: about 30-3,000 rows per table)
    fanout: str | None = None  # uniform / gamma / lognormal / zipf for every foreign key; None: drawn per key
    self_reference: float = 0.2  # probability that a table has a foreign key to itself
    temporal: float = 0.5  # probability that a table without a temporal parent is temporal
    null_rate: float = 0.1  # a column's NULL share is drawn in [0, null_rate] (half of the columns have none)
    dangling: float = 0.02  # a foreign key's dangling share is drawn in [0, dangling]
    latent_dim: int | None = None  # size of the rows' latent vectors; None: drawn in 3..6
    # probability that a temporal table's later foreign key to another parent than its first is drawn with link
    # signals (an anchor re-taking its own past targets, and taking targets whose latents match its own), so that
    # its link task ("which rows of that parent will this row of the first link to next?") has more to learn than
    # popularity; 0: every key drawn by popularity alone (the draws before link tasks, byte for byte)
    link_signal: float = 0.7

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("seed", f"must be an integer >= 0, got {self.seed!r}")
        for name in ("min_tables", "max_tables") + (("tables",) if self.tables is not None else ()):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= MAX_TABLES:
                raise ConfigError(name, f"must be an integer in 1..{MAX_TABLES}, got {value!r}")
        if self.tables is None and self.min_tables > self.max_tables:
            raise ConfigError("min_tables", f"must be <= max_tables ({self.max_tables}), got {self.min_tables}")
        if self.topology is not None:
            one_of("topology", self.topology, TOPOLOGIES)
        if self.fanout is not None:
            one_of("fanout", self.fanout, FANOUTS)
        positive(self, "rows")
        if not math.isfinite(self.rows) or self.rows > 100:
            raise ConfigError("rows", f"must be at most 100 (a scale of the row counts), got {self.rows!r}")
        non_negative(self, "self_reference", "temporal", "null_rate", "dangling", "link_signal")
        for name, top in (("self_reference", 1.0), ("temporal", 1.0), ("null_rate", 0.9), ("dangling", 0.5),
                          ("link_signal", 1.0)):
            if not getattr(self, name) <= top:
                raise ConfigError(name, f"must be in [0, {top}], got {getattr(self, name)!r}")
        if self.latent_dim is not None and (not isinstance(self.latent_dim, int) or not 1 <= self.latent_dim <= 64):
            raise ConfigError("latent_dim", f"must be an integer in 1..64, got {self.latent_dim!r}")


@dataclass
class RandomDatabase:
    """The tables (Arrow), their reviewed metadata (with tasks), and what was drawn (`spec.json`)."""

    tables: dict[str, pa.Table]
    metadata: dict[str, Any]
    drawn: dict[str, Any]


# -- the plan: schema and column types -----------------------------------------------------------------------------
@dataclass
class _FK:
    column: str
    parent: int  # index of the referenced table (== the table's own index for a self-reference)
    self_ref: bool = False
    fanout: str = "uniform"
    param: float = 0.0
    nulls: int = 0
    dangling: int = 0


@dataclass
class _Table:
    index: int
    name: str
    stem: str
    parents: list[int]
    temporal: bool = False
    rows: int = 0
    pk: str = ""
    key_kind: str = "int"
    time_col: str | None = None
    fks: list[_FK] = field(default_factory=list)
    attrs: list[tuple[str, str]] = field(default_factory=list)  # (column, stype)
    # filled while drawing values
    keys: np.ndarray | None = None  # int64 or object (str)
    days: np.ndarray | None = None  # int, sorted (temporal tables)
    z: np.ndarray | None = None
    arrays: dict[str, pa.Array] = field(default_factory=dict)
    parent_row: dict[str, np.ndarray] = field(default_factory=dict)  # fk column -> parent row or -1


def _topology(kind: str, n: int, rng: np.random.Generator) -> list[list[int]]:
    """Per table its parents' indices (all lower: tables are drawn in index order)."""
    if n == 1:
        return [[]]
    if kind == "chain" or (kind == "snowflake" and n <= 3):
        return [[]] + [[i - 1] for i in range(1, n)]
    if kind == "star":
        return [[] for _ in range(n - 1)] + [list(range(n - 1))]
    if kind == "snowflake":  # fact n-1 -> k dimensions -> sub-dimensions (a tree)
        k = int(np.clip(round((n - 1) * rng.uniform(0.3, 0.6)), 2, n - 1))
        parents: list[list[int]] = [[] for _ in range(n)]
        parents[n - 1] = list(range(n - 1 - k, n - 1))
        for j in range(n - 1 - k):
            parents[int(rng.integers(j + 1, n - 1))].append(j)
        return [sorted(p) for p in parents]
    parents = [[]]
    for i in range(1, n):
        m = 1 + int(rng.binomial(min(i - 1, 2), 0.35))
        ps = sorted(int(p) for p in rng.choice(i, m, replace=False))
        if rng.random() < 0.15:
            ps.append(ps[int(rng.integers(len(ps)))])  # a second foreign key to the same parent
        parents.append(ps)
    return parents


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _plan(spec: RandomSpec, rng: np.random.Generator) -> tuple[str, int, int, list[_Table]]:
    n = spec.tables if spec.tables is not None else int(rng.integers(spec.min_tables, spec.max_tables + 1))
    topology = spec.topology if spec.topology is not None else TOPOLOGIES[int(rng.integers(len(TOPOLOGIES)))]
    latent_dim = spec.latent_dim if spec.latent_dim is not None else int(rng.integers(3, 7))
    span = int(SPANS[int(rng.integers(len(SPANS)))])
    parents = _topology(topology, n, rng)
    names = [TABLE_NAMES[int(i)] for i in rng.choice(MAX_TABLES, n, replace=False)]
    tables = [_Table(i, names[i][0], names[i][1], parents[i]) for i in range(n)]
    cap = max(MIN_ROWS, round(MAX_ROWS * spec.rows))
    for t in tables:
        t.pk = f"{t.stem}_id"
        t.key_kind = "str" if rng.random() < 0.25 else "int"
        t.temporal = any(tables[p].temporal for p in t.parents) or bool(rng.random() < spec.temporal)
        if t.parents:
            base = tables[t.parents[0]].rows * _loguniform(rng, *MEAN_FANOUT)
        else:
            base = _loguniform(rng, *ROOT_ROWS) * spec.rows
        t.rows = int(np.clip(round(base), MIN_ROWS, cap))
        used = {t.pk}
        for p in t.parents:
            col = f"{tables[p].stem}_id"
            if col in used:
                col = f"{EXTRA_ROLES[int(rng.integers(len(EXTRA_ROLES)))]}_{col}"
                while col in used:
                    col = "other_" + col
            used.add(col)
            t.fks.append(_FK(col, p))
        if rng.random() < spec.self_reference:
            col = f"{SELF_ROLES[int(rng.integers(len(SELF_ROLES)))]}_{t.stem}_id"
            used.add(col)
            t.fks.append(_FK(col, t.index, self_ref=True))
        for fk in t.fks:
            fk.fanout = spec.fanout if spec.fanout is not None else FANOUTS[int(rng.integers(len(FANOUTS)))]
            lo, hi = FANOUT_PARAMS[fk.fanout]
            fk.param = float(rng.uniform(lo, hi)) if hi > lo else 0.0
        if t.temporal:
            t.time_col = TIME_NAMES[int(rng.integers(len(TIME_NAMES)))]
        kinds = list(ATTR_WEIGHTS)
        p = np.array([ATTR_WEIGHTS[k] for k in kinds])
        for _ in range(int(rng.integers(2, 7))):
            t.attrs.append(("", kinds[int(rng.choice(len(kinds), p=p / p.sum()))]))
    # every semantic type occurs somewhere (identifier: the keys; timestamp: a time column counts)
    have = {s for t in tables for _, s in t.attrs} | {"identifier"} | ({"timestamp"} if any(t.temporal for t in tables)
                                                                      else set())
    for stype in STYPES:
        if stype not in have:
            tables[int(rng.integers(n))].attrs.append(("", stype))
    for t in tables:  # names, after the types are final
        used = {t.pk, *(fk.column for fk in t.fks), *([t.time_col] if t.time_col else [])}
        named = []
        for _, stype in t.attrs:
            pool = ATTR_NAMES[stype]
            free = [c for c in pool if c not in used]
            col = free[int(rng.integers(len(free)))] if free else f"{pool[0]}_{len(used)}"
            used.add(col)
            named.append((col, stype))
        t.attrs = named
    return topology, latent_dim, span, tables


# -- the values ----------------------------------------------------------------------------------------------------
def _standardize(x: np.ndarray) -> np.ndarray:
    sd = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def _fanout_weights(fk: _FK, n: int, rng: np.random.Generator) -> np.ndarray:
    if fk.fanout == "gamma":
        w = rng.gamma(fk.param, 1.0, n)
    elif fk.fanout == "lognormal":
        w = rng.lognormal(0.0, fk.param, n)
    elif fk.fanout == "zipf":
        w = (1.0 + rng.permutation(n)) ** -fk.param
    else:
        w = np.ones(n)
    return w + 1e-12


def _pick(rng: np.random.Generator, weights: np.ndarray, prefix: np.ndarray | None, size: int) -> np.ndarray:
    """Parent rows drawn with `weights`; with `prefix`, child i draws among the first prefix[i] parents only (-1
    when there is none)."""
    cw = np.cumsum(weights)
    top = cw[-1] if prefix is None else np.where(prefix > 0, cw[np.maximum(prefix, 1) - 1], 0.0)
    idx = np.searchsorted(cw, rng.random(size) * top, side="right")
    if prefix is None:
        return np.minimum(idx, len(weights) - 1)
    return np.where(prefix > 0, np.minimum(idx, prefix - 1), -1)


def _linked_pick(rng: np.random.Generator, rows: np.ndarray, anchors: np.ndarray, za: np.ndarray, zt: np.ndarray,
                 weights: np.ndarray, prefix: np.ndarray | None) -> tuple[np.ndarray, dict[str, float]]:
    """A later foreign key's parent rows drawn with link signals, given the popularity draws `rows` and each child
    row's anchor (its first key's parent row, -1: none): in time order, a child row re-takes one of its anchor's
    earlier targets (share `repeat`), else takes a target by affinity (weight x exp(beta <za M, zt>), among the
    targets that exist by then), else keeps its popularity draw. Rows without a parent stay -1."""
    repeat, affinity, beta = rng.uniform(0.2, 0.6), rng.uniform(0.3, 0.9), rng.uniform(1.0, 3.0)
    d = za.shape[1]
    m = rng.standard_normal((d, d)) / math.sqrt(d)
    u = rng.random(len(rows))
    out = rows.copy()
    ok = (rows >= 0) & (anchors >= 0)
    by_affinity = np.flatnonzero(ok & (u >= repeat) & (u < repeat + (1.0 - repeat) * affinity))
    logw = np.log(weights)
    for lo in range(0, len(by_affinity), 256):
        idx = by_affinity[lo:lo + 256]
        logits = beta * ((za[anchors[idx]] @ m) @ zt.T) + logw
        if prefix is not None:
            logits = np.where(np.arange(len(weights))[None, :] < prefix[idx, None], logits, -np.inf)
        out[idx] = np.argmax(logits + rng.gumbel(size=logits.shape), axis=1)
    past: dict[int, list[int]] = {}
    for i in np.flatnonzero(ok):  # rows are in time order: an anchor's past targets are those of earlier rows
        seen = past.setdefault(int(anchors[i]), [])
        if u[i] < repeat and seen:
            out[i] = seen[int(rng.integers(len(seen)))]
        seen.append(int(out[i]))
    return out, {"repeat": round(repeat, 3), "affinity": round(affinity, 3), "beta": round(beta, 3)}


def _keys(t: _Table, rng: np.random.Generator) -> None:
    if t.key_kind == "str":
        prefix = "".join(LETTERS[int(i)] for i in rng.integers(0, 26, 2))
        t.keys = np.array([f"{prefix}-{i:06d}" for i in range(t.rows)], dtype=object)
    else:
        t.keys = (int(rng.choice([0, 1, 1000, 10**6])) + np.arange(t.rows)).astype(np.int64)


def _dangling_keys(parent: _Table, k: int, rng: np.random.Generator) -> np.ndarray:
    """k keys no row of `parent` has."""
    assert parent.keys is not None
    extra = parent.rows + 1 + rng.integers(0, 10**5, k)
    if parent.key_kind == "str":
        prefix = str(parent.keys[0]).split("-")[0]
        return np.array([f"{prefix}-{int(e):06d}" for e in extra], dtype=object)
    return (parent.keys[-1] + extra).astype(np.int64)


def _fk_array(parent: _Table, rows: np.ndarray, null: np.ndarray, dangling: np.ndarray,
              rng: np.random.Generator) -> pa.Array:
    assert parent.keys is not None
    vals = parent.keys[np.maximum(rows, 0)].copy()
    if dangling.any():
        vals[dangling] = _dangling_keys(parent, int(dangling.sum()), rng)
    if parent.key_kind == "str":
        return pa.array([None if m else v for v, m in zip(vals, null, strict=True)], pa.string())
    return pa.array(vals.astype(np.int64), pa.int64(), mask=null)


def _history(z: np.ndarray, parent: np.ndarray, rho: float) -> None:
    """AR(1) along each parent's children in row (time) order: z_i <- rho z_prev + sqrt(1 - rho^2) z_i."""
    ok = np.flatnonzero(parent >= 0)
    if ok.size < 2:
        return
    order = ok[np.lexsort((ok, parent[ok]))]
    same = parent[order[1:]] == parent[order[:-1]]
    prev = np.full(len(parent), -1)
    prev[order[1:][same]] = order[:-1][same]
    rank = np.zeros(len(parent), dtype=np.int64)
    for i in order:  # in group order: a row's rank is its predecessor's + 1
        if prev[i] >= 0:
            rank[i] = rank[prev[i]] + 1
    b = math.sqrt(1.0 - rho * rho)
    for rows in _levels(rank):
        z[rows] = rho * z[prev[rows]] + b * z[rows]


def _levels(level: np.ndarray) -> list[np.ndarray]:
    """The rows of level 1, 2, ... (level 0 first needs nothing)."""
    order = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[order], np.arange(int(level.max(initial=0)) + 2))
    return [order[bounds[r]:bounds[r + 1]] for r in range(1, len(bounds) - 1)]


def _self_parents(t: _Table, rng: np.random.Generator) -> np.ndarray:
    """Per row an earlier row (of an earlier day, for a temporal table) or -1: acyclic by construction."""
    n = t.rows
    if t.days is not None:
        earlier = np.searchsorted(t.days, t.days, side="left")  # rows of earlier days
    else:
        earlier = np.arange(n)
    sp = np.floor(rng.random(n) * earlier).astype(np.int64)
    root = (earlier == 0) | (rng.random(n) < rng.uniform(0.1, 0.4))
    return np.where(root, -1, sp)


def _self_ar(z: np.ndarray, sp: np.ndarray, a: float) -> None:
    depth = np.zeros(len(sp), dtype=np.int64)
    for i in range(len(sp)):  # sp[i] < i
        if sp[i] >= 0:
            depth[i] = depth[sp[i]] + 1
    b = math.sqrt(1.0 - a * a)
    for rows in _levels(depth):
        z[rows] = a * z[sp[rows]] + b * z[rows]


def _signal(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """A random function of the inputs x [n, m] -> [n, k], standardized: linear, a small tanh MLP, or steps."""
    n, m = x.shape
    kind = rng.choice(3, p=[0.5, 0.35, 0.15])
    if kind == 0:
        out = x @ rng.standard_normal((m, k))
    elif kind == 1:
        h = int(rng.integers(4, 9))
        out = np.tanh(x @ rng.standard_normal((m, h)) * rng.uniform(0.5, 2.0) + rng.standard_normal(h)) \
            @ rng.standard_normal((h, k))
    else:
        h = int(rng.integers(2, 6))
        out = (x @ rng.standard_normal((m, h)) > rng.standard_normal(h) * 0.5).astype(np.float64) \
            @ rng.standard_normal((h, k))
    return _standardize(out)


def _hour(s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An hour of day in [0, 24): a random peak, moved by the signal s, with noise (the periodic effect)."""
    return np.mod(rng.uniform(0, 24) + rng.uniform(0, 4) * s + rng.normal(0, rng.uniform(0.5, 3.0), len(s)), 24.0)


def _hour_features(hour: np.ndarray) -> list[np.ndarray]:
    return [np.sin(2 * np.pi * hour / 24), np.cos(2 * np.pi * hour / 24)]


def _categories(k: int, rng: np.random.Generator) -> tuple[str, list[Any]]:
    style = ("letter", "code", "word", "int")[int(rng.choice(4, p=[0.25, 0.25, 0.35, 0.15]))]
    if style == "letter":
        start = int(rng.integers(0, 26 - k))
        return style, list(LETTERS[start:start + k])
    if style == "code":
        if rng.random() < 0.5:
            head = LETTERS[int(rng.integers(26))]
            return style, [f"{head}{i + 1}" for i in range(k)]
        codes: list[str] = []
        while len(codes) < k:
            c = "".join(LETTERS[int(i)] for i in rng.integers(0, 26, int(rng.integers(2, 4))))
            if c not in codes:
                codes.append(c)
        return style, codes
    if style == "word":
        return style, [CAT_WORDS[int(i)] for i in rng.choice(len(CAT_WORDS), k, replace=False)]
    step = int(rng.choice([1, 5, 10, 100]))
    return style, [int(step * (i + 1)) for i in range(k)]


def _sentences(topic: np.ndarray, mood: np.ndarray, topics: np.ndarray, rng: np.random.Generator) -> list[str]:
    """Short sentences: two words of the row's topic, one of its mood, two to four filler words, shuffled."""
    n = len(topic)
    tw = rng.integers(0, 8, (n, 2))
    mw = rng.integers(0, len(MOODS[0]), n)
    fw = rng.integers(0, len(FILLER), (n, 4))
    nf = rng.integers(2, 5, n)
    order = np.argsort(rng.random((n, 7)), axis=1)
    out = []
    for i in range(n):
        words = [TOPIC_WORDS[topics[topic[i]]][tw[i, 0]], TOPIC_WORDS[topics[topic[i]]][tw[i, 1]],
                 MOODS[mood[i]][mw[i]]] + [FILLER[j] for j in fw[i, : nf[i]]]
        out.append(" ".join(words[j] for j in order[i] if j < len(words)))
    return out


def _column(stype: str, x: np.ndarray, t: _Table, time_us: np.ndarray | None,
            rng: np.random.Generator) -> tuple[Any, list[np.ndarray], dict[str, Any]]:
    """One column of table t from the inputs x: (values as a numpy array or list, its features for later
    columns, what was drawn)."""
    n = t.rows
    sigma = rng.uniform(0.1, 1.0)
    if stype == "numerical":
        s = _signal(x, 1, rng)[:, 0] + sigma * rng.standard_normal(n)
        form = ("affine", "lognormal", "count")[int(rng.choice(3, p=[0.5, 0.3, 0.2]))]
        if form == "affine":
            scale = 10 ** rng.uniform(-1, 3)
            values: Any = np.round(rng.normal(0, 3) * scale + scale * s, 2 if scale < 100 else 1)
        elif form == "lognormal":
            values = np.round(np.exp(rng.uniform(0, 6) + rng.uniform(0.2, 1.0) * s), 2)
        else:
            values = rng.poisson(np.exp(rng.uniform(-0.5, 2.5) + rng.uniform(0.2, 0.8) * s)).astype(np.int64)
        return values, [_standardize(s)], {"form": form, "noise": round(sigma, 3)}
    if stype == "categorical":
        k = int(rng.integers(2, 9))
        logits = _signal(x, k, rng) * rng.uniform(0.5, 3.0) + rng.normal(0, 1.0, k) \
            + rng.gumbel(0, sigma, (n, k))
        cls = np.argmax(logits, axis=1)
        style, labels = _categories(k, rng)
        emb = rng.standard_normal((k, 2))
        arr = np.array(labels, dtype=object if style != "int" else np.int64)[cls]
        return arr, [emb[cls, 0], emb[cls, 1]], {"classes": k, "style": style, "noise": round(sigma, 3)}
    if stype == "boolean":
        logit = _signal(x, 1, rng)[:, 0] * rng.uniform(0.5, 3.0) + rng.uniform(-2.0, 1.0)
        b = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
        as_int = bool(rng.random() < 0.15)
        return (b.astype(np.int64) if as_int else b), [np.where(b, 1.0, -1.0)], {"as_int": as_int}
    if stype == "timestamp":
        s = _signal(x, 1, rng)[:, 0] + sigma * rng.standard_normal(n)
        hour = _hour(_signal(x, 1, rng)[:, 0], rng)
        if time_us is not None:  # after the row's own time (a due date, a closing time)
            days = np.floor(np.exp(rng.uniform(0, 4) + 0.5 * s))
            base = (time_us - START_US) // US_PER_DAY + days
        else:  # before the data starts (an opening date, a birth date)
            base = -np.floor(3000 / (1 + np.exp(-s)))
        us = START_US + base.astype(np.int64) * US_PER_DAY + np.floor(hour * 3600).astype(np.int64) * 1_000_000
        return us, [_standardize(s), *_hour_features(hour)], {"noise": round(sigma, 3)}
    if stype == "text":
        nt = int(rng.integers(2, 6))
        topics = rng.choice(len(TOPIC_WORDS), nt, replace=False)
        topic = np.argmax(_signal(x, nt, rng) * rng.uniform(1.0, 3.0) + rng.gumbel(0, sigma, (n, nt)), axis=1)
        mood = (_signal(x, 1, rng)[:, 0] + sigma * rng.standard_normal(n) < 0).astype(np.int64)
        emb = rng.standard_normal(nt)
        return _sentences(topic, mood, topics, rng), [emb[topic], np.where(mood == 1, -1.0, 1.0)], \
            {"topics": int(nt), "noise": round(sigma, 3)}
    # ignored: an opaque hash of no signal
    return [f"{int(v):012x}" for v in rng.integers(0, 2**48, n)], [], {}


def _to_arrow(stype: str, values: Any, null: np.ndarray) -> pa.Array:
    if stype == "timestamp":
        return pa.array(np.asarray(values, np.int64), pa.int64(), mask=null).cast(pa.timestamp("us"))
    if isinstance(values, np.ndarray) and values.dtype != object:
        return pa.array(values, mask=null)
    return pa.array([None if m else v for v, m in zip(values, null, strict=True)], pa.string())


def _draw_table(t: _Table, tables: list[_Table], latent_dim: int, span: int, spec: RandomSpec,
                rng: np.random.Generator) -> dict[str, Any]:
    """Keys, times, foreign keys, latents and columns of table t (its parents are drawn already)."""
    n = t.rows
    drawn: dict[str, Any] = {}
    _keys(t, rng)
    if t.temporal:
        lb = max([int(tables[p].days[0]) + 1 for p in t.parents if tables[p].days is not None] + [0])  # type: ignore[index]
        lb = min(lb, span - max(1, span // 10))
        growth = rng.uniform(1.0, 2.5)
        t.days = np.sort(lb + np.floor((span - lb) * rng.random(n) ** (1.0 / growth)).astype(np.int64))
    z = rng.standard_normal((n, latent_dim))
    arrays: dict[str, pa.Array] = {t.pk: pa.array(t.keys, pa.string() if t.key_kind == "str" else pa.int64())}
    self_fk: _FK | None = None
    for pos, fk in enumerate(t.fks):
        if fk.self_ref:
            self_fk = fk
            continue
        parent = tables[fk.parent]
        w = _fanout_weights(fk, parent.rows, rng)
        prefix = np.searchsorted(parent.days, t.days, side="left") if (t.days is not None and parent.days is not None) \
            else None
        rows = _pick(rng, w, prefix, n)
        first = t.fks[0]
        if (pos > 0 and t.days is not None and first.parent != fk.parent and not first.self_ref
                and spec.link_signal > 0):
            # its own generator: the main one draws as before, so every other value keeps its draw
            lrng = np.random.default_rng([spec.seed, 4, t.index, pos])
            if lrng.random() < spec.link_signal:
                anchor = tables[first.parent]
                assert anchor.z is not None and parent.z is not None
                rows, drawn[f"link_signal_{fk.column}"] = _linked_pick(
                    lrng, rows, t.parent_row[first.column], anchor.z, parent.z, w, prefix)
        null = rows < 0
        if pos > 0 and rng.random() < 0.5:
            null |= rng.random(n) < rng.uniform(0, max(spec.null_rate, 1e-9))
        dangling = ~null & (rng.random(n) < (rng.uniform(0, spec.dangling) if rng.random() < 0.6 else 0.0))
        rows = np.where(null | dangling, -1, rows)
        fk.nulls, fk.dangling = int(null.sum()), int(dangling.sum())
        t.parent_row[fk.column] = rows
        arrays[fk.column] = _fk_array(parent, rows, null, dangling, rng)
        a = rng.standard_normal((latent_dim, latent_dim)) / math.sqrt(latent_dim) * rng.uniform(0.5, 1.5)
        ok = rows >= 0
        assert parent.z is not None
        z[ok] += parent.z[rows[ok]] @ a.T
    if t.days is not None:
        drift = rng.standard_normal(latent_dim) * rng.uniform(0.0, 1.5)
        z += (t.days / span - 0.5)[:, None] * drift
    z = _standardize(z)
    if t.days is not None and t.fks and not t.fks[0].self_ref and rng.random() < 0.6:
        rho = rng.uniform(0.3, 0.85)
        _history(z, t.parent_row[t.fks[0].column], rho)
        drawn["history_rho"] = round(rho, 3)
    if self_fk is not None:
        sp = _self_parents(t, rng)
        a = rng.uniform(0.4, 0.9)
        _self_ar(z, sp, a)
        drawn["self_reference_weight"] = round(a, 3)
        t.parent_row[self_fk.column] = sp
        null = sp < 0
        self_fk.nulls = int(null.sum())
        arrays[self_fk.column] = _fk_array(t, sp, null, np.zeros(n, bool), rng)
    t.z = z = _standardize(z)
    time_us = None
    features: list[np.ndarray] = []
    if t.days is not None:
        assert t.time_col is not None
        hour = _hour(_signal(z, 1, rng)[:, 0], rng)
        time_us = START_US + t.days * US_PER_DAY + np.floor(hour * 3600).astype(np.int64) * 1_000_000
        arrays[t.time_col] = pa.array(time_us, pa.int64()).cast(pa.timestamp("us"))
        features += [_standardize(t.days.astype(np.float64)), *_hour_features(hour)]
    cols: dict[str, Any] = {}
    for name, stype in t.attrs:
        chosen = [f for f in features if rng.random() < 0.4][:3]
        x = np.column_stack([z, *chosen]) if chosen else z
        values, feats, info = _column(stype, x, t, time_us, rng)
        features += feats
        rate = rng.uniform(0, spec.null_rate) if (stype != "ignored" and rng.random() < 0.5) else 0.0
        null = rng.random(n) < rate
        if null.all():
            null[0] = False
        arrays[name] = _to_arrow(stype, values, null)
        cols[name] = {"stype": stype, "inputs": len(chosen), "nulls": int(null.sum()), **info}
    t.arrays = arrays
    drawn["attributes"] = cols
    return drawn


# -- tasks ---------------------------------------------------------------------------------------------------------
def _connect(tables: list[_Table]) -> duckdb.DuckDBPyConnection:
    """A one-thread DuckDB connection with every drawn table registered: the task queries are checked on it."""
    con = duckdb.connect()
    con.execute("SET threads = 1")
    for t in tables:
        con.register(t.name, pa.table(t.arrays))
    return con


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _ts(us: int) -> str:
    return f"TIMESTAMP '{START + dt.timedelta(microseconds=us - START_US):%Y-%m-%d %H:%M:%S}'"


def _cell_tasks(tables: list[_Table], rng: np.random.Generator) -> dict[str, Any]:
    good, fallback = [], []
    for t in tables:
        for name, stype in t.attrs:
            if stype in ("numerical", "categorical", "boolean", "timestamp"):
                values = t.arrays[name].drop_null()
                if len(values):
                    fallback.append((t, name, stype))
                if len(pc.unique(values)) >= 2:
                    good.append((t, name, stype))
    pool = good or fallback
    k = min(len(pool), int(rng.integers(2, 5)))
    tasks = {}
    for i in sorted(int(j) for j in rng.choice(len(pool), k, replace=False)):
        t, name, stype = pool[i]
        tasks[f"{t.name}.{name}"] = {
            "query": f"SELECT {_q(t.pk)}, {_q(name)} FROM {_q(t.name)} WHERE {_q(name)} IS NOT NULL",
            "anchor_table": t.name, "anchor_key": t.pk, "target_column": name, "target_stype": stype,
            "description": f"{name} of the {t.stem} (cell masking)"}
    return tasks


def _derived_candidates(child: _Table, fk: _FK, parent: _Table, window: int) -> list[tuple[str, str, str, str]]:
    """(pattern, target column, stype, description) of the derived tasks on (child, fk); look-ahead ones first."""
    through = f" through {fk.column}"
    out = [("count_next", f"n_next_{window}d", "numerical",
            f"number of {child.name} rows of the {parent.stem}{through} in the {window} days after the observation "
            "time"),
           ("any_next", f"any_next_{window}d", "boolean",
            f"whether the {parent.stem} has any {child.name} row{through} in the {window} days after the "
            "observation time"),
           ("count_last", f"n_last_{window}d", "numerical",
            f"number of {child.name} rows of the {parent.stem}{through} in the {window} days up to the observation "
            "time")]
    for name, stype in child.attrs:
        if stype == "numerical":
            out.append(("mean", f"mean_{name}", "numerical",
                        f"mean {name} of the {parent.stem}'s {child.name} rows{through} up to the observation time"))
            break
    for name, stype in child.attrs:
        if stype == "categorical":
            out.append(("last", f"last_{name}", "categorical",
                        f"{name} of the {parent.stem}'s latest {child.name} row{through} up to the observation time"))
            break
    return out


def _derived_query(pattern: str, target: str, child: _Table, fk: _FK, parent: _Table, window: int,
                   obs: list[int]) -> str:
    o = "WITH obs AS (SELECT unnest([" + ", ".join(_ts(u) for u in obs) + "]) AS obs_time) "
    pk, ck, tc = _q(parent.pk), _q(child.pk), _q(child.time_col or "")
    link = f"x.{_q(fk.column)} = p.{pk}"
    alive = f" WHERE p.{_q(parent.time_col)} <= o.obs_time" if parent.time_col else ""
    tail = f" GROUP BY p.{pk}, o.obs_time ORDER BY p.{pk}, o.obs_time"
    head = f"SELECT p.{pk} AS {pk}, o.obs_time, "
    frm = f" FROM {_q(parent.name)} p CROSS JOIN obs o "
    if pattern in ("count_next", "any_next"):
        agg = f"count(x.{ck})::DOUBLE" if pattern == "count_next" else f"count(x.{ck}) > 0"
        return (o + head + f"{agg} AS {_q(target)}" + frm + f"LEFT JOIN {_q(child.name)} x ON {link} "
                f"AND x.{tc} > o.obs_time AND x.{tc} <= o.obs_time + INTERVAL {window} DAY" + alive + tail)
    if pattern == "count_last":
        return (o + head + f"count(x.{ck})::DOUBLE AS {_q(target)}" + frm + f"LEFT JOIN {_q(child.name)} x ON "
                f"{link} AND x.{tc} > o.obs_time - INTERVAL {window} DAY AND x.{tc} <= o.obs_time" + alive + tail)
    col = _q(target.split("_", 1)[1])
    # the latest row's value, ties in time broken by the child's key, so the result never depends on DuckDB's threads
    agg = f"avg(x.{col})::DOUBLE" if pattern == "mean" else f"first(x.{col} ORDER BY x.{tc} DESC, x.{ck} DESC)"
    return (o + head + f"{agg} AS {_q(target)}" + frm + f"JOIN {_q(child.name)} x ON {link} "
            f"AND x.{tc} <= o.obs_time AND x.{col} IS NOT NULL" + alive + tail)


def _obs_times(child: _Table, look_ahead: int) -> list[int]:
    """Midnights at quantiles of the child's days, ending `look_ahead` days before its last day."""
    assert child.days is not None
    days = np.unique(np.floor(np.quantile(child.days, np.linspace(0.25, 0.95, N_OBS))).astype(np.int64))
    days = days[days <= int(child.days[-1]) - look_ahead]
    return [START_US + int(d) * US_PER_DAY for d in days]


def _window(child: _Table, fk: _FK, parent: _Table, rng: np.random.Generator) -> int:
    """One of the two shortest windows (days) in which a parent row has 0.3 linked children or more on average
    (else the longest), so that counts are seldom all zero."""
    assert child.days is not None
    linked = int(np.sum(child.parent_row[fk.column] >= 0))
    per_day = linked / (parent.rows * (int(child.days[-1]) - int(child.days[0]) + 1))
    ok = [w for w in WINDOWS if per_day * w >= 0.3][:2]
    return int(ok[int(rng.integers(len(ok)))]) if ok else WINDOWS[-1]


def _derived_tasks(tables: list[_Table], rng: np.random.Generator) -> dict[str, Any]:
    """Up to four derived tasks over up to three (temporal child, foreign key) pairs, each kept when its query has
    rows and its target takes two values at least; failing all, the count of the last window of the first pair
    whose query has rows (a database with a temporal child table always gets one)."""
    pairs = [(c, fk) for c in tables if c.temporal for fk in c.fks]
    if not pairs:
        return {}
    con = _connect(tables)
    try:
        def task(child: _Table, fk: _FK, window: int, cand: tuple[str, str, str, str]) -> tuple[str, Any, Any]:
            pattern, target, stype, desc = cand
            parent = tables[fk.parent]
            obs = _obs_times(child, window if pattern.endswith("_next") else 0)
            name = _task_name(child, fk, parent, target)
            if not obs:
                return name, None, None
            spec = {"query": _derived_query(pattern, target, child, fk, parent, window, obs),
                    "anchor_table": parent.name, "anchor_key": parent.pk, "target_column": target,
                    "target_stype": stype, "observation_time_column": "obs_time",
                    # known `window` days after obs_time when the query looks ahead, at obs_time otherwise
                    "horizon": f"{window} days" if pattern.endswith("_next") else "0 seconds", "description": desc}
            return name, spec, con.sql(spec["query"]).to_arrow_table().column(target).drop_null()

        tasks: dict[str, Any] = {}
        order = [int(i) for i in rng.permutation(len(pairs))]
        for pi in order[:3]:
            child, fk = pairs[pi]
            window = _window(child, fk, tables[fk.parent], rng)
            cands = _derived_candidates(child, fk, tables[fk.parent], window)
            k = min(len(cands), int(rng.integers(1, 3)), 4 - len(tasks))
            for i in sorted(int(j) for j in rng.choice(len(cands), k, replace=False)):
                name, spec, values = task(child, fk, window, cands[i])
                if spec is not None and len(values) and len(pc.unique(values)) >= 2:
                    tasks[name] = spec
        if not tasks:
            for pi in order:
                child, fk = pairs[pi]
                window = _window(child, fk, tables[fk.parent], rng)
                name, spec, values = task(child, fk, window, _derived_candidates(child, fk, tables[fk.parent],
                                                                                 window)[2])
                if spec is not None and len(values):
                    tasks[name] = spec
                    break
        return tasks
    finally:
        con.close()


def _task_name(child: _Table, fk: _FK, parent: _Table, target: str) -> str:
    """A derived task's name: `<parent entity>_<child table>_<target>`, `_by_<fk>` when the child has two keys to
    the parent."""
    two = sum(1 for f in child.fks if f.parent == fk.parent) > 1
    return f"{parent.stem}_{child.name}_{target}" + (f"_by_{fk.column}" if two else "")


def _next_time_query(child: _Table, fk: _FK, parent: _Table, window: int, obs: list[int]) -> str:
    """When the parent's next child row comes, within `window` days after the observation time (NULL: none), for
    the parents with a child row in the `window` days up to it (the ones a user would ask about)."""
    o = "WITH obs AS (SELECT unnest([" + ", ".join(_ts(u) for u in obs) + "]) AS obs_time) "
    pk, tc, fc = _q(parent.pk), _q(child.time_col or ""), _q(fk.column)
    alive = f" AND p.{_q(parent.time_col)} <= o.obs_time" if parent.time_col else ""
    seeds = (f"SELECT DISTINCT p.{pk} AS anchor, o.obs_time FROM {_q(child.name)} x JOIN obs o ON x.{tc} <= o.obs_time "
             f"AND x.{tc} > o.obs_time - INTERVAL {window} DAY JOIN {_q(parent.name)} p ON p.{pk} = x.{fc}" + alive)
    return (o + f", seeds AS ({seeds}) SELECT s.anchor AS {pk}, s.obs_time, min(x.{tc}) AS next_at FROM seeds s "
            f"LEFT JOIN {_q(child.name)} x ON x.{fc} = s.anchor AND x.{tc} > s.obs_time "
            f"AND x.{tc} <= s.obs_time + INTERVAL {window} DAY GROUP BY s.anchor, s.obs_time ORDER BY s.anchor, s.obs_time")


def _next_time_task(tables: list[_Table], seed: int) -> dict[str, Any]:
    """One "when is the next one" task (a timestamp target with an observation time and a horizon) on a temporal
    child table, drawn from a generator of its own so that the other tasks and the tables keep their bytes; none
    when no (temporal child, foreign key) pair gives 20 known answers of two values at least. Pretraining needs
    the kind: a model that never saw one answers it thousands of days off."""
    pairs = [(c, fk) for c in tables if c.temporal for fk in c.fks if not fk.self_ref]
    if not pairs:
        return {}
    rng = np.random.default_rng([seed, 3])
    con = _connect(tables)
    try:
        for pi in (int(i) for i in rng.permutation(len(pairs))):
            child, fk = pairs[pi]
            parent = tables[fk.parent]
            window = int(WINDOWS[int(rng.integers(len(WINDOWS)))])
            obs = _obs_times(child, window)
            if not obs:
                continue
            query = _next_time_query(child, fk, parent, window, obs)
            values = con.sql(query).to_arrow_table().column("next_at").drop_null()
            if len(values) >= 20 and len(pc.unique(values)) >= 2:
                name = _task_name(child, fk, parent, "next_at")
                return {name: {"query": query, "anchor_table": parent.name, "anchor_key": parent.pk,
                               "target_column": "next_at", "target_stype": "timestamp",
                               "observation_time_column": "obs_time", "horizon": f"{window} days",
                               "description": f"when the {parent.stem}'s next {child.name} row comes, within "
                                              f"{window} days after the observation time (none: NULL)"}}
        return {}
    finally:
        con.close()


LINK_K = 10  # a link task's ranked list
LINK_OBS = 16  # a link task's observation times, at most
LINK_MIN_SEEDS = (50, 5)  # (anchor, time) seeds a link task needs at least: train, and validation and test each


def _link_query(child: _Table, first: _FK, fk: _FK, tables: list[_Table], window: int, obs: list[int]) -> str:
    """Per observation time, each anchor (the first key's parent) and the rows of `fk`'s parent its child rows
    link to in the `window` days after it; both rows exist by the observation time (a target row that does not
    yet exist cannot be ranked)."""
    anchor, target = tables[first.parent], tables[fk.parent]
    o = "WITH obs AS (SELECT unnest([" + ", ".join(_ts(u) for u in obs) + "]) AS obs_time) "
    tc = _q(child.time_col or "")
    alive = "".join(f" AND {a}.{_q(t.time_col)} <= o.obs_time" for a, t in (("p", anchor), ("q", target))
                    if t.time_col)
    return (o + f"SELECT p.{_q(anchor.pk)} AS {_q(anchor.pk)}, o.obs_time, q.{_q(target.pk)} AS {_q(target.pk)} "
            f"FROM obs o JOIN {_q(child.name)} x ON x.{tc} > o.obs_time AND x.{tc} <= o.obs_time + INTERVAL {window} DAY "
            f"JOIN {_q(anchor.name)} p ON p.{_q(anchor.pk)} = x.{_q(first.column)} "
            f"JOIN {_q(target.name)} q ON q.{_q(target.pk)} = x.{_q(fk.column)}" + alive)


def _link_tasks(tables: list[_Table], seed: int) -> dict[str, Any]:
    """Up to two link tasks ("which rows of the target table will this anchor link to in the next `window` days?")
    on temporal tables with a second foreign key to another parent than their first (anchor: the first key's
    parent, target: the other's), drawn from a generator of their own so that the tables and the other tasks
    keep their bytes. The window is the longest of WINDOWS that fits eight times into the child's last three
    quarters; a task observes every window up to LINK_OBS times, validates and tests on the last two, and is
    kept when its splits have LINK_MIN_SEEDS (anchor, time) seeds."""
    pairs = [(c, c.fks[0], fk) for c in tables if c.temporal and c.fks and not c.fks[0].self_ref
             for fk in c.fks[1:] if not fk.self_ref and fk.parent != c.fks[0].parent]
    if not pairs:
        return {}
    rng = np.random.default_rng([seed, 5])
    con = _connect(tables)
    try:
        out: dict[str, Any] = {}
        for pi in (int(i) for i in rng.permutation(len(pairs))):
            child, first, fk = pairs[pi]
            anchor, target = tables[first.parent], tables[fk.parent]
            assert child.days is not None
            lo = int(np.quantile(child.days, 0.25))
            window = max([w for w in WINDOWS if 8 * w <= int(child.days[-1]) - lo] or [WINDOWS[0]])
            days = np.arange(lo, int(child.days[-1]) - window + 1, window)[-LINK_OBS:]
            if len(days) < 4:
                continue
            obs = [START_US + int(d) * US_PER_DAY for d in days]
            query = _link_query(child, first, fk, tables, window, obs)
            seeds = con.sql(f"SELECT obs_time, count(DISTINCT {_q(anchor.pk)}) AS n FROM ({query}) GROUP BY obs_time"
                            ).fetchall()
            per_time = {t: n for t, n in seeds}
            val, test = (START + dt.timedelta(days=int(d)) for d in days[-2:])
            n_val, n_test = per_time.get(val, 0), per_time.get(test, 0)
            if sum(n for t, n in per_time.items() if t < val) < LINK_MIN_SEEDS[0] or min(n_val, n_test) < LINK_MIN_SEEDS[1]:
                continue
            name = f"{anchor.stem}_{target.name}_via_{child.name}" + (f"_{fk.column}" if sum(
                1 for f in child.fks if f.parent == fk.parent) > 1 else "")
            out[name] = {"query": query, "anchor_table": anchor.name, "anchor_key": anchor.pk,
                         "observation_time_column": "obs_time", "target_table": target.name,
                         "target_key": target.pk, "horizon": f"{window} days", "k": LINK_K,
                         "split": {"val_time": f"{val:%Y-%m-%d}", "test_time": f"{test:%Y-%m-%d}"},
                         "description": f"the {target.name} rows a {anchor.stem}'s {child.name} rows link to "
                                        f"(through {fk.column}) in the {window} days after the observation time"}
            if len(out) == 2:
                break
        return out
    finally:
        con.close()


# -- the database --------------------------------------------------------------------------------------------------
def generate_random(spec: RandomSpec = RandomSpec()) -> RandomDatabase:
    """Draw a random database (module docstring) from `spec`; deterministic in `spec`."""
    rng = np.random.default_rng(spec.seed)
    topology, latent_dim, span, tables = _plan(spec, rng)
    drawn_tables: dict[str, Any] = {}
    for t in tables:
        info = _draw_table(t, tables, latent_dim, span, spec, rng)
        drawn_tables[t.name] = {"rows": t.rows, "temporal": t.temporal, "time_column": t.time_col,
                                "primary_key": t.pk, "key_type": "string" if t.key_kind == "str" else "integer",
                                **info}
    tasks = _cell_tasks(tables, rng) | _derived_tasks(tables, rng)
    tasks |= {k: v for k, v in _next_time_task(tables, spec.seed).items() if k not in tasks}
    link_tasks = {k: v for k, v in _link_tasks(tables, spec.seed).items() if k not in tasks}
    meta_tables: dict[str, Any] = {}
    for t in tables:
        columns: dict[str, Any] = {t.pk: {"stype": "identifier"}}
        for fk in t.fks:
            columns[fk.column] = {"stype": "identifier", "foreign_key": f"{tables[fk.parent].name}.{tables[fk.parent].pk}"}
        if t.time_col:
            columns[t.time_col] = {"stype": "timestamp"}
        for name, stype in t.attrs:
            columns[name] = {"stype": stype} | ({"reason": "opaque row hash, no signal"} if stype == "ignored"
                                                 else {})
        entry: dict[str, Any] = {"description": f"random {'temporal' if t.temporal else 'static'} table",
                                 "primary_key": t.pk}
        if t.time_col:
            entry["temporal_column"] = t.time_col
        meta_tables[t.name] = entry | {"columns": columns}
    out_tables = {t.name: pa.table({c: t.arrays[c] for c in meta_tables[t.name]["columns"]}) for t in tables}
    metadata = {"name": f"random{spec.seed}",
                "description": f"random database (confluence synth random, seed {spec.seed}, {topology}, "
                               f"{len(tables)} tables)",
                "tables": meta_tables, "tasks": tasks} | ({"link_tasks": link_tasks} if link_tasks else {})
    drawn = {"spec": asdict(spec), "topology": topology, "latent_dim": latent_dim, "days": span,
             "tables": drawn_tables,
             "foreign_keys": [{"table": t.name, "column": fk.column, "parent": tables[fk.parent].name,
                               "self_reference": fk.self_ref, "fanout": fk.fanout, "fanout_param": round(fk.param, 4),
                               "nulls": fk.nulls, "dangling": fk.dangling} for t in tables for fk in t.fks],
             "tasks": {name: ("derived" if "observation_time_column" in task else "cell") for name, task in tasks.items()}
             | {name: "link" for name in link_tasks}}
    return RandomDatabase(out_tables, metadata, drawn)


METADATA_FILE = "random.metadata.json"
SPEC_FILE = "spec.json"


def write_random(out: str | Path, spec: RandomSpec = RandomSpec(), *, overwrite: bool = False) -> Path:
    """Generate and write a random database under `out` (appearing atomically): `raw/<table>.parquet`,
    `random.metadata.json` (its reviewed metadata with the tasks) and `spec.json` (the spec and what was drawn:
    topology, tables, foreign keys with their fan-out, NULL and dangling counts, tasks). Refuses an existing `out`
    unless `overwrite`."""

    def build() -> Contents:
        db = generate_random(spec)
        return {"raw": db.tables}, {METADATA_FILE: db.metadata, SPEC_FILE: db.drawn}

    return write_generated(out, build, overwrite=overwrite)
