"""What the planted trend task's link counts alone can say: rankers of items that read only each item's weekly
links, scored by MAP@10 against the generated truth (docs/lab/2026-11-30-link-popularity-forecast.md).

    python scripts/planted_trend_counts.py PL/db [val|test]

PL/db is a `confluence synth planted-links --out PL/db --seed N` folder. Prints recent popularity, log-linear Poisson
regressions on the last 2 and 3 weeks (fitted on the train weeks), the boosted Poisson forecast the ranker uses
(`confluence.targets.link_forecast.forecast_popularity`, fitted at each week on the weeks before it only) with 4
windows, and the generator's oracle.
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sklearn.linear_model import PoissonRegressor

from confluence.synth.planted_links import START, WEEK_S, PlantedLinksSpec, split_weeks
from confluence.targets.link_forecast import HISTORY, forecast_popularity


def ap(rank: np.ndarray, truth: set[int], k: int = 10) -> float:
    hits, total = 0, 0.0
    for i, r in enumerate(rank[:k]):
        if int(r) in truth:
            hits += 1
            total += hits / (i + 1)
    return total / min(len(truth), k)


def main(db: str, split: str = "val") -> None:
    spec = PlantedLinksSpec()
    inter = pq.read_table(f"{db}/raw/interactions.parquet")
    inter = inter.filter(pc.equal(inter["channel"], "trend"))
    seconds = (inter["at"].to_numpy() - np.datetime64(START)).astype("timedelta64[s]").astype(np.int64)
    week = seconds // WEEK_S
    items = np.asarray(inter["item_id"]) - 1  # ids 1..items
    counts = np.zeros((spec.weeks, spec.items))
    np.add.at(counts, (week, items), 1.0)
    oracle = pq.read_table(f"{db}/oracle/trend.parquet").to_pylist()
    val0, test0 = split_weeks(spec)
    weeks = range(val0, test0) if split == "val" else range(test0, spec.weeks)
    log = np.log1p

    def score(fn) -> float:
        out = []
        for w in weeks:
            rank = np.lexsort((np.arange(spec.items), -fn(w))) + 1
            out += [ap(rank, set(s["targets"])) for s in oracle if s["week"] == w]
        return float(np.mean(out))

    print("recent popularity", round(score(lambda w: counts[w - 1]), 4))
    for n in (2, 3):
        def feats(w: int, n: int = n) -> np.ndarray:
            return np.stack([log(counts[w - j]) for j in range(1, n + 1)], axis=1)
        train = range(n + 1, val0)
        model = PoissonRegressor(alpha=1e-4, max_iter=1000).fit(np.concatenate([feats(w) for w in train]),
                                                                 np.concatenate([counts[w] for w in train]))
        print(f"log-linear Poisson, {n} weeks", round(score(lambda w, m=model, f=feats: m.predict(f(w))), 4))

    def forecast(w: int) -> np.ndarray:
        n = HISTORY + 4
        buckets = np.stack([counts[w - j] if w - j >= 0 else np.zeros(spec.items) for j in range(1, n + 1)])
        return forecast_popularity(buckets, 4)
    print("boosted Poisson forecast, 4 windows, 16 weeks of history", round(score(forecast), 4))
    print("oracle", round(float(np.mean([ap(np.asarray(s["oracle"]), set(s["targets"]))
                                         for s in oracle if s["week"] in weeks])), 4))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
