"""LightGBM LambdaRank over candidate pairs: the link kind's GBDT baseline.

Per seed (anchor `a`, observation time `T`), the candidates are the rows `a` itself linked to in links known at
`T`, the `n_popular` rows linked most often and the `n_recent` rows linked most often over the last `window`
(the popularity baselines' rankings, `confluence.targets.link`). Each (seed, candidate) pair gets counts known at
`T` (the candidate's popularity and recent popularity and their ranks, the anchor's links to it, its rank among the
anchor's past targets, days since the anchor last linked to it, the anchor's known links overall), the anchor's
rows reaching the candidate in a bridge table by `T` (a plane's flights to an airport), and the leak-free relational
features of the anchor row and of the candidate row at `T` (`gbdt.FeatureBuilder`, prefixed `anchor:` / `cand:`).
LightGBM's `lambdarank` objective learns to order a seed's candidates; a seed's prediction is its top k by score,
filled by popularity when it has fewer than k candidates.

Leak-free by the baselines' rule: a link of seed (anchor, t) is known from t + horizon on, so every pair count of a
seed observed at T reads only links whose seed time is at most T - horizon; the bridge counts and row features
read the database's rows at T (time <= T), as the cell tasks' GBDT features do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from confluence.errors import ConfluenceError
from confluence.evaluation.gbdt import FeatureBuilder, FeatureTable, category_codes, encode_categories
from confluence.sampler.splits import subsample
from confluence.stypes import US_PER_DAY
from confluence.targets import link as L
from confluence.toolkit.threads import free_cpus, usable_cpus

PAIR_FEATURES = ("pair:popularity", "pair:popularity_rank", "pair:recent", "pair:recent_rank", "pair:anchor_links",
                 "pair:anchor_rank", "pair:days_since_anchor_link", "pair:anchor_known_links")


@dataclass
class Candidates:
    """Candidate (seed, target row) pairs of seeds `ids`, grouped by seed in the order of `ids`, rows ascending
    within a seed: `group[i]` is pair i's position in `ids`; `x` its `PAIR_FEATURES` (NaN: none)."""

    group: np.ndarray
    row: np.ndarray
    x: np.ndarray
    names: list[str] = field(default_factory=lambda: list(PAIR_FEATURES))


