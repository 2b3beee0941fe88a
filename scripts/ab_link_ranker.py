"""One trained link run ranked twice on the same seeds, with two values of the ranker's `link` settings.

    python scripts/ab_link_ranker.py RUN STORE TASK SPLIT OUT.json [--gbdt] [--off NAME=VALUE ...] [--on NAME=VALUE ...]

"off" is the run with its `link` settings replaced by the `--off` values (default: `pair_counts=false`), "on" the
run with the `--on` values (default: as saved; VALUE is JSON: `false`, `1`). Each arm calibrates its own ranker
(`LinkRanker.calibrate`) and ranks every seed of SPLIT; `--gbdt` also fits LightGBM's ranker once (beside the "on"
arm). Prints and writes both arms' MAP@k, what calibration chose, the paired interval of each against the best
baseline (and LightGBM), and "on" minus "off" paired over the seeds.
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


def _arm(loaded, settings: dict):
    return replace(loaded, config=replace(loaded.config, link=replace(loaded.config.link, **settings)))


def main(argv: list[str]) -> None:
    args, sets, gbdt = [], {"--off": {}, "--on": {}}, False
    it = iter(argv)
    for a in it:
        if a in sets:
            name, _, value = next(it).partition("=")
            sets[a][name] = json.loads(value)
        elif a == "--gbdt":
            gbdt = True
        else:
            args.append(a)
    if len(args) != 5:
        raise SystemExit(__doc__)
    run, db, task, split, out = args
    store = Store.open(db)
    saved = load_model(run)
    off = _arm(saved, sets["--off"] or {"pair_counts": False})
    on = _arm(saved, sets["--on"])
    res: dict = {"off_settings": sets["--off"] or {"pair_counts": False}, "on_settings": sets["--on"]}
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
