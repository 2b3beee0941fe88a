"""Figures without pyplot: one way for every report (the relational model's HTML report, the text model's curves).

matplotlib's object API (`matplotlib.figure.Figure` on the Agg canvas) never touches pyplot's global state, so a
report drawn in a server or a test leaves no open figure and needs no backend switch.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any


def new_figure(w: float, h: float, rows: int = 1, cols: int = 1, **kw: Any) -> tuple[Any, Any]:
    """A pyplot-free figure of `w` x `h` inches and its `rows` x `cols` axes grid (always 2-D)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False, **kw)


def figure_png(fig: Any, dpi: int = 90) -> bytes:
    """The figure rendered to PNG bytes in memory."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def write_png(fig: Any, out: str | Path, dpi: int = 90) -> Path:
    """The figure written to the PNG file `out` (its folder made; the file replaced whole, never half-written)."""
    from confluence.fsutil import atomic_write_bytes

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, figure_png(fig, dpi))
    return out