def candidate_pairs(anchor_row: np.ndarray, obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray,
                    horizon_us: int, ids: np.ndarray, *, n_popular: int = 50, n_recent: int = 50,
                    window_us: int | None = None) -> Candidates:
    """The candidates of seeds `ids` and their pair features, from links known at each seed's observation time
    only (seed time <= T - horizon). `window_us` (default: the horizon) is recent popularity's span, as the
    recent-popularity baseline's. Popularity ranks order rows by count, ties by row, as `link.popularity` does."""
    window_us = horizon_us if window_us is None else window_us
    anchor_row, obs_time = np.asarray(anchor_row, np.int64), np.asarray(obs_time, np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    seed_of_link = np.repeat(np.arange(len(anchor_row)), np.diff(np.asarray(offsets)))
    links = pa.table({"anchor": anchor_row[seed_of_link], "t": obs_time[seed_of_link],
                      "row": np.asarray(targets, np.int64)})
    seeds = pa.table({"gid": np.arange(len(ids), dtype=np.int64), "anchor": anchor_row[ids], "obs": obs_time[ids],
                      "cutoff": obs_time[ids] - int(horizon_us)})
    con = duckdb.connect()
    con.execute(f"SET threads = {usable_cpus()}")
    con.register("links", links)
    con.register("seeds", seeds)
    res = con.execute(f"""
        WITH known AS (
            SELECT c.cutoff, l.row, count(*) AS n, count(*) FILTER (WHERE l.t > c.cutoff - {int(window_us)}) AS n_recent
            FROM (SELECT DISTINCT cutoff FROM seeds) c JOIN links l ON l.t <= c.cutoff GROUP BY ALL),
        pop AS (
            SELECT *, row_number() OVER (PARTITION BY cutoff ORDER BY n DESC, row) AS rank,
                   CASE WHEN n_recent > 0 THEN row_number() OVER (PARTITION BY cutoff ORDER BY n_recent DESC, row)
                   END AS rank_recent
            FROM known),
        past AS (
            SELECT s.gid, l.row, count(*) AS n_anchor, max(l.t) AS last
            FROM seeds s JOIN links l ON l.anchor = s.anchor AND l.t <= s.cutoff GROUP BY ALL),
        past_ranked AS (
            SELECT *, row_number() OVER (PARTITION BY gid ORDER BY n_anchor DESC, last DESC, row) AS anchor_rank
            FROM past),
        total AS (SELECT gid, sum(n_anchor) AS known_links FROM past GROUP BY gid),
        cand AS (
            SELECT gid, row FROM past
            UNION
            SELECT s.gid, p.row FROM seeds s JOIN pop p ON p.cutoff = s.cutoff
            WHERE p.rank <= {int(n_popular)} OR p.rank_recent <= {int(n_recent)})
        SELECT c.gid, c.row, coalesce(p.n, 0) AS f0, p.rank AS f1, coalesce(p.n_recent, 0) AS f2,
               p.rank_recent AS f3, coalesce(a.n_anchor, 0) AS f4, a.anchor_rank AS f5,
               (s.obs - a.last) / {US_PER_DAY} AS f6, coalesce(tot.known_links, 0) AS f7
        FROM cand c JOIN seeds s ON s.gid = c.gid
        LEFT JOIN pop p ON p.cutoff = s.cutoff AND p.row = c.row
        LEFT JOIN past_ranked a ON a.gid = c.gid AND a.row = c.row
        LEFT JOIN total tot ON tot.gid = c.gid
        ORDER BY c.gid, c.row""").fetchnumpy()
    con.close()

    def col(v: Any) -> np.ndarray:
        v = v.astype(np.float64)
        return np.asarray(v.filled(np.nan) if np.ma.isMaskedArray(v) else v)

    x = np.stack([col(res[f"f{j}"]) for j in range(len(PAIR_FEATURES))], axis=1)
    return Candidates(group=np.asarray(res["gid"], np.int64), row=np.asarray(res["row"], np.int64), x=x)


def candidate_labels(cands: Candidates, offsets: np.ndarray, targets: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """1.0 where a candidate is in its seed's truth, else 0.0."""
    counts, flat = L.truth_sets(np.asarray(offsets), np.asarray(targets), ids)
    span = int(max(cands.row.max(initial=0), flat.max(initial=0))) + 1
    truth = np.repeat(np.arange(len(counts), dtype=np.int64), counts) * span + flat
    return np.isin(cands.group * span + cands.row, truth).astype(np.float64)


def pair_features(builder: FeatureBuilder, anchor_table: str, target_table: str, anchor_rows: np.ndarray,
                  obs_times: np.ndarray, cands: Candidates, progress: Any = None) -> FeatureTable:
    """The design matrix of candidate pairs: the pair features; per bridge table (foreign keys to the anchor and
    the target table, `FeatureBuilder.bridge_links`) the count of the anchor's rows there reaching the candidate by
    the observation time and days since the newest (`bridge:`), which see the database up to T as the relational
    features do, not only links known at T - horizon; then the anchor row's relational features at its seed's
    observation time (`anchor:`, with the time's calendar features) and the candidate row's at that time (`cand:`),
    each row built once per distinct (row, time)."""
    fa = builder.build_rows(anchor_table, anchor_rows, obs_times, observation_features=True, progress=progress,
                            description=f"LightGBM ranker: {anchor_table} features of {len(anchor_rows)} seeds")
    cand_obs = np.asarray(obs_times, np.int64)[cands.group]
    uniq, inv = np.unique(np.stack([cands.row, cand_obs], axis=1), axis=0, return_inverse=True)
    fc = builder.build_rows(target_table, uniq[:, 0], uniq[:, 1], progress=progress,
                            description=f"LightGBM ranker: {target_table} features of {len(uniq)} (row, time) pairs")
    inv = inv.reshape(-1)
    pair_x, pair_names = [cands.x], list(cands.names)
    for name, b in builder.bridge_links(anchor_table, target_table, anchor_rows, obs_times):
        # how often, and how lately, the anchor reached the candidate through the bridge's rows at T
        count, days = np.zeros(len(cands.row)), np.full(len(cands.row), np.nan)
        if len(b["row"]):
            span = int(max(cands.row.max(initial=0), b["row"].max())) + 1
            keys, want = b["seed"] * span + b["row"], cands.group * span + cands.row
            pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
            hit = keys[pos] == want
            count[hit] = b["count"][pos[hit]]
            days[hit] = (np.asarray(obs_times)[cands.group[hit]] - b["last"][pos[hit]]) / US_PER_DAY
        pair_x.append(np.stack([count, days], axis=1))
        pair_names += [f"bridge:{name}:count", f"bridge:{name}:days_since"]
    px = np.concatenate(pair_x, axis=1)
    x = np.concatenate([px, fa.x[cands.group], fc.x[inv]], axis=1)
    names = [*pair_names, *(f"anchor:{n}" for n in fa.names), *(f"cand:{n}" for n in fc.names)]
    p, a = px.shape[1], fa.x.shape[1]
    cats = [p + j for j in fa.categorical] + [p + a + j for j in fc.categorical]
    return FeatureTable(x=x, names=names, categorical=cats)


@dataclass
class LinkGBDTResult:
    """The ranker's [n, k] predictions on the evaluated seeds and how it was trained."""

    predictions: np.ndarray
    num_train_seeds: int
    num_train_pairs: int
    feature_names: list[str]
    recall_of_candidates: float  # share of the evaluated seeds' truth rows that were candidates
    params: dict[str, Any] = field(default_factory=dict)


def _top_k(group: np.ndarray, row: np.ndarray, score: np.ndarray, n: int, k: int) -> np.ndarray:
    """[n, k]: per group its rows by score, best first, ties by row; -1 pads."""
    order = np.lexsort((row, -score, group))
    g = group[order]
    pos = np.arange(len(g)) - np.searchsorted(g, g, side="left")
    keep = pos < k
    out = np.full((n, k), -1, dtype=np.int64)
    out[g[keep], pos[keep]] = row[order][keep]
    return out


def _fill(pred: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """`pred`'s -1 places taken by `fill`'s rows of the same seed that `pred` does not list yet, in their order."""
    out = pred.copy()
    for i in np.flatnonzero((out < 0).any(axis=1)):
        have = out[i][out[i] >= 0]
        extra = [r for r in fill[i] if r >= 0 and r not in set(have.tolist())][:out.shape[1] - len(have)]
        out[i] = -1
        out[i, :len(have) + len(extra)] = np.concatenate([have, np.asarray(extra, np.int64)])
    return out


def fit_link_gbdt(store: Any, task: str, train_ids: np.ndarray, eval_ids: np.ndarray, *,
                  builder: FeatureBuilder | None = None, max_train: int = 50_000, n_popular: int = 50,
                  n_recent: int = 50, num_boost_round: int = 100, seed: int = 0,
                  progress: Any = None) -> LinkGBDTResult:
    """Train the LambdaRank ranker on a link task's train seeds (at most `max_train`, a fixed draw; seeds none of
    whose candidates is right are left out: their pairs carry no ranking signal) and rank the eval seeds' candidates.
    LightGBM runs on the CPUs other work leaves free (`toolkit.threads.free_cpus`), deterministically."""
    import lightgbm as lgb

    info, arr = store.link_task(task), store.link_arrays(task)
    anchor_row, obs_time = np.asarray(arr.anchor_row, np.int64), np.asarray(arr.obs_time, np.int64)
    offsets, targets = np.asarray(arr.offsets), np.asarray(arr.targets)
    builder = builder or FeatureBuilder(store, progress=progress)
    k, horizon = int(info.k), info.horizon_us

    train_ids = subsample(np.asarray(train_ids, np.int64), max_train, seed)
    c_tr = candidate_pairs(anchor_row, obs_time, offsets, targets, horizon, train_ids, n_popular=n_popular,
                           n_recent=n_recent)
    y_tr = candidate_labels(c_tr, offsets, targets, train_ids)
    useful = np.bincount(c_tr.group, weights=y_tr, minlength=len(train_ids)) > 0
    keep = useful[c_tr.group]
    c_tr = Candidates(group=(np.cumsum(useful) - 1)[c_tr.group[keep]], row=c_tr.row[keep], x=c_tr.x[keep])
    train_ids, y_tr = train_ids[useful], y_tr[keep]
    if not len(train_ids):
        raise ConfluenceError(f"link task {task!r}: no train seed has a right candidate, so no LightGBM ranker")
    f_tr = pair_features(builder, info.anchor_table, info.target_table, anchor_row[train_ids], obs_time[train_ids],
                         c_tr, progress)
    eval_ids = np.asarray(eval_ids, np.int64)
    c_ev = candidate_pairs(anchor_row, obs_time, offsets, targets, horizon, eval_ids, n_popular=n_popular,
                           n_recent=n_recent)
    f_ev = pair_features(builder, info.anchor_table, info.target_table, anchor_row[eval_ids], obs_time[eval_ids],
                         c_ev, progress)

    codes = category_codes([f_tr.x, f_ev.x], f_tr.categorical)
    for f in (f_tr, f_ev):
        encode_categories(f.x, f.categorical, codes)
    params: dict[str, Any] = {
        "objective": "lambdarank", "metric": "map", "eval_at": [k], "learning_rate": 0.05, "num_leaves": 31,
        "min_data_in_leaf": 20, "feature_fraction": 0.9, "seed": seed, "deterministic": True, "verbose": -1,
        "num_threads": free_cpus(),  # as gbdt.train_booster: the free cores, same answers on any count
    }
    ds = lgb.Dataset(f_tr.x, label=y_tr, group=np.bincount(c_tr.group, minlength=len(train_ids)),
                     feature_name=[f"f{i}" for i in range(len(f_tr.names))],
                     categorical_feature=f_tr.categorical or "auto", params={"verbose": -1})
    callbacks = [] if progress is None else [lambda env: progress.advance(1)]
    if progress is not None:
        progress.step(f"{task}: LightGBM ranker rounds ({len(y_tr)} pairs of {len(train_ids)} seeds x "
                      f"{len(f_tr.names)} features, {params['num_threads']} threads)", num_boost_round)
    booster = lgb.train(params, ds, num_boost_round=num_boost_round, callbacks=callbacks)

    score = booster.predict(f_ev.x) if len(c_ev.row) else np.zeros(0)
    pred = _top_k(c_ev.group, c_ev.row, score, len(eval_ids), k)
    table = store.table(info.target_table)
    pop = L.popularity(anchor_row, obs_time, offsets, targets, info.horizon_us,
                       (table.row_offset, table.row_offset + table.num_rows), eval_ids, k)
    counts, _ = L.truth_sets(offsets, targets, eval_ids)
    covered = candidate_labels(c_ev, offsets, targets, eval_ids).sum() / max(int(counts.sum()), 1)
    return LinkGBDTResult(predictions=_fill(pred, pop), num_train_seeds=int(len(train_ids)),
                          num_train_pairs=int(len(y_tr)), feature_names=f_tr.names,
                          recall_of_candidates=float(covered), params=params)


__all__ = ["PAIR_FEATURES", "Candidates", "LinkGBDTResult", "candidate_labels", "candidate_pairs",
           "fit_link_gbdt", "pair_features"]
