"""The console progress bar of a training run: steps done, steps per second, the last loss, time left."""

from __future__ import annotations

import time


class StepBar:
    """A rich progress bar over `total` steps, starting at `start` (a resumed run); `close()` removes nothing."""

    def __init__(self, total: int, start: int = 0, label: str = "train"):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[rate]:.2f} step/s loss {task.fields[loss]}"), TimeRemainingColumn())
        self.task = self.p.add_task(label, total=total, completed=start, rate=0.0, loss="-")
        self.t0, self.start = time.perf_counter(), start
        self.p.start()

    def update(self, step: int, loss: float | None) -> None:
        rate = (step - self.start) / max(time.perf_counter() - self.t0, 1e-9)
        self.p.update(self.task, completed=step, rate=rate, loss="-" if loss is None else f"{loss:.4f}")

    def close(self) -> None:
        self.p.stop()
