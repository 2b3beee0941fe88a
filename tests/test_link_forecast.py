"""The link ranker's popularity forecast: buckets by hand, a rise told from a fall, too little history, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.errors import ConfigError
from confluence.stypes import US_PER_DAY
from confluence.targets.link_forecast import HISTORY, forecast_popularity, horizon_buckets
from confluence.training.config import LinkConfig

RAMP = np.array([0, 0, 2, 5, 10, 20, 20, 10, 5, 2, 0, 0], dtype=np.float64)  # a row's links by horizon


def test_horizon_buckets_count_each_rows_links_back_from_the_cutoff():
    # horizon 10, cutoff 30: bucket 1 = (20, 30], bucket 2 = (10, 20], bucket 3 = (0, 10]
    time = np.array([0, 5, 10, 15, 20, 25, 30, 31])
    row = np.array([0, 1, 1, 0, 2, 2, 1, 0])
    got = horizon_buckets(time, row, 30, 10, 3, 3)
    assert got.tolist() == [[0, 1, 1], [1, 0, 1], [0, 2, 0]]  # t=0 is not in (0, 10]; t=31 is after the cutoff


def _ramped(rows: int, horizons: int, rng: np.random.Generator) -> np.ndarray:
    """[horizons, rows] newest first: each row's links follow RAMP from its own phase, Poisson noise."""
    phase = rng.integers(0, len(RAMP), rows)
    t = np.arange(horizons)[::-1, None]  # newest bucket = the latest time
    return rng.poisson(RAMP[(t + phase[None, :]) % len(RAMP)]).astype(np.float64), phase


def test_the_forecast_tells_a_rising_row_from_a_falling_one():
    rng = np.random.default_rng(0)
    buckets, phase = _ramped(600, HISTORY + 4, rng)
    fc = forecast_popularity(buckets, 4)
    nxt = RAMP[(HISTORY + 4 + phase) % len(RAMP)]  # each row's expected links in the coming horizon
    # rows at 10 links in the newest horizon: rising (20 next) against falling (5 next)
    newest = RAMP[(HISTORY + 3 + phase) % len(RAMP)]
    rising, falling = (newest == 10) & (nxt == 20), (newest == 10) & (nxt == 5)
    assert rising.any() and falling.any()
    assert fc[rising].mean() > 1.5 * fc[falling].mean()
    # and it ranks the rows better than the newest count does (Spearman against what comes)
    def spearman(a: np.ndarray, b: np.ndarray) -> float:
        ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
        return float(np.corrcoef(ra, rb)[0, 1])
    assert spearman(fc, nxt) > spearman(buckets[0], nxt) + 0.1


def test_too_little_history_forecasts_the_newest_count():
    rng = np.random.default_rng(1)
    buckets, _ = _ramped(50, 4, rng)
    assert (forecast_popularity(buckets, 4) == buckets[0]).all()  # no older bucket to learn from
    sparse = np.zeros((HISTORY + 4, 50))
    sparse[3, 7] = 1.0
    assert (forecast_popularity(sparse, 4) == sparse[0]).all()  # a single link: nothing to learn from
    with pytest.raises(ValueError, match="windows"):
        forecast_popularity(buckets, 0)


def test_the_forecast_is_deterministic():
    buckets, _ = _ramped(300, HISTORY + 4, np.random.default_rng(2))
    assert forecast_popularity(buckets, 4).tobytes() == forecast_popularity(buckets.copy(), 4).tobytes()


def test_the_forecast_setting_is_checked():
    assert LinkConfig().forecast_windows == 4
    with pytest.raises(ConfigError, match="forecast_windows"):
        LinkConfig(forecast_windows=-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_forecast_reads_no_link_unknown_at_the_observation_time(seed):
    """Links of seeds after T - horizon replaced by random rows: every row's pair counts and forecast unchanged."""
    from confluence.targets import link as L

    rng = np.random.default_rng(seed)
    horizon, weeks, anchors, rows = 7 * US_PER_DAY, 30, 40, 60
    anchor_row = np.repeat(np.arange(anchors), weeks)  # sorted by anchor, then time
    obs_time = np.tile(np.arange(weeks) * horizon, anchors)
    per_seed = rng.integers(0, 4, len(anchor_row))
    offsets = np.concatenate([[0], np.cumsum(per_seed)])
    hot = (np.arange(weeks)[:, None] + np.arange(rows)[None, :]) % 10 < 2  # each row hot two weeks in ten
    seed_week = np.repeat(obs_time // horizon, per_seed)
    targets = np.where(rng.random(len(seed_week)) < 0.7,
                       np.array([rng.choice(np.flatnonzero(hot[w])) for w in seed_week]),
                       rng.integers(0, rows, len(seed_week))) + 100
    t = int(rng.integers(20, weeks)) * horizon
    every = [np.arange(100, 100 + rows)] * 3
    ask = (np.array([0, 5, 9]), np.full(3, t))
    future = np.repeat(obs_time, per_seed) > t - horizon
    shuffled = targets.copy()
    shuffled[future] = rng.integers(100, 100 + rows, int(future.sum()))
    got = [L.pair_counts_at(anchor_row, obs_time, offsets, tg, horizon, (100, 100 + rows), *ask, every,
                            forecast_windows=4) for tg in (targets, shuffled)]
    for a, b in zip(*got, strict=True):
        assert a.tobytes() == b.tobytes()
    assert not np.array_equal(got[0][0][:, 4], got[0][0][:, 3])  # the forecast was fitted, not the fallback


def test_the_forecast_is_fitted_once_per_day_of_cutoffs():
    """Questions at many times of one day share one fit at the day's start (a request of many observation times
    stays cheap); a later day gets its own."""
    from confluence.targets import link as L

    rng = np.random.default_rng(3)
    horizon, weeks, rows = 7 * US_PER_DAY, 30, 40
    anchor_row = np.repeat(np.arange(30), weeks)
    obs_time = np.tile(np.arange(weeks) * horizon, 30)
    per_seed = rng.integers(1, 4, len(anchor_row))
    offsets = np.concatenate([[0], np.cumsum(per_seed)])
    targets = rng.integers(0, rows, int(per_seed.sum()))
    day = 25 * horizon
    times = day + np.array([0, 3600, 7200, 40_000]) * 1_000_000  # one day, four times of it
    times = np.append(times, day + 2 * US_PER_DAY)
    kept: dict[int, np.ndarray] = {}
    got = L.pair_counts_at(anchor_row, obs_time, offsets, targets, horizon, (0, rows), np.zeros(5, np.int64), times,
                           [np.arange(rows)] * 5, forecast_windows=4, forecasts=kept)
    assert sorted(kept) == [day - horizon, day - horizon + 2 * US_PER_DAY]
    assert all(np.array_equal(got[0][:, 4], x[:, 4]) for x in got[1:4])
