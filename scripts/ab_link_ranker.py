"""One trained link run ranked twice on the same seeds: the ranker's pair counts off and on (`link.pair_counts`).

    python scripts/ab_link_ranker.py RUN STORE TASK SPLIT OUT.json [--gbdt]

Each arm calibrates its own ranker (`LinkRanker.calibrate`) and ranks every seed of SPLIT; `--gbdt` also fits
LightGBM's ranker once (beside the "on" arm). Prints and writes both arms' MAP@k, what calibration chose, the paired
interval of each against the best baseline (and LightGBM), and "on" minus "off" paired over the seeds.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import numpy as np

from confluence.evaluation.links import evaluate_link_splits
from confluence.inference.predictor import load_model
from confluence.store import Store
from confluence.targets import link as L


def main(argv: list[str]) -> None:
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 5:
        raise SystemExit(__doc__)
    run, db, task, split, out = args
    gbdt = "--gbdt" in argv
    store = Store.open(db)
    on = load_model(run)
    off = replace(on, config=replace(on.config, link=replace(on.config.link, pair_counts=False)))
    res: dict = {}
    preds: dict = {}
    ids = np.zeros(0, np.int64)
    for name, loaded in (("off", off), ("on", on)):
        ans = evaluate_link_splits(loaded, store, splits=(split,), tasks=[task], max_seeds=None,
                                   gbdt=gbdt and name == "on")
        entry, ranked = ans.results[split][task], ans.rankings[split][task]
        preds[name], ids = ranked["model"], ranked["seed_ids"]
        res[name] = {"model": entry["model"]["map"], "baseline": entry["baseline"], "ranker": entry["info"]["ranker"],
                     "model_vs_baseline": entry["model_vs_baseline"], "model_vs_gbdt": entry.get("model_vs_gbdt"),
                     "gbdt": entry.get("gbdt", {}).get("map")}
    arr = store.link_arrays(task)
    counts, flat = L.truth_sets(np.asarray(arr.offsets), np.asarray(arr.targets), ids)
    res["on_minus_off"] = L.paired_bootstrap(preds["on"], preds["off"], counts, flat)
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=float)
    for name in ("off", "on"):
        print(name, json.dumps(res[name], default=float))
    print("on - off", res["on_minus_off"])


if __name__ == "__main__":
    main(sys.argv[1:])
