"""Vectorized per-type encoders: Arrow arrays in, NumPy arrays out (spec/semantic_types.md).

Every function takes one batch of one column and the batch's first local row (`row0`), so an error can name the
exact row at fault.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from confluence.errors import DataError
from confluence.stypes import D_TIME, US_PER_DAY, US_PER_SECOND

# Accepted timestamp range: years 1 .. 9999 (what every SQL engine and numpy can represent).
MIN_EPOCH_US = -62_135_596_800 * US_PER_SECOND
MAX_EPOCH_US = 253_402_300_800 * US_PER_SECOND - 1

# (sin, cos) pair periods, in order: second, minute, hour, weekday, day of month, month, day of year.
TIMESTAMP_PERIODS = (60.0, 60.0, 24.0, 7.0, 365.2425 / 12.0, 12.0, 365.2425)

_UNIT_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def where(table: str, column: str, row: int) -> str:
    """How errors name a cell."""
    return f"table '{table}', column '{column}', row {row}"


def valid_mask(arr: pa.Array) -> np.ndarray:
    """bool[n], True where the Arrow value is non-null."""
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _first_invalid_row(ok: np.ndarray, row0: int) -> int:
    return row0 + int(np.flatnonzero(~ok)[0])


def to_float(arr: pa.Array, table: str, column: str, row0: int) -> tuple[np.ndarray, np.ndarray]:
    """Numerical values as float64 plus validity; non-finite values count as null.

    Numbers, decimals and booleans are accepted; strings only when every value parses as a number.
    """
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t)
            or pa.types.is_null(t)):
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            try:
                arr = pc.cast(arr, pa.float64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                bad = _first_unparsable(arr)
                raise DataError(
                    f"{where(table, column, row0 + bad)}: numerical column holds the non-number {arr[bad].as_py()!r}"
                ) from None
        else:
            raise DataError(f"table '{table}', column '{column}': stype numerical needs numbers, the data has type {t}")
    x = np.asarray(pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    valid = valid_mask(arr) & np.isfinite(x)
    return np.where(valid, x, 0.0), valid


def non_finite_counts(arr: pa.Array) -> tuple[int, int]:
    """(NaN, ±inf) counts of a float batch, which `to_float` and `category_keys` read as NULL; (0, 0) else."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if not pa.types.is_floating(arr.type):
        return 0, 0
    return int(pc.sum(pc.is_nan(arr)).as_py() or 0), int(pc.sum(pc.is_inf(arr)).as_py() or 0)


def _first_unparsable(arr: pa.Array) -> int:
    for i, v in enumerate(arr.to_pylist()):
        if v is None:
            continue
        try:
            float(v)
        except ValueError:
            return i
    return 0


