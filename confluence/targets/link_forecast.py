"""How many links each target row will get in the coming horizon, forecast from its links of the horizons before:
whether a row's popularity is rising or falling, which neither popularity nor recent popularity says.

At a cutoff (the newest seed time whose links are known), the known links are counted per row in horizon-long
buckets back from it (`horizon_buckets`: bucket j holds seed times in (cutoff - j h, cutoff - (j - 1) h]). A Poisson
gradient-boosted regression (scikit-learn's `HistGradientBoostingRegressor`) learns, over the earlier buckets, a
row's count in one bucket from its counts in the `windows` buckets before it, and then reads the newest `windows`
buckets to forecast the next one (`forecast_popularity`). Everything it reads is known at the cutoff: the same rule
as every baseline (a link of seed (anchor, t) is known from t + horizon on).
"""

from __future__ import annotations

import numpy as np

HISTORY = 16  # buckets the regression learns from (each a count with its `windows` buckets before as the input)
MAX_ROWS = 20_000  # rows whose buckets the regression learns from (a uniform sample beyond it, fixed seed)
MIN_EXAMPLES = 50  # fewer learning examples with any link: the forecast is the newest bucket's count


def horizon_buckets(link_time: np.ndarray, link_row: np.ndarray, cutoff: int, horizon_us: int, n: int,
                    rows: int) -> np.ndarray:
    """[n, rows]: links per row (0-based `link_row`) in the n horizon-long buckets before `cutoff`, newest first;
    `link_time` sorted ascending (seed times)."""
    out = np.zeros((n, rows), dtype=np.float64)
    edges = cutoff - horizon_us * np.arange(n + 1, dtype=np.int64)  # edges[j] is bucket j's right end
    hi = np.searchsorted(link_time, edges, side="right")
    for j in range(n):
        np.add.at(out[j], link_row[hi[j + 1]:hi[j]], 1.0)
    return out


def forecast_popularity(buckets: np.ndarray, windows: int) -> np.ndarray:
    """[rows]: each row's expected links in the bucket after the newest of `buckets` ([n, rows], newest first,
    `horizon_buckets`), from its counts in the newest `windows` buckets, by a Poisson regression fitted on the older
    buckets (each bucket's counts from the `windows` before it). Too little history: the newest bucket's counts."""
    n, rows = buckets.shape
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")
    logs = np.log1p(buckets)
    query = np.zeros((rows, windows))
    have = min(windows, n)
    query[:, :have] = logs[:have].T
    fallback = buckets[0] if n else np.zeros(rows)
    targets = list(range(min(HISTORY, n - windows)))
    if not targets:
        return fallback
    seen = np.flatnonzero(buckets.any(axis=0))
    if len(seen) > MAX_ROWS:
        seen = np.sort(np.random.default_rng(0).choice(seen, MAX_ROWS, replace=False))
    x = np.concatenate([logs[i + 1:i + 1 + windows, seen].T for i in targets])
    y = np.concatenate([buckets[i, seen] for i in targets])
    if (y > 0).sum() < MIN_EXAMPLES:
        return fallback
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    from confluence.toolkit.threads import free_cpus

    model = HistGradientBoostingRegressor(loss="poisson", max_iter=100, learning_rate=0.1, max_leaf_nodes=15,
                                          min_samples_leaf=20, early_stopping=False, random_state=0)
    # OpenMP's threads beside busy cores spin-wait (toolkit.threads): a fit of 10,000 rows took 16 s with every
    # thread and 1.1 s with one, beside two busy processes on 2 cores
    with threadpool_limits(free_cpus()):
        model.fit(x, y)
        return model.predict(query)
