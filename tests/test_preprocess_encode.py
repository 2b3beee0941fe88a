"""Per-type encoders against hand-computed values (datetime as the independent oracle)."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confluence.errors import DataError
from confluence.preprocess import encode as enc
from confluence.preprocess.stats import CHUNK, MomentStats

UTC = dt.UTC


def _oracle(t: dt.datetime, mean: float, std: float) -> np.ndarray:
    """The 15 floats of docs/design/architecture.md computed from calendar fields by Python's datetime."""
    fields = [
        (t.second + t.microsecond / 1e6, 60), (t.minute, 60), (t.hour, 24), (t.weekday(), 7),
        (t.day - 1, 365.2425 / 12), (t.month - 1, 12), (t.timetuple().tm_yday - 1, 365.2425),
    ]
    out = []
    for x, p in fields:
        a = 2 * math.pi * x / p
        out += [math.sin(a), math.cos(a)]
    epoch = (t.replace(tzinfo=UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
    out.append((epoch - mean) / std)
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("t", [
    dt.datetime(2020, 1, 5, 10, 30, 15),          # a Sunday
    dt.datetime(2024, 2, 29, 23, 59, 59, 500000),  # leap day, fractional second
    dt.datetime(1815, 12, 23),                     # negative epoch
    dt.datetime(1970, 1, 1),
    dt.datetime(9999, 12, 31, 12),
])
def test_timestamp_encoding_matches_calendar(t):
    us = (t.replace(tzinfo=UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
    got = enc.encode_timestamp(np.array([us], dtype=np.int64), mean=1.5e15, std=2.0e12)[0]
    np.testing.assert_allclose(got, _oracle(t, 1.5e15, 2.0e12), rtol=0, atol=2e-6)


def test_timestamp_pairs_hand_values():
    # 2020-01-05 10:30:15 UTC: second 15 -> (1, 0), minute 30 -> (0, -1), month 1 -> (0, 1), Sunday = 6.
    us = (dt.datetime(2020, 1, 5, 10, 30, 15, tzinfo=UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(
        microseconds=1)
    v = enc.encode_timestamp(np.array([us]), mean=float(us), std=1.0)[0]
    np.testing.assert_allclose(v[0:2], [1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(v[2:4], [0.0, -1.0], atol=1e-6)
    np.testing.assert_allclose(v[6:8], [math.sin(2 * math.pi * 6 / 7), math.cos(2 * math.pi * 6 / 7)], atol=1e-6)
    np.testing.assert_allclose(v[10:12], [0.0, 1.0], atol=1e-6)
    assert v[14] == 0.0


def test_epoch_us_units_dates_and_timezones():
    base = dt.datetime(2021, 6, 1, 12, 0, 0, tzinfo=UTC)
    want = (base - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
    for unit in ("s", "ms", "us", "ns"):
        arr = pa.array([base, None], pa.timestamp(unit))
        us, valid = enc.to_epoch_us(arr, "t", "c", 0)
        assert us[0] == want and list(valid) == [True, False]
    # a timezone-aware value is an instant: 14:00 at +02:00 is 12:00 UTC
    aware = pa.array([base], pa.timestamp("us", tz="Europe/Paris"))
    assert enc.to_epoch_us(aware, "t", "c", 0)[0][0] == want
    d32 = pa.array([dt.date(2021, 6, 1)], pa.date32())
    d64 = pa.array([dt.date(2021, 6, 1)], pa.date64())
    midnight = want - 12 * 3600 * 10**6
    assert enc.to_epoch_us(d32, "t", "c", 0)[0][0] == midnight
    assert enc.to_epoch_us(d64, "t", "c", 0)[0][0] == midnight


def test_timestamp_errors_name_the_cell():
    far = pa.array([0, 400_000_000_000], pa.timestamp("s"))  # year ~14645
    with pytest.raises(DataError, match=r"table 't', column 'c', row 11: timestamp out of range"):
        enc.to_epoch_us(far, "t", "c", 10)
    with pytest.raises(DataError, match="stype timestamp needs a timestamp"):
        enc.to_epoch_us(pa.array(["2020-01-01"]), "t", "c", 0)


def test_numerical_non_finite_is_null_and_strings_fail():
    x, valid = enc.to_float(pa.array([1.0, float("nan"), float("inf"), None, 2.0]), "t", "c", 0)
    assert list(valid) == [True, False, False, False, True]
    assert list(x[valid]) == [1.0, 2.0]
    x, valid = enc.to_float(pa.array(["1.5", None, "3"]), "t", "c", 0)
    assert list(x[valid]) == [1.5, 3.0]
    with pytest.raises(DataError, match=r"table 't', column 'c', row 6: numerical column holds the non-number 'abc'"):
        enc.to_float(pa.array(["1", None, "abc"]), "t", "c", 4)


def test_boolean_from_bools_and_01_integers():
    x, valid = enc.to_bool(pa.array([True, None, False]), "t", "c", 0)
    assert list(x) == [True, False, False] and list(valid) == [True, False, True]
    x, valid = enc.to_bool(pa.array([1, 0, None], pa.int8()), "t", "c", 0)
    assert list(x) == [True, False, False] and list(valid) == [True, True, False]
    with pytest.raises(DataError, match="row 2: boolean column holds 7"):
        enc.to_bool(pa.array([1, 0, 7]), "t", "c", 0)


def test_categorical_indices_in_sorted_block():
    cats = pa.array([1, 2, 10], pa.int32())
    idx, valid = enc.encode_categorical(pa.array([10, None, 1, 2], pa.int32()), cats, block_start=5)
    assert list(idx) == [7, 0, 5, 6] and list(valid) == [True, False, True, True]


def test_moment_stats_do_not_depend_on_batching():
    rng = np.random.default_rng(0)
    x = rng.normal(1e6, 3.0, size=3 * CHUNK + 123)
    valid = rng.random(len(x)) > 0.1

    def run(batch: int) -> MomentStats:
        s = MomentStats()
        for i in range(0, len(x), batch):
            s.add(x[i:i + batch], valid[i:i + batch])
        s.finish()
        return s

    a, b = run(len(x)), run(1000)
    assert (a.mean, a.std, a.count, a.min, a.max) == (b.mean, b.std, b.count, b.min, b.max)
    np.testing.assert_allclose(a.mean, x[valid].mean(), rtol=1e-12)
    np.testing.assert_allclose(a.std, x[valid].std(), rtol=1e-9)


@given(st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59)))
def test_timestamp_encoding_property(t):
    us = (t.replace(tzinfo=UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
    got = enc.encode_timestamp(np.array([us], dtype=np.int64), mean=0.0, std=1e15)[0]
    np.testing.assert_allclose(got, _oracle(t, 0.0, 1e15), rtol=0, atol=3e-6)