def to_epoch_us(arr: pa.Array, table: str, column: str, row0: int) -> tuple[np.ndarray, np.ndarray]:
    """Timestamp / date values as int64 epoch microseconds (UTC) plus validity.

    Timezone-aware Arrow timestamps are stored as UTC instants already; dates are midnight UTC. Values outside
    years 1..9999 raise a DataError naming the row.
    """
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    valid = valid_mask(arr)
    if pa.types.is_timestamp(t):
        per_s = _UNIT_PER_SECOND[t.unit]
        raw = np.asarray(pc.cast(arr, pa.int64()).fill_null(0).to_numpy(), dtype=np.int64)
        lo, hi = MIN_EPOCH_US // US_PER_SECOND * per_s, (MAX_EPOCH_US // US_PER_SECOND + 1) * per_s - 1
        _check_range(raw, valid, lo, hi, table, column, row0)
        if per_s >= US_PER_SECOND:
            us = np.floor_divide(raw, per_s // US_PER_SECOND)
        else:
            us = raw * (US_PER_SECOND // per_s)
    elif pa.types.is_date32(t):
        days = np.asarray(pc.cast(arr, pa.int32()).fill_null(0).to_numpy(), dtype=np.int64)
        _check_range(days, valid, MIN_EPOCH_US // US_PER_DAY, MAX_EPOCH_US // US_PER_DAY, table, column, row0)
        us = days * US_PER_DAY
    elif pa.types.is_date64(t):
        ms = np.asarray(pc.cast(arr, pa.int64()).fill_null(0).to_numpy(), dtype=np.int64)
        _check_range(ms, valid, MIN_EPOCH_US // 1000, MAX_EPOCH_US // 1000, table, column, row0)
        us = ms * 1000
    elif pa.types.is_null(t):
        us = np.zeros(len(arr), dtype=np.int64)
    else:
        raise DataError(
            f"table '{table}', column '{column}': stype timestamp needs a timestamp or date column, the data has"
            f" type {t} (cast it in the source, e.g. CAST(col AS TIMESTAMP))"
        )
    return np.where(valid, us, 0), valid


def _check_range(raw: np.ndarray, valid: np.ndarray, lo: int, hi: int, table: str, column: str, row0: int) -> None:
    ok = ~valid | ((raw >= lo) & (raw <= hi))
    if not ok.all():
        raise DataError(f"{where(table, column, _first_invalid_row(ok, row0))}: timestamp out of range (years 1..9999)")


CALENDAR_FIELDS = ("second", "minute", "hour", "weekday", "day_of_month0", "month0", "day_of_year0")


def calendar_fields(epoch_us: np.ndarray) -> dict[str, np.ndarray]:
    """The calendar position of epoch-µs times (UTC), in the order and units of `TIMESTAMP_PERIODS`: second
    (with its fraction), minute, hour, weekday (Monday = 0), day of month, month and day of year (all from 0)."""
    us = np.asarray(epoch_us, dtype=np.int64)
    days = np.floor_divide(us, US_PER_DAY)
    in_day = us - days * US_PER_DAY
    d = days.astype("datetime64[D]")
    month_start = d.astype("datetime64[M]")
    return {
        "second": (in_day % (60 * US_PER_SECOND)) / US_PER_SECOND,
        "minute": (in_day // (60 * US_PER_SECOND)) % 60,
        "hour": in_day // (3600 * US_PER_SECOND),
        "weekday": (days + 3) % 7,  # 1970-01-01 was a Thursday
        "day_of_month0": (d - month_start.astype("datetime64[D]")).astype(np.int64),
        "month0": month_start.astype(np.int64) % 12,
        "day_of_year0": (d - d.astype("datetime64[Y]").astype("datetime64[D]")).astype(np.int64),
    }


def encode_timestamp(epoch_us: np.ndarray, mean: float, std: float) -> np.ndarray:
    """The 15-float encoding of docs/design/architecture.md: 7 cyclic (sin, cos) pairs, then the z-scored epoch."""
    us = np.asarray(epoch_us, dtype=np.int64)
    cal = calendar_fields(us)
    out = np.empty((len(us), D_TIME), dtype=np.float32)
    for k, (x, period) in enumerate(zip((cal[f] for f in CALENDAR_FIELDS), TIMESTAMP_PERIODS, strict=True)):
        angle = ((2.0 * np.pi / period) * np.asarray(x, dtype=np.float64)).astype(np.float32)  # in [0, 2π)
        np.sin(angle, out=out[:, 2 * k])
        np.cos(angle, out=out[:, 2 * k + 1])
    out[:, 14] = (us.astype(np.float64) - mean) / std
    return out


def to_bool(arr: pa.Array, table: str, column: str, row0: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean values (bool, or integers 0/1) plus validity."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    valid = valid_mask(arr)
    if pa.types.is_boolean(t) or pa.types.is_null(t):
        x = np.asarray(arr.cast(pa.bool_()).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    elif pa.types.is_integer(t):
        raw = np.asarray(arr.fill_null(0).to_numpy(), dtype=np.int64)
        ok = (raw == 0) | (raw == 1)
        if not ok.all():
            raise DataError(f"{where(table, column, _first_invalid_row(ok, row0))}: boolean column holds {raw[~ok][0]}")
        x = raw == 1
    else:
        raise DataError(f"table '{table}', column '{column}': stype boolean needs booleans, the data has type {t}")
    return x & valid, valid


def category_keys(arr: pa.Array) -> pa.Array:
    """Normalize a categorical batch for lookup: decode dictionaries, map non-finite floats to null."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_floating(arr.type):
        arr = pc.if_else(pc.is_finite(arr), arr, pa.scalar(None, arr.type))
    return arr


def category_string(value: object) -> str:
    """How a category value is written into the store (and embedded): its natural string form."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 2**53 else repr(value)
    return str(value)


def encode_categorical(arr: pa.Array, categories: pa.Array, block_start: int) -> tuple[np.ndarray, np.ndarray]:
    """Global categorical indices (block_start + position in the sorted categories) plus validity."""
    arr = category_keys(arr)
    if arr.type != categories.type:
        arr = arr.cast(categories.type)
    idx = pc.index_in(arr, value_set=categories)
    valid = valid_mask(idx)
    local = np.asarray(idx.fill_null(0).to_numpy(), dtype=np.int64)
    return np.where(valid, local + block_start, 0).astype(np.uint32), valid
