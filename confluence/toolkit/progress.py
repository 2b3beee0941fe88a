"""Progress of long work: a rich bar on a terminal, plain log lines elsewhere (a CI log, `| tee`, a file).

`Reporter` is the one progress object of every long step (preprocessing, evaluation, prediction, LightGBM);
`StepBar` is the training loop's bar (steps per second, last loss). Neither is silent when the output is not a
terminal: there they print a line when a step starts, at most every `interval` seconds while it runs, and when it
ends, so a log shows that work goes on and how fast. A `Reporter` also prints its line every `interval` seconds
while one unit of work lasts longer (a query, a compilation), and `Phase` does the same for work that has no count
(compiling the training step, validating), so no wait is ever silent for longer than `interval`."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType

from rich.console import Console

LOG_INTERVAL_S = 10.0


def _fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class _Ticker:
    """Calls `fn()` about every `interval` seconds on a daemon thread until `stop()`: what keeps a log talking while
    one unit of work (a DuckDB query, an XLA compilation, a LightGBM round) takes longer than the interval."""

    def __init__(self, interval: float, fn: Callable[[], None]):
        self.interval, self.fn = interval, fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(min(self.interval, 1.0)):  # wakes often enough to be on time, cheaply
            self.fn()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


class _Lines:
    """Plain progress lines for one step at a time: `desc: done/total (pct) elapsed, ~left`. With `tick`, the line
    is also printed when `interval` seconds pass without one (a unit that lasts longer than the interval)."""

    def __init__(self, console: Console, interval: float, tick: bool = False):
        self.console, self.interval = console, interval
        self.desc, self.total, self.done = "", 0, 0
        self.t0 = self.last = 0.0
        self.open = False
        self.printed = -1  # `done` at the last line written
        self.extra = ""  # what the last line ended with (rate and loss, or what is being done now)
        self.lock = threading.RLock()  # the ticker's thread prints too
        self.tick = tick and interval > 0
        self.ticker: _Ticker | None = None  # started with the first step

    def start(self, desc: str, total: int, done: int = 0) -> None:
        with self.lock:
            self.finish()
            if self.tick and self.ticker is None:
                self.ticker = _Ticker(self.interval, self._tick)
            self.desc, self.total, self.done = desc, max(int(total), 1), int(done)
            self.t0 = self.last = time.perf_counter()
            self.open = True
            self.printed = -1
            self.extra = ""
            self.console.print(f"{desc}: started ({self.total} to do)", highlight=False, soft_wrap=True, markup=False)

    def line(self, extra: str | None = None) -> None:
        with self.lock:
            if extra is not None:
                self.extra = extra
            el = time.perf_counter() - self.t0
            pct = 100.0 * self.done / self.total
            rate = self.done / el if el > 0 else 0.0
            settled = self.done >= max(1, self.total // 50)  # the first step (a JIT compile) says nothing of the rest
            left = f", ~{_fmt_s((self.total - self.done) / rate)} left" if settled and 0 < rate and self.done < self.total else ""
            self.printed = self.done
            self.last = time.perf_counter()
            self.console.print(f"{self.desc}: {self.done}/{self.total} ({pct:.0f}%) {_fmt_s(el)} elapsed{left}"
                               f"{self.extra}", highlight=False, soft_wrap=True, markup=False)

    def advance(self, n: int, extra: str | None = None) -> None:
        with self.lock:
            if not self.open:
                return
            self.done += int(n)
            if time.perf_counter() - self.last >= self.interval:
                self.line(extra)
            elif extra is not None:
                self.extra = extra

    def note(self, text: str) -> None:
        with self.lock:
            self.extra = f"; {text}" if text else ""

    def _tick(self) -> None:
        with self.lock:
            if self.open and time.perf_counter() - self.last >= self.interval:
                self.line()

    def finish(self, extra: str | None = None) -> None:
        with self.lock:
            if self.open:
                if self.printed != self.done:  # the last line already said where it ended
                    self.line(extra)
                self.open = False

    def close(self) -> None:
        """Stop the ticker (after `finish`, or on an error without a last line)."""
        if self.ticker is not None:
            self.ticker.stop()
            self.ticker = None


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
            self._lines = _Lines(self.console, interval, tick=True)
        self._task: int | None = None
        self._desc = ""

    def __enter__(self) -> Reporter:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self._lines is not None:
            if exc_type is None:
                self._lines.finish()
            self._lines.close()

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
        self._desc = description

    def note(self, text: str) -> None:
        """Say what the current step is doing now ("siblings through flights.carrier"): the end of its next lines
        (the bar's description on a terminal), so a unit that takes long says what it is."""
        if self._lines is not None:
            self._lines.note(text)
        elif self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=f"{self._desc}: {text}")

    def advance(self, n: int = 1) -> None:
        """Move the current step by `n` units."""
        if self._lines is not None:
            self._lines.advance(n)
        elif self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)


def per_row(advance: Callable[[int], None], draws: int) -> Callable[[int], None]:
    """`advance` (a step counted in rows) as the callback of work that reports contexts: each row is answered from
    `draws` contexts, so the step moves one row per `draws` contexts (the remainder carried) and ends at its number
    of rows, the count a user asked for, not `draws` times it."""
    if draws <= 1:
        return advance
    done = 0

    def contexts(n: int) -> None:
        nonlocal done
        before = done // draws
        done += int(n)
        if done // draws > before:
            advance(done // draws - before)

    return contexts


class Phase(AbstractContextManager["Phase"]):
    """A stretch of work without a count (compiling the training step, validating): a line when it starts (`what
    (detail) ...`), a line when it ends (`what: done in 0:37`), and with `tick` a line every `interval` seconds while
    it lasts (`what: 0:20 elapsed, 3/7 tasks done`: `status` says where it is). Silent when not `enabled` (a
    process other than the first of a multi-host run)."""

    def __init__(self, what: str, detail: str = "", *, console: Console | None = None, enabled: bool = True,
                 tick: bool = True, interval: float = LOG_INTERVAL_S):
        self.what, self.detail, self.enabled = what, detail, enabled
        self.console = console or Console(file=sys.stdout)
        self.tick, self.interval = tick and enabled and interval > 0, interval
        self.status = ""
        self.t0 = self.last = 0.0
        self.lock = threading.Lock()
        self.ticker: _Ticker | None = None

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True, markup=False)

    def __enter__(self) -> Phase:
        self.t0 = self.last = time.perf_counter()
        if self.enabled:
            self._print(f"{self.what}" + (f" ({self.detail})" if self.detail else "") + " ...")
        if self.tick:
            self.ticker = _Ticker(self.interval, self._tick)
        return self

    def _tick(self) -> None:
        with self.lock:
            now = time.perf_counter()
            if now - self.last >= self.interval:
                self.last = now
                self._print(f"{self.what}: {_fmt_s(now - self.t0)} elapsed" + (f", {self.status}" if self.status else ""))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.ticker is not None:
            self.ticker.stop()
        if self.enabled and exc_type is None:
            self._print(f"{self.what}: done in {_fmt_s(time.perf_counter() - self.t0)}")


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

    def retotal(self, total: int) -> None:
        """The run now ends at step `total` (a run that cools down early)."""
        if self.p is not None:
            self.p.update(self.task, total=total)
        elif self.lines is not None:
            self.lines.total = max(int(total), 1)

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
