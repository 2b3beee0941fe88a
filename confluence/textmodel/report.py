"""Training curves of a text-model run: one panel per logged loss term, from run/metrics.csv."""

from __future__ import annotations

import csv
from pathlib import Path

from confluence.errors import ConfluenceError


def plot_curves(run: str | Path, out: str | Path) -> Path:
    """Plot every metric column of run/metrics.csv against the step into a small PNG at `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(run) / "metrics.csv"
    if not path.is_file():
        raise ConfluenceError(f"{run}: no metrics.csv; not a text-model run directory")
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ConfluenceError(f"{path}: no logged steps yet")
    names = [k for k in rows[0] if k not in ("step", "seconds")]
    steps = [int(r["step"]) for r in rows]
    cols = 4
    nrows = -(-len(names) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.0 * cols, 2.2 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        ax.plot(steps, [float(r[name]) for r in rows], lw=1.2)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.supxlabel("step", fontsize=9)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
