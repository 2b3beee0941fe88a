"""Trained link runs ranked on the same seeds of one task, each paired against the first: e.g. fine-tuned from a
pretrained model against trained from scratch at the same budget.

    python scripts/ab_link_runs.py RUN_A RUN_B [RUN_C ...] STORE TASK SPLIT OUT.json

Each run calibrates its own ranker (`LinkRanker.calibrate`, as `evaluate` does) and ranks every seed of SPLIT.
Prints and writes every run's MAP@k, the best baseline, what calibration chose, and each later run minus A paired
over the seeds (`targets.link.paired_bootstrap`).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from confluence.evaluation.links import evaluate_link_splits
from confluence.inference.predictor import load_model
from confluence.store import Store
from confluence.targets import link as L


def main(argv: list[str]) -> None:
    if len(argv) < 6:
        raise SystemExit(__doc__)
    *runs, db, task, split, out = argv
    store = Store.open(db)
    names = [chr(ord("a") + i) for i in range(len(runs))]
    res: dict = {**dict(zip(names, runs, strict=True)), "task": task, "split": split}
    preds: dict = {}
    ids = None
    for name, run in zip(names, runs, strict=True):
        ans = evaluate_link_splits(load_model(run), store, splits=(split,), tasks=[task], max_seeds=None)
        entry, ranked = ans.results[split][task], ans.rankings[split][task]
        if ids is not None and not np.array_equal(ids, ranked["seed_ids"]):
            raise SystemExit("the two runs ranked different seeds")
        preds[name], ids = ranked["model"], ranked["seed_ids"]
        res[name + "_result"] = {"model": entry["model"]["map"], "baseline": entry["baseline"],
                                 "ranker": entry["info"]["ranker"]}
    arr = store.link_arrays(task)
    counts, flat = L.truth_sets(np.asarray(arr.offsets), np.asarray(arr.targets), ids)
    for name in names[1:]:
        res[f"{name}_minus_a"] = L.paired_bootstrap(preds[name], preds["a"], counts, flat)
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=float)
    for name in names:
        print(name, json.dumps(res[name + "_result"], default=float))
    for name in names[1:]:
        print(f"{name} - a", res[f"{name}_minus_a"])


if __name__ == "__main__":
    main(sys.argv[1:])
