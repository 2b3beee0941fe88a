"""Batch-building CPU time of two checkouts of the sampler, A/B in one process (a ratio that holds on a noisy box).

    python scripts/ab_sampler.py BASE_CHECKOUT NEW_CHECKOUT STORE [--recipe small] [--blocks 400]

Each checkout's `confluence` package is copied into a temporary folder under another name (`cbase`, `cnew`; its
imports rewritten), so both load side by side; numba compiles each copy once. Blocks of 8 batches (16 seeds each,
built serially in this thread, the tasks in turn) alternate between the two, ABBA; the figure is the median over
blocks of new / base thread CPU time, with its interquartile range: machine noise moves both sides of a pair alike.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def copy_as(checkout: Path, name: str, into: Path) -> None:
    """`checkout`/confluence copied to `into`/`name`, its imports of `confluence` rewritten to `name`."""
    dst = into / name
    shutil.copytree(checkout / "confluence", dst, ignore=shutil.ignore_patterns("__pycache__"))
    for p in dst.rglob("*.py"):
        text = p.read_text()
        text = re.sub(r"\bconfluence\.(\w)", rf"{name}.\1", text)
        text = re.sub(r"\bfrom confluence import\b", f"from {name} import", text)
        p.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("store")
    ap.add_argument("--recipe", default="small")
    ap.add_argument("--blocks", type=int, default=400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in (("cbase", args.base), ("cnew", args.new)):
            copy_as(tree, name, Path(tmp))
        sys.path.insert(0, tmp)
        samplers = {}
        for name in ("cbase", "cnew"):
            cfg = importlib.import_module(f"{name}.training.config").load_config(args.recipe).sampler
            store = importlib.import_module(f"{name}.store").Store.open(args.store)
            samplers[name] = importlib.import_module(f"{name}.sampler.sampler").Sampler([store], cfg, seed=0)
        tasks = [e.task.name for e in samplers["cbase"].entries]

        def block(name: str, k: int, nb: int = 8) -> float:
            s, t = samplers[name], time.thread_time()
            for j in range(nb):
                task = tasks[(k + j) % len(tasks)]
                ids = s.seed_ids("train", task)
                i = (k * nb + j) * 16 % max(1, len(ids) - 16)
                s.build(task, ids[i:i + 16], serial=True)
            return time.thread_time() - t

        for name in samplers:
            block(name, 0)  # compiles
        res: dict[str, list[float]] = {"cbase": [], "cnew": []}
        for k in range(args.blocks):
            for name in (("cbase", "cnew") if k % 2 == 0 else ("cnew", "cbase")):
                res[name].append(block(name, k))
        for s in samplers.values():
            s.close()
    r = [n / b for b, n in zip(res["cbase"], res["cnew"], strict=True)]
    print(f"{args.recipe} on {args.store}: {len(r)} blocks of 8 batches; new / base CPU time, median "
          f"{statistics.median(r):.3f} (IQR {np.percentile(r, 25):.3f}-{np.percentile(r, 75):.3f}); base "
          f"{statistics.median(res['cbase']) * 1e3:.2f} ms, new {statistics.median(res['cnew']) * 1e3:.2f} ms a block")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
