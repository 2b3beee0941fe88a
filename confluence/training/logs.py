"""Scalar logs as CSV (`RUN/scalars.csv`: step, wall_time, tag, value), one row per scalar, flushed per write."""

from __future__ import annotations

import csv
import time
from pathlib import Path


class ScalarLog:
    """`path=None` gives a logger that writes nothing (processes other than 0)."""

    def __init__(self, path: Path | None, truncate_after_step: int | None = None):
        self._f = None
        if path is None:
            return
        self.path = Path(path)
        rows = []
        if truncate_after_step is not None and self.path.exists():
            # On resume, drop rows logged after the checkpoint so the log has no repeated steps.
            with open(self.path, newline="") as f:
                rows = [r for r in csv.reader(f)][1:]
            rows = [r for r in rows if int(r[0]) <= truncate_after_step]
        self._f = open(self.path, "w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(["step", "wall_time", "tag", "value"])
        self._w.writerows(rows)
        self._f.flush()

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if self._f is None:
            return
        now = time.time()
        for tag, value in scalars.items():
            self._w.writerow([step, f"{now:.3f}", tag, f"{float(value):.6g}"])
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def read_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from a scalars.csv."""
    out: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(row["tag"], []).append((int(row["step"]), float(row["value"])))
    return out
