"""SHA-256 of the sampler's batches, to check that a change leaves them byte-identical.

    python scripts/batch_digests.py STORE [STORE ...] [--config small --config demo ...] > digests.txt

For every store, recipe (its sampler settings), task and context ("training": labels, `labels_off` and `relabel`
as the training stream draws them; "val": a validation context; "anchors": an ad-hoc anchor task, as `predict`
builds for anchors given by key and time), two batches (epochs 0 and 1, built over the sampler's worker threads)
are hashed over every array of the `TrainingBatch` and the walk's rows. One line per batch; run it before and
after a change and `diff` the two files.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import numpy as np

from confluence.sampler.sampler import Sampler
from confluence.store import Store
from confluence.training.config import load_config


def digest(arrays: dict[str, np.ndarray]) -> str:
    """One hash over the arrays' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def batch_arrays(res) -> dict[str, np.ndarray]:
    """Every array of a build's batch plus the walk's rows, hops, via, src and the chosen labels."""
    b = res.batch
    out = {k: np.asarray(v) for k, v in vars(b).items() if isinstance(v, np.ndarray)}
    out.update(rows=res.rows, hops=res.hops, via=res.via, src=res.src, nrows=res.nrows, n_real=res.n_real)
    if res.labels is not None:
        out["labels"] = res.labels
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--config", action="append", default=None, help="recipes (default: small, demo, seed)")
    args = ap.parse_args()
    for path in args.stores:
        store = Store.open(path)
        for recipe in args.config or ["small", "demo", "seed"]:
            sampler_cfg = load_config(recipe).sampler
            with Sampler([store], sampler_cfg, seed=0) as sampler:
                for e in sampler.entries:
                    name = e.task.name
                    ids = sampler.seed_ids("train", name)[: sampler_cfg.batch_size]
                    val = sampler.seed_ids("val", name)[: sampler_cfg.batch_size]
                    for epoch in (0, 1):
                        cases = [("training", ids, "training", name), ("val", val, "val", name)]
                        if len(val):
                            anchors = sampler.anchor_task(name, e.task.anchor_row[val], e.task.obs_time[val])
                            cases.append(("anchors", np.arange(len(val)), "all", anchors))
                        for label, seeds, context, task in cases:
                            if len(seeds) == 0:
                                continue
                            res = sampler.build(task, seeds, epoch=epoch, context=context)
                            print(f"{store.name} {recipe} {name} {label} epoch={epoch} "
                                  f"{digest(batch_arrays(res))}")
                            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
