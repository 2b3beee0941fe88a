"""Progress of long work: a rich bar on a terminal, plain log lines elsewhere (a CI log, `| tee`, a file).

`Reporter` is the one progress object of every long step (preprocessing, evaluation, prediction, LightGBM);
`StepBar` is the training loop's bar (steps per second, last loss). Neither is silent when the output is not a
terminal: there they print a line when a step starts, at most every `interval` seconds while it runs, and when it
ends, so a log shows that work goes on and how fast."""

from __future__ import annotations

import sys
import time
from contextlib import AbstractContextManager
from types import TracebackType

from rich.console import Console

LOG_INTERVAL_S = 10.0


def _fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class _Lines:
    """Plain progress lines for one step at a time: `desc: done/total (pct) elapsed, ~left`."""

    def __init__(self, console: Console, interval: float):
        self.console, self.interval = console, interval
        self.desc, self.total, self.done = "", 0, 0
        self.t0 = self.last = 0.0
        self.open = False
        self.printed = -1  # `done` at the last line written

    def start(self, desc: str, total: int, done: int = 0) -> None:
        self.finish()
        self.desc, self.total, self.done = desc, max(int(total), 1), int(done)
        self.t0 = self.last = time.perf_counter()
        self.open = True
        self.printed = -1
        self.console.print(f"{desc}: started ({self.total} to do)", highlight=False, soft_wrap=True)

    def line(self, extra: str = "") -> None:
        el = time.perf_counter() - self.t0
        pct = 100.0 * self.done / self.total
        rate = self.done / el if el > 0 else 0.0
        settled = self.done >= max(1, self.total // 50)  # the first step (a JIT compile) says nothing of the rest
        left = f", ~{_fmt_s((self.total - self.done) / rate)} left" if settled and 0 < rate and self.done < self.total else ""
        self.printed = self.done
        self.console.print(f"{self.desc}: {self.done}/{self.total} ({pct:.0f}%) {_fmt_s(el)} elapsed{left}{extra}",
                           highlight=False, soft_wrap=True)

    def advance(self, n: int, extra: str = "") -> None:
        if not self.open:
            return
        self.done += int(n)
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.last = now
            self.line(extra)

    def finish(self, extra: str = "") -> None:
        if self.open:
            if self.printed != self.done:  # the last line already said where it ended
                self.line(extra)
            self.open = False


class Reporter(AbstractContextManager["Reporter"]):
    """`step(description, total)` starts a step; `advance(n)` moves it. A bar on a terminal, log lines otherwise
    (`interval` seconds apart at most), silent when disabled."""

    def __init__(self, enabled: bool, console: Console | None = None, interval: float = LOG_INTERVAL_S):
        self.console = console or Console(stderr=True)
        self._progress = None
        self._lines: _Lines | None = None
        if enabled and self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), console=self.console, transient=False,
            )
        elif enabled:
            self._lines = _Lines(self.console, interval)
        self._task: int | None = None

    def __enter__(self) -> Reporter:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self._lines is not None and exc_type is None:
            self._lines.finish()

    def step(self, description: str, total: int) -> None:
        """Close the current step (as done) and start a new one of `total` units."""
        if self._lines is not None:
            self._lines.start(description, total)
            return
        if self._progress is None:
            return
        if self._task is not None:
            self._progress.update(self._task, completed=self._progress.tasks[self._task].total)
        self._task = self._progress.add_task(description, total=max(int(total), 1))

    def advance(self, n: int = 1) -> None:
        """Move the current step by `n` units."""
        if self._lines is not None:
            self._lines.advance(n)
        elif self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)


class StepBar:
    """The training run's progress over `total` steps from `start` (a resumed run): a rich bar with steps per
    second and the last loss on a terminal, a log line every `interval` seconds otherwise."""

    def __init__(self, total: int, start: int = 0, label: str = "train", console: Console | None = None,
                 interval: float = LOG_INTERVAL_S):
        self.console = console or Console(file=sys.stdout)
        self.t0, self.start = time.perf_counter(), start
        self.p = None
        self.lines: _Lines | None = None
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.p = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                              TextColumn("{task.fields[rate]:.2f} step/s loss {task.fields[loss]}"),
                              TimeRemainingColumn(), console=self.console)
            self.task = self.p.add_task(label, total=total, completed=start, rate=0.0, loss="-")
            self.p.start()
        else:
            self.lines = _Lines(self.console, interval)
            self.lines.start(label, total, done=start)

    def update(self, step: int, loss: float | None) -> None:
        """Record that the run reached `step` with training loss `loss`."""
        rate = (step - self.start) / max(time.perf_counter() - self.t0, 1e-9)
        shown = "-" if loss is None else f"{loss:.4f}"
        if self.p is not None:
            self.p.update(self.task, completed=step, rate=rate, loss=shown)
        elif self.lines is not None:
            self.lines.advance(step - self.lines.done, extra=f", {rate:.2f} step/s, loss {shown}")

    def close(self) -> None:
        """Stop the bar (or write the last line)."""
        if self.p is not None:
            self.p.stop()
        elif self.lines is not None:
            self.lines.finish()
