"""Training curves of a text-model run: one panel per logged loss term, from run/scalars.csv."""

from __future__ import annotations

from pathlib import Path

from confluence.errors import ConfluenceError
from confluence.toolkit.figures import new_figure, write_png
from confluence.toolkit.logs import read_scalars


def plot_curves(run: str | Path, out: str | Path) -> Path:
    """Plot every `train/` scalar of run/scalars.csv against the step into a small PNG at `out`."""
    path = Path(run) / "scalars.csv"
    if not path.is_file():
        raise ConfluenceError(f"{run}: no scalars.csv; not a text-model run directory")
    data = {k.split("/", 1)[1]: v for k, v in read_scalars(path).items() if k.startswith("train/")}
    if not data:
        raise ConfluenceError(f"{path}: no logged steps yet")
    names = list(data)
    cols = 4
    nrows = -(-len(names) // cols)
    fig, axes = new_figure(3.0 * cols, 2.2 * nrows, nrows, cols)
    for ax, name in zip(axes.flat, names, strict=False):
        steps, values = zip(*data[name], strict=True)
        ax.plot(steps, values, lw=1.2)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.supxlabel("step", fontsize=9)
    return write_png(fig, out, dpi=80)
