"""Progress reporting for long preprocessing steps (rich progress bars, or silence)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Reporter(AbstractContextManager["Reporter"]):
    """`step(description, total)` starts a bar; `advance(n)` moves the current one. Silent when disabled."""

    def __init__(self, enabled: bool, console: Console | None = None):
        self._progress = (
            Progress(
                TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), console=console or Console(stderr=True), transient=False,
            )
            if enabled
            else None
        )
        self._task: int | None = None

    def __enter__(self) -> Reporter:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def step(self, description: str, total: int) -> None:
        if self._progress is None:
            return
        if self._task is not None:
            self._progress.update(self._task, completed=self._progress.tasks[self._task].total)
        self._task = self._progress.add_task(description, total=max(int(total), 1))

    def advance(self, n: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)
