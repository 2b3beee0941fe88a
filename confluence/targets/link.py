"""The link kind: "which rows of the target table will this anchor link to in the horizon?", answered by a ranked
list of `k` target rows per seed. Everything link-specific after the store lives here: the ranking metrics
(RelBench's MAP@k, precision, recall, NDCG), the per-seed average precision that paired intervals resample, and the
baselines every ranker must beat (global popularity, recent popularity, the anchor's own past targets).

A seed's truth is a set of target rows (`offsets` / `targets`, as the store keeps it); a prediction is an [n, k]
array of target rows, best first (-1 pads a list shorter than k). Seeds whose truth is empty are not scored, as in
RelBench.

The baselines are leak-free by the same rule as labelled context: a link of seed (anchor, t) is known from
t + horizon on, so a seed observed at T sees only links whose seed time is at most T - horizon.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from confluence.stypes import US_PER_DAY

METRICS = ("map", "precision", "recall", "ndcg")


def truth_sets(offsets: np.ndarray, targets: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The truth of seeds `ids` as (counts [n], flattened target rows, seed by seed)."""
    ids = np.asarray(ids, dtype=np.int64)
    lo, hi = np.asarray(offsets)[ids], np.asarray(offsets)[ids + 1]
    counts = (hi - lo).astype(np.int64)
    flat = np.concatenate([np.asarray(targets)[a:b] for a, b in zip(lo, hi, strict=True)]) if len(ids) else \
        np.zeros(0, np.int64)
    return counts, flat.astype(np.int64)


