"""Streaming column statistics that do not depend on how the rows were batched.

Values are reduced in fixed chunks of `CHUNK` rows (a remainder is carried to the next batch), and chunk results
are merged with Chan's parallel formula in row order, so the floating-point result is the same for any batch
size: identical input gives identical bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CHUNK = 65_536
# Values outside these bounds are kept (encoded as far out as a float32 z-score may be, Z_LIMIT) but left out of
# their column's mean and std, so one sentinel or overflow (1e308, the year 1 or 9999) neither overflows the
# statistics nor squeezes every other value of the column to 0: numbers beyond +-1e18 (past the int64 range,
# no measurement this system handles), timestamps before 1700 or after 2300 (epoch microseconds).
NUMBER_BOUNDS = (-1e18, 1e18)
TIME_BOUNDS = (-8_520_336_000_000_000.0, 10_413_792_000_000_000.0)  # 1700-01-01, 2300-01-01 UTC
Z_LIMIT = 1e6  # |z| of any encoded number at most this (far beyond any ordinary column's), so float32 stays finite


@dataclass
class MomentStats:
    """count / mean / population std / min / max of a stream of float64 (or int64) values."""

    count: int = 0
    null_count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float | int | None = None
    max: float | int | None = None
    bounds: tuple[float, float] | None = None  # values outside: counted in `outliers`, not in mean / m2
    outliers: int = 0
    _carry: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))

    def add(self, values: np.ndarray, valid: np.ndarray) -> None:
        """Add a batch: `values[valid]` are the non-null values."""
        self.null_count += int(len(valid) - np.count_nonzero(valid))
        x = values[valid]
        if len(x) == 0:
            return
        lo, hi = x.min(), x.max()
        self.min = lo.item() if self.min is None else min(self.min, lo.item())
        self.max = hi.item() if self.max is None else max(self.max, hi.item())
        if self.bounds is not None and (lo < self.bounds[0] or hi > self.bounds[1]):
            inside = (x >= self.bounds[0]) & (x <= self.bounds[1])
            self.outliers += int(len(x) - np.count_nonzero(inside))
            x = x[inside]
            if len(x) == 0:
                return
        x = np.concatenate([self._carry, x.astype(np.float64)]) if len(self._carry) else x.astype(np.float64)
        full = len(x) // CHUNK * CHUNK
        for start in range(0, full, CHUNK):
            self._merge(x[start:start + CHUNK])
        self._carry = x[full:].copy()

    def _merge(self, chunk: np.ndarray) -> None:
        n_b = len(chunk)
        mean_b = float(chunk.mean())
        m2_b = float(np.square(chunk - mean_b).sum())
        n_a = self.count
        n = n_a + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta * delta * n_a * n_b / n
        self.count = n

    def finish(self) -> None:
        """Fold in the carried remainder; call once after the last batch."""
        if len(self._carry):
            self._merge(self._carry)
            self._carry = np.zeros(0, dtype=np.float64)

    @property
    def std(self) -> float:
        """Population standard deviation; 1.0 when it is 0 or undefined (so z-scores stay finite)."""
        if self.count == 0:
            return 1.0
        s = float(np.sqrt(self.m2 / self.count))
        return s if s > 0.0 else 1.0

    def merged(self, other: MomentStats) -> MomentStats:
        """Combine two finished accumulators (used for the database-wide timestamp statistics)."""
        out = MomentStats(count=self.count, null_count=self.null_count + other.null_count, mean=self.mean, m2=self.m2,
                          min=self.min, max=self.max, bounds=self.bounds or other.bounds,
                          outliers=self.outliers + other.outliers)
        if other.count:
            n = out.count + other.count
            delta = other.mean - out.mean
            out.mean += delta * other.count / n
            out.m2 += other.m2 + delta * delta * out.count * other.count / n
            out.count = n
            out.min = other.min if out.min is None else min(out.min, other.min)
            out.max = other.max if out.max is None else max(out.max, other.max)
        return out

    def to_json(self) -> dict[str, float | int | None]:
        out = {"count": self.count, "null_count": self.null_count, "mean": self.mean, "std": self.std,
               "min": self.min, "max": self.max}
        if self.outliers:  # only then: the statistics of every ordinary column stay byte for byte as before
            out["outliers"] = self.outliers
        return out


def z_scores(x: np.ndarray, valid: np.ndarray, mean: float, std: float) -> np.ndarray:
    """(x - mean) / std where valid (0 elsewhere), within +-Z_LIMIT: an outlier stays far out but finite."""
    with np.errstate(over="ignore", invalid="ignore"):
        z = np.where(valid, (x - mean) / std, 0.0)
    return np.clip(z, -Z_LIMIT, Z_LIMIT)


@dataclass
class BoolStats:
    null_count: int = 0
    true_count: int = 0
    false_count: int = 0

    def add(self, values: np.ndarray, valid: np.ndarray) -> None:
        t = int(np.count_nonzero(values & valid))
        v = int(np.count_nonzero(valid))
        self.null_count += len(valid) - v
        self.true_count += t
        self.false_count += v - t

    def to_json(self) -> dict[str, int]:
        return {"null_count": self.null_count, "true_count": self.true_count, "false_count": self.false_count}


@dataclass
class DistinctValues:
    """The distinct non-null values of a categorical column, sorted by native value."""

    null_count: int = 0
    _parts: list[pa.Array] = field(default_factory=list)
    _type: pa.DataType | None = None

    def add(self, arr: pa.Array) -> None:
        self.null_count += arr.null_count
        u = pc.unique(arr.drop_null())
        if self._type is None:
            self._type = arr.type
        self._parts.append(u)
        if len(self._parts) > 64:
            self._parts = [pc.unique(pa.concat_arrays(self._parts))]

    def sorted_values(self) -> pa.Array:
        """Distinct values sorted natively (numbers numerically, strings by code point)."""
        if not self._parts:
            return pa.array([], type=self._type or pa.string())
        u = pc.unique(pa.concat_arrays(self._parts))
        return pc.take(u, pc.sort_indices(u))
