"""Link tasks scored on a split: the ranking baselines (global popularity, recent popularity, the anchor's own past
targets filled by popularity, the targets co-linked with them by other anchors) and optionally the LightGBM ranker (`evaluation.link_gbdt`) with MAP@k, precision,
recall and NDCG, the best baseline named, and paired intervals between any two rankers (`confluence.targets.link`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from confluence.errors import ConfluenceError
from confluence.sampler.links import link_split_ids
from confluence.sampler.splits import subsample
from confluence.store import Store
from confluence.targets import link as L

BASELINES = ("popularity", "recent_popularity", "past_targets", "co_linked")


def baseline_rankings(store: Store, task: str, eval_ids: np.ndarray, k: int | None = None) -> dict[str, np.ndarray]:
    """Each baseline's [n, k] ranked target rows for seeds `eval_ids`, by name (`BASELINES`)."""
    info, arr = store.link_task(task), store.link_arrays(task)
    k = k or info.k
    table = store.table(info.target_table)
    catalog = (table.row_offset, table.row_offset + table.num_rows)
    args = (np.asarray(arr.anchor_row), np.asarray(arr.obs_time), np.asarray(arr.offsets), np.asarray(arr.targets),
            info.horizon_us)
    pop = L.popularity(*args, catalog, eval_ids, k)
    recent = L.popularity(*args, catalog, eval_ids, k, window_us=info.horizon_us)
    past = L.past_targets(*args, eval_ids, k, fill=pop)
    ids = np.asarray(eval_ids, dtype=np.int64)
    co = L.co_linked_at(*args, catalog, args[0][ids], args[1][ids], k, fill=pop)
    return {"popularity": pop, "recent_popularity": recent, "past_targets": past, "co_linked": co}


def run_link_baselines(db: str | Store, *, tasks: Sequence[str] | None = None, split: str = "test",
                       max_seeds: int | None = 5000, gbdt: bool = False, max_train: int = 50_000,
                       progress: Any = None, rankings: dict[str, dict[str, np.ndarray]] | None = None
                       ) -> dict[str, dict[str, Any]]:
    """`{task: {<baseline>: metrics, "baseline": best by MAP@k with its name, "info": ...}}` for the link tasks
    (`tasks`: some of them; default all) on `split`, at most `max_seeds` seeds (a fixed draw). `gbdt`: also the
    LightGBM ranker (`evaluation.link_gbdt`) trained on at most `max_train` train seeds, as "gbdt", with
    "gbdt_vs_best_baseline" (its MAP@k minus the best baseline's, a paired bootstrap interval over the seeds).
    `progress`: a `confluence.toolkit.progress.Reporter` for the ranker's stages. `rankings`: a dict that receives
    each task's ranked rows by ranker name (for paired intervals against another ranker)."""
    store = db if isinstance(db, Store) else Store.open(db)
    builder = None
    known = [t.name for t in store.link_tasks]
    names = known if tasks is None else list(tasks)
    if unknown := [t for t in names if t not in known]:
        raise ConfluenceError(f"link task(s) {unknown} not in store {store.name!r} (link tasks: "
                              f"{', '.join(known) or 'none'})")
    out: dict[str, dict[str, Any]] = {}
    for task in names:
        info, arr = store.link_task(task), store.link_arrays(task)
        eval_ids = subsample(link_split_ids(store, task, split), max_seeds)
        meta = {"kind": "link", "split": split, "k": info.k, "target_table": info.target_table,
                "n_eval": int(len(eval_ids))}
        if len(eval_ids) == 0:
            out[task] = {"info": {**meta, "note": f"no {split} seeds"}}
            continue
        counts, flat = L.truth_sets(np.asarray(arr.offsets), np.asarray(arr.targets), eval_ids)
        ranked = baseline_rankings(store, task, eval_ids, info.k)
        entry: dict[str, Any] = {name: L.metrics(pred, counts, flat) for name, pred in ranked.items()}
        best = max(BASELINES, key=lambda n: entry[n]["map"])
        entry["baseline"] = {**entry[best], "name": best}
        train_ids = link_split_ids(store, task, "train")
        if gbdt and len(train_ids):
            from confluence.evaluation.gbdt import FeatureBuilder
            from confluence.evaluation.link_gbdt import fit_link_gbdt

            builder = builder or FeatureBuilder(store, progress=progress)
            try:
                res = fit_link_gbdt(store, task, train_ids, eval_ids, builder=builder, max_train=max_train,
                                    progress=progress)
            except ConfluenceError as exc:  # no train seed to learn from: the baselines still stand
                meta["note"] = str(exc)
            else:
                entry["gbdt"] = L.metrics(res.predictions, counts, flat)
                ranked["gbdt"] = res.predictions
                entry["gbdt_vs_best_baseline"] = {
                    **L.paired_bootstrap(res.predictions, ranked[best], counts, flat), "baseline": best}
                meta["gbdt"] = {"n_train_seeds": res.num_train_seeds, "n_train_pairs": res.num_train_pairs,
                                "candidate_recall": res.recall_of_candidates}
        elif gbdt:
            meta["note"] = "no train seeds: no LightGBM ranker"
        entry["info"] = meta
        out[task] = entry
        if rankings is not None:
            rankings[task] = ranked
    return out