def hits(pred: np.ndarray, counts: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """[n, k] bool: whether each predicted row is in its seed's truth (a row predicted twice counts once, at its
    first place)."""
    pred = np.asarray(pred, dtype=np.int64)
    n, k = pred.shape
    seed_of_truth = np.repeat(np.arange(n, dtype=np.int64), counts)
    span = int(max(pred.max(initial=0), flat.max(initial=0))) + 2
    truth_keys = np.unique(seed_of_truth * span + flat)
    keys = np.arange(n, dtype=np.int64)[:, None] * span + pred
    out = np.isin(keys, truth_keys) & (pred >= 0)
    # a repeated row scores at its first place only
    first = np.ones_like(out)
    for j in range(1, k):
        first[:, j] = ~(pred[:, :j] == pred[:, j:j + 1]).any(axis=1)
    return out & first


def per_seed(pred: np.ndarray, counts: np.ndarray, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Per-seed average precision, precision, recall and NDCG at k = pred.shape[1], on the seeds whose truth is
    not empty (RelBench's filter; `counts > 0` selects them). AP@k divides by min(|truth|, k) as RelBench does."""
    isin = hits(pred, counts, flat)
    keep = counts > 0
    isin, c = isin[keep], counts[keep].astype(np.float64)
    k = isin.shape[1]
    ranks = np.arange(1, k + 1, dtype=np.float64)
    precision_at = np.cumsum(isin, axis=1) / ranks
    ap = (precision_at * isin).sum(axis=1) / np.minimum(c, k)
    discount = 1.0 / np.log2(ranks + 1.0)
    dcg = (isin * discount).sum(axis=1)
    ideal = np.cumsum(discount)[np.minimum(c, k).astype(np.int64) - 1]
    return {"map": ap, "precision": isin.sum(axis=1) / k, "recall": isin.sum(axis=1) / c, "ndcg": dcg / ideal}


def metrics(pred: np.ndarray, counts: np.ndarray, flat: np.ndarray) -> dict[str, float]:
    """MAP@k, precision@k, recall@k and NDCG@k over the seeds with a non-empty truth, plus `n` (seeds scored)."""
    rows = per_seed(pred, counts, flat)
    n = len(rows["map"])
    out = {m: float(v.mean()) if n else math.nan for m, v in rows.items()}
    out["n"] = float(n)
    return out


def paired_bootstrap(pred_a: np.ndarray, pred_b: np.ndarray, counts: np.ndarray, flat: np.ndarray, *,
                     n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, float]:
    """MAP@k of A minus that of B on the same seeds, with a paired percentile bootstrap interval over seeds;
    `a_not_worse` is 1.0 when the interval reaches 0 or above (as `evaluation.metrics.paired_bootstrap`)."""
    a, b = per_seed(pred_a, counts, flat)["map"], per_seed(pred_b, counts, flat)["map"]
    n = len(a)
    if n == 0:
        return {"diff": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n_boot": 0.0, "a_not_worse": math.nan}
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    diffs = (a - b)[idx].mean(axis=1)
    alpha = (1.0 - level) / 2
    lo, hi = (float(v) for v in np.quantile(diffs, [alpha, 1 - alpha]))
    return {"diff": float((a - b).mean()), "ci_low": lo, "ci_high": hi, "n_boot": float(n_boot),
            "a_not_worse": float(hi >= 0)}


# -- baselines ----------------------------------------------------------------------------------------------------
def _top(scores: np.ndarray, k: int, first_row: int) -> np.ndarray:
    """The k best rows by score, ties by row ascending; rows with score 0 are not listed (-1 pads)."""
    order = np.lexsort((np.arange(len(scores)), -scores))[:k]
    out = np.full(k, -1, dtype=np.int64)
    good = order[scores[order] > 0]
    out[:len(good)] = good + first_row
    return out


def popularity(anchor_row: np.ndarray, obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray,
               horizon_us: int, catalog: tuple[int, int], eval_ids: np.ndarray, k: int,
               window_us: int | None = None) -> np.ndarray:
    """[n, k]: per evaluated seed, the target rows linked most often among links known at its observation time
    (seed time <= T - horizon); `window_us`: count only links whose seed time is within that long before the
    newest known one (T - horizon - window_us < t), "recent popularity". `catalog`: the target table's global
    rows [first, end)."""
    return popularity_at(obs_time, offsets, targets, horizon_us, catalog,
                         np.asarray(obs_time)[np.asarray(eval_ids, dtype=np.int64)], k, window_us)


def popularity_at(obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray, horizon_us: int,
                  catalog: tuple[int, int], times: np.ndarray, k: int, window_us: int | None = None) -> np.ndarray:
    """`popularity` at any observation times `times` (not only the task's seeds'): [len(times), k]."""
    t_eval = np.asarray(times, dtype=np.int64) - horizon_us
    out = np.full((len(t_eval), k), -1, dtype=np.int64)
    for t, total, recent in _known_counts(obs_time, offsets, targets, catalog, t_eval, window_us or 0):
        out[t_eval == t] = _top(total if window_us is None else recent, k, catalog[0])
    return out


def _known_counts(obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray, catalog: tuple[int, int],
                  cutoffs: np.ndarray, window_us: int, links: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Per distinct cutoff, ascending: (cutoff, [catalogue rows] links to each row by seeds observed at or before
    it, and those by seeds observed after cutoff - `window_us`). The arrays are updated in place from one cutoff
    to the next (one pass over the links, sorted by seed time; `links`: `_sorted_links`' answer when the caller
    has it already)."""
    first, end = catalog
    link_time, link_row = links if links is not None else _sorted_links(obs_time, offsets, targets, first)
    total = np.zeros(end - first, dtype=np.float64)
    recent = np.zeros(end - first, dtype=np.float64)
    added = removed = 0
    for t in np.unique(cutoffs):
        upto = int(np.searchsorted(link_time, t, side="right"))
        np.add.at(total, link_row[added:upto], 1.0)
        np.add.at(recent, link_row[added:upto], 1.0)
        added = upto
        since = int(np.searchsorted(link_time, t - window_us, side="right"))
        np.add.at(recent, link_row[removed:since], -1.0)
        removed = max(removed, since)
        yield t, total, recent


def _sorted_links(obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray, first: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Every link's seed time, ascending, and its target row less `first` (the catalogue's first row)."""
    seed_of_link = np.repeat(np.arange(len(obs_time)), np.diff(offsets))
    link_time = np.asarray(obs_time)[seed_of_link]
    order = np.argsort(link_time, kind="stable")
    return link_time[order], np.asarray(targets)[: len(seed_of_link)][order] - first


def past_targets(anchor_row: np.ndarray, obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray,
                 horizon_us: int, eval_ids: np.ndarray, k: int, fill: np.ndarray | None = None) -> np.ndarray:
    """[n, k]: per evaluated seed, the target rows its own anchor linked to in links known at its observation time,
    most often first, then most recent, then row; the rest of the list from `fill` ([n, k], e.g. popularity)."""
    eval_ids = np.asarray(eval_ids, dtype=np.int64)
    return past_targets_at(anchor_row, obs_time, offsets, targets, horizon_us, np.asarray(anchor_row)[eval_ids],
                           np.asarray(obs_time)[eval_ids], k, fill)


def past_targets_at(anchor_row: np.ndarray, obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray,
                    horizon_us: int, anchors: np.ndarray, times: np.ndarray, k: int, fill: np.ndarray | None = None
                    ) -> np.ndarray:
    """`past_targets` of any anchor rows `anchors` at observation times `times` (an anchor with no seed of the
    task gets only `fill`)."""
    anchor_row, obs_time = np.asarray(anchor_row), np.asarray(obs_time)
    offsets, targets = np.asarray(offsets), np.asarray(targets)
    out = np.full((len(anchors), k), -1, dtype=np.int64)
    for i, (a, t) in enumerate(zip(np.asarray(anchors), np.asarray(times), strict=True)):
        uniq, cnt, last = _anchor_history(anchor_row, obs_time, offsets, targets, a, t - horizon_us)
        ranked = uniq[np.lexsort((uniq, -last, -cnt))][:k]
        out[i, :len(ranked)] = ranked
        if fill is not None and len(ranked) < k:
            extra = [r for r in fill[i] if r >= 0 and r not in set(ranked.tolist())]
            take = extra[:k - len(ranked)]
            out[i, len(ranked):len(ranked) + len(take)] = take
    return out


def _anchor_history(anchor_row: np.ndarray, obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray,
                    anchor: int, cutoff: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The target rows `anchor` linked to in seeds observed at or before `cutoff` (seeds sorted by anchor, then
    time): (rows ascending, links to each, the latest such seed's time)."""
    lo, hi = np.searchsorted(anchor_row, anchor, side="left"), np.searchsorted(anchor_row, anchor, side="right")
    hi = lo + int(np.searchsorted(obs_time[lo:hi], cutoff, side="right"))
    own = targets[offsets[lo]:offsets[hi]]
    uniq, inv, cnt = np.unique(own, return_inverse=True, return_counts=True)
    last = np.full(len(uniq), np.iinfo(np.int64).min)
    np.maximum.at(last, inv, np.repeat(obs_time[lo:hi], np.diff(offsets[lo:hi + 1])))
    return uniq.astype(np.int64), cnt, last


def top_k(queries: np.ndarray, keys: np.ndarray, k: int, *, block: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of every query against every key by inner product: (indices [n, k] into `keys`, scores [n, k]),
    best first, ties by index ascending (as a full sort would order them); k > len(keys) pads with -1 / -inf.
    Blocks of `block` queries at a time keep memory at block x len(keys) scores."""
    queries = np.asarray(queries, dtype=np.float32)
    keys = np.asarray(keys, dtype=np.float32)
    n, m = queries.shape[0], keys.shape[0]
    idx = np.full((n, k), -1, dtype=np.int64)
    val = np.full((n, k), -np.inf, dtype=np.float32)
    take = min(k, m)
    if take == 0:
        return idx, val
    for lo in range(0, n, block):
        s = queries[lo:lo + block] @ keys.T
        # every key scoring at least the k-th best is a candidate (ties at the boundary included), then sorted
        kth = np.partition(s, m - take, axis=1)[:, m - take]
        for j in range(s.shape[0]):
            cand = np.flatnonzero(s[j] >= kth[j])
            order = cand[np.lexsort((cand, -s[j, cand]))][:take]
            idx[lo + j, :take] = order
            val[lo + j, :take] = s[j, order]
    return idx, val


def co_linked_at(anchor_row: np.ndarray, obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray,
                 horizon_us: int, catalog: tuple[int, int], anchors: np.ndarray, times: np.ndarray, k: int,
                 fill: np.ndarray | None = None) -> np.ndarray:
    """[n, k]: per question (anchor row, observation time), the target rows that other anchors linked to along with
    the anchor's own earlier targets ("who linked to what you linked to also linked to ..."), ranked by the number
    of such (shared target, other anchor) paths, then row; the anchor's own earlier targets are left out (the
    past-targets list has them); the rest of the list from `fill`. Only links known at the observation time count
    (seed time <= T - horizon), as for every baseline."""
    from scipy import sparse

    first, end = catalog
    anchor_row, obs_time = np.asarray(anchor_row), np.asarray(obs_time)
    anchors, times = np.asarray(anchors, dtype=np.int64), np.asarray(times, dtype=np.int64)
    seed_of_link = np.repeat(np.arange(len(anchor_row)), np.diff(offsets))
    link_time, link_anchor = obs_time[seed_of_link], anchor_row[seed_of_link]
    link_row = np.asarray(targets)[: len(seed_of_link)] - first
    uniq_anchor, link_a = np.unique(link_anchor, return_inverse=True)
    out = np.full((len(anchors), k), -1, dtype=np.int64)
    n_items = end - first
    for t in np.unique(times):
        known = link_time <= t - horizon_us
        m = sparse.csr_matrix((np.ones(int(known.sum())), (link_a[known], link_row[known])),
                              shape=(len(uniq_anchor), n_items))
        m.sum_duplicates()
        m.data[:] = 1.0  # an (anchor, target) pair counts once however often it was linked
        at = np.flatnonzero(times == t)
        pos = np.minimum(np.searchsorted(uniq_anchor, anchors[at]), max(len(uniq_anchor) - 1, 0))
        has = uniq_anchor[pos] == anchors[at] if len(uniq_anchor) else np.zeros(len(at), bool)
        if has.any():
            own = m[pos[has]]  # [q, targets]: each asking anchor's own known targets
            shared = (own @ m.T).tolil()  # [q, anchors]: targets shared with each anchor
            shared[np.arange(len(own.indptr) - 1), pos[has]] = 0  # not the anchor itself
            scores = (shared.tocsr() @ m).toarray()
            for j, i in enumerate(at[has]):
                scores[j, own[j].indices] = 0.0
                out[i] = _top(scores[j], k, first)
    if fill is not None:
        for i in range(len(anchors)):
            got = out[i][out[i] >= 0]
            extra = [r for r in fill[i] if r >= 0 and r not in set(got.tolist())][:k - len(got)]
            out[i, len(got):len(got) + len(extra)] = extra
    return out


PAIR_COUNTS = ("anchor_links", "anchor_recency", "row_links", "row_recent_links")


def pair_count_names(forecast_windows: int = 0) -> tuple[str, ...]:
    """`pair_counts_at`'s columns: `PAIR_COUNTS`, then "row_forecast" with a forecast."""
    return PAIR_COUNTS + (("row_forecast",) if forecast_windows else ())


def pair_counts_at(anchor_row: np.ndarray, obs_time: np.ndarray, offsets: np.ndarray, targets: np.ndarray,
                   horizon_us: int, catalog: tuple[int, int], anchors: np.ndarray, times: np.ndarray,
                   rows: list[np.ndarray], forecast_windows: int = 0,
                   forecasts: dict[int, np.ndarray] | None = None) -> list[np.ndarray]:
    """Per question (anchor row, observation time) and its candidate target rows `rows[i]` (global), counts from
    links known at its time (seed time <= T - horizon), in `pair_count_names` order: the anchor's links to the row;
    how recent its latest one is (horizon / (T - that seed's time), in (0, 1]; 0 when none); the row's links from
    every anchor; those of the last horizon before the newest known (recent popularity's window); with
    `forecast_windows` > 0, the row's links expected in the coming horizon from its links in that many horizons
    before (`link_forecast.forecast_popularity`: rising or falling), fitted at the start of the cutoff's UTC day
    (nothing after it; `forecasts`, when given, keeps each day's forecast for the next call). What the lists'
    places leave out: how much, and how lately."""
    from confluence.targets.link_forecast import HISTORY, forecast_popularity, horizon_buckets

    first, end = catalog
    anchor_row, obs_time = np.asarray(anchor_row), np.asarray(obs_time)
    offsets, targets = np.asarray(offsets), np.asarray(targets)
    anchors, times = np.asarray(anchors, dtype=np.int64), np.asarray(times, dtype=np.int64)
    width = len(pair_count_names(forecast_windows))
    out: list[np.ndarray] = [np.zeros((0, width))] * len(anchors)
    t_eval = times - horizon_us
    link_time, link_row = _sorted_links(obs_time, offsets, targets, first)
    for t, total, recent in _known_counts(obs_time, offsets, targets, catalog, t_eval, horizon_us,
                                          (link_time, link_row)):
        if forecast_windows:
            day = int(t) - int(t) % US_PER_DAY  # one fit per day of cutoffs (a request of many times stays cheap)
            forecast = None if forecasts is None else forecasts.get(day)
            if forecast is None:
                buckets = horizon_buckets(link_time, link_row, day, horizon_us, HISTORY + forecast_windows,
                                          end - first)
                forecast = forecast_popularity(buckets, forecast_windows)
                if forecasts is not None:
                    forecasts[day] = forecast
        for i in np.flatnonzero(t_eval == t):
            cand = np.asarray(rows[i], dtype=np.int64)
            x = np.zeros((len(cand), width))
            x[:, 2], x[:, 3] = total[cand - first], recent[cand - first]
            if forecast_windows:
                x[:, 4] = forecast[cand - first]
            uniq, cnt, last = _anchor_history(anchor_row, obs_time, offsets, targets, anchors[i], t)
            if len(uniq):
                pos = np.minimum(np.searchsorted(uniq, cand), len(uniq) - 1)
                hit = uniq[pos] == cand
                x[hit, 0] = cnt[pos[hit]]
                x[hit, 1] = horizon_us / np.maximum(times[i] - last[pos[hit]], horizon_us)
            out[i] = x
    return out
