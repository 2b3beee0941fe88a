"""Scalar logs of a run: CSV (`RUN/scalars.csv`: step, wall_time, tag, value, one row per scalar, flushed per
write) and, beside it, TensorBoard event files (`RUN/tensorboard/`, written by tensorboardX, which needs no
TensorFlow), so `tensorboard --logdir RUN` shows the same curves."""

from __future__ import annotations

import csv
import time
import warnings
from pathlib import Path

TENSORBOARD_DIR = "tensorboard"  # beside scalars.csv


class ScalarLog:
    """`path=None` gives a logger that writes nothing (processes other than 0). `tensorboard=True` also writes
    every scalar as a TensorBoard event into `path.parent / "tensorboard"`; on resume (`truncate_after_step`)
    the new event file tells TensorBoard to drop the old files' events after that step (its `purge_step`), as
    the CSV drops its rows, so a resumed run shows one curve without repeats."""

    def __init__(self, path: Path | None, truncate_after_step: int | None = None, *, tensorboard: bool = True):
        self._f = None
        self._tb = None
        if path is None:
            return
        self.path = Path(path)
        rows = []
        if truncate_after_step is not None and self.path.exists():
            # On resume, drop rows logged after the checkpoint so the log has no repeated steps, and rows a crash
            # cut short (said once: the curve loses that point, nothing else)
            rows, torn = _parsed_rows(self.path)
            if torn:
                warnings.warn(f"{self.path}: {len(torn)} damaged row(s) dropped on resume (line {torn[0]} first)",
                              stacklevel=2)
            rows = [r for r in rows if int(r[0]) <= truncate_after_step]
        self._f = open(self.path, "w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(["step", "wall_time", "tag", "value"])
        self._w.writerows(rows)
        self._f.flush()
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if truncate_after_step is None else truncate_after_step + 1
            # event files are named by the second and host: a suffix keeps a resume within the same second from
            # overwriting the previous file (TensorBoard reads the files in name order)
            self._tb = SummaryWriter(str(self.path.parent / TENSORBOARD_DIR), purge_step=purge, flush_secs=30,
                                     filename_suffix=f".{time.time_ns()}")

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if self._f is None:
            return
        now = time.time()
        for tag, value in scalars.items():
            self._w.writerow([step, f"{now:.3f}", tag, f"{float(value):.6g}"])
            if self._tb is not None:
                self._tb.add_scalar(tag, float(value), global_step=step, walltime=now)
        self._f.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        if self._tb is not None:
            self._tb.close()


def _parsed_rows(path: Path) -> tuple[list[list[str]], list[int]]:
    """The well-formed data rows of a scalars.csv (step, wall_time, tag, value) and the line numbers of the others
    (a row cut short by a crash or a full disk)."""
    good, torn = [], []
    with open(path, newline="", errors="replace") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            if line == 1:
                continue
            try:
                int(row[0]), float(row[1]), float(row[3])
                ok = len(row) == 4 and bool(row[2])
            except (ValueError, IndexError):
                ok = False
            if ok:
                good.append(row)
            else:
                torn.append(line)
    return good, torn


def read_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from a scalars.csv (rows cut short by a crash are skipped)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for step, _wall, tag, value in _parsed_rows(path)[0]:
        out.setdefault(tag, []).append((int(step), float(value)))
    return out


def plot_scalars(csv_path: Path, png_path: Path) -> Path:
    """Loss curves (train per target type, validation per task), learning rates and throughput as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = read_scalars(csv_path)
    panels = [
        ("train loss", [t for t in data if t.startswith("train/loss")]),
        ("validation loss", [t for t in data if t.startswith("val/")]),
        ("learning rate", [t for t in data if t.startswith("lr/")]),
        ("real cells / s", ["perf/cells_per_s"] if "perf/cells_per_s" in data else []),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6))
    for ax, (title, tags) in zip(axes, panels, strict=True):
        for tag in sorted(tags):
            steps, values = zip(*data[tag], strict=True)
            ax.plot(steps, values, label=tag.split("/", 1)[1] if "/" in tag else tag, lw=1.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        if title == "learning rate":
            ax.set_yscale("log")
        if tags:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return Path(png_path)