def evaluate_links(loaded: Any, db: str | Store, *, tasks: Sequence[str] | None = None, split: str = "test",
                   max_seeds: int | None = 5000, gbdt: bool = False, progress: Any = None
                   ) -> dict[str, dict[str, Any]]:
    """The model beside the baselines on each link task (default: those of the store the checkpoint was trained
    on, else all): `run_link_baselines`' entry plus "model" (metrics), "model_vs_baseline" (the paired MAP@k
    interval against the best baseline) and, with `gbdt`, the LightGBM ranker and "model_vs_gbdt"."""
    return evaluate_link_splits(loaded, db, splits=(split,), tasks=tasks, max_seeds=max_seeds, gbdt=gbdt,
                                progress=progress).results[split]


@dataclass
class LinkSplits:
    """`evaluate_link_splits`' answer: per split, `results` (as `evaluate_links`) and `rankings`, per task the
    ranked target rows ([n, k], global rows) by ranker name ("model" and the baselines') and the seeds they rank
    ("seed_ids")."""

    results: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    rankings: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)


def evaluate_link_splits(loaded: Any, db: str | Store, *, splits: Sequence[str], tasks: Sequence[str] | None = None,
                         max_seeds: int | None = 5000, gbdt: bool = False, progress: Any = None) -> LinkSplits:
    """`evaluate_links` on several splits, each task's ranker calibrated once for all of them."""
    from confluence.inference.links import LinkRanker

    store = db if isinstance(db, Store) else Store.open(db)
    trained = [t.split("/", 1)[1] for t in loaded.trained_tasks if t.startswith(f"{store.name}/")]
    if tasks is None:
        tasks = [t.name for t in store.link_tasks if t.name in trained] or None
    answer = LinkSplits()
    rankers: dict[str, Any] = {}
    try:
        for split in splits:
            ranked_by: dict[str, dict[str, np.ndarray]] = {}
            out = run_link_baselines(store, tasks=tasks, split=split, max_seeds=max_seeds, gbdt=gbdt,
                                     progress=progress, rankings=ranked_by)
            for task, entry in out.items():
                if "baseline" not in entry:
                    continue
                arr = store.link_arrays(task)
                eval_ids = subsample(link_split_ids(store, task, split), max_seeds)
                counts, flat = L.truth_sets(np.asarray(arr.offsets), np.asarray(arr.targets), eval_ids)
                if task not in rankers:
                    rankers[task] = LinkRanker(loaded, store, task)
                    rankers[task].calibrate()
                pred = rankers[task].rank(eval_ids)
                best = ranked_by[task][entry["baseline"]["name"]]
                entry["model"] = L.metrics(pred, counts, flat)
                entry["info"]["ranker"] = rankers[task].selection  # what calibration chose, and its MAP@k
                entry["model_vs_baseline"] = {**L.paired_bootstrap(pred, best, counts, flat),
                                              "baseline": entry["baseline"]["name"]}
                if "gbdt" in ranked_by[task]:
                    entry["model_vs_gbdt"] = L.paired_bootstrap(pred, ranked_by[task]["gbdt"], counts, flat)
                ranked_by[task] = {**ranked_by[task], "model": pred, "seed_ids": eval_ids}
            answer.results[split], answer.rankings[split] = out, ranked_by
    finally:
        for ranker in rankers.values():
            ranker.close()
    return answer
