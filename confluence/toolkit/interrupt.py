"""Ctrl-C at a step boundary: a training loop's first SIGINT is recorded, not raised, so the loop stops after the step
in flight with its state whole and checkpoints it.

Why: a jitted step donates its parameters and optimizer state (`donate_argnums`); a KeyboardInterrupt raised while
the step runs leaves them deleted, and the checkpoint written on the way out fails ("Array has been deleted"). Seen
on the GPU machine (`timeout -s INT` ending `scripts/gpu_pretrain.sh`); on the CPU the window is
rarely hit. A second SIGINT raises KeyboardInterrupt at once (a user who presses Ctrl-C twice wants out now).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class StepBoundaryInterrupt:
    """`with StepBoundaryInterrupt() as stop:` ... `if stop.requested: <checkpoint>; raise KeyboardInterrupt`.

    Installs its SIGINT handler only where Python's own one is in place and on the main thread (elsewhere, or where
    SIGINT is ignored, nothing changes and `requested` stays False); the previous handler is back on exit."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> StepBoundaryInterrupt:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # the second one: out now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False
