"""Link tasks scored on a split: the ranking baselines (global popularity, recent popularity, the anchor's own past
targets filled by popularity) and optionally the LightGBM ranker (`evaluation.link_gbdt`) with MAP@k, precision,
recall and NDCG, the best baseline named, and paired intervals between any two rankers (`confluence.targets.link`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from confluence.errors import ConfluenceError
from confluence.sampler.links import link_split_ids
from confluence.sampler.splits import subsample
from confluence.store import Store
from confluence.targets import link as L

BASELINES = ("popularity", "recent_popularity", "past_targets")


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
    return {"popularity": pop, "recent_popularity": recent, "past_targets": past}


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


# -- the model ----------------------------------------------------------------------------------------------------
POPULAR_PRIOR = 100  # the rows of the fallback list (past targets, then the most linked) that can enter a model's


@functools.partial(jax.jit, static_argnames=("num_rows",))
def _link_probabilities(model: Any, inputs: dict[str, jax.Array], col_tab: jax.Array, cat_tab: jax.Array,
                        num_rows: int) -> jax.Array:
    return jax.nn.sigmoid(model.link_scores(inputs, col_tab, cat_tab, num_rows))


class LinkRanker:
    """A checkpoint with a link head bound to one store's link task: each seed's ranked target rows.

    A seed's candidates are the rows of the target table in its context, which the model gives a probability of a
    link, and the rows of the baselines' lists (the anchor's own targets known at the observation time, the most
    linked rows, the most linked of the last horizon), each with its place. A logistic regression fitted on the
    latest train seeds (`calibrate`) turns them into one chance of a link, and the k likeliest are the answer: a
    target the anchor linked long ago, or a row the context never reached, can still be answered, and where the
    model knows little the best baseline's list stands."""

    def __init__(self, loaded: Any, store: Store, task: str):
        from confluence.model.inputs import DbTables, fitted_max_k
        from confluence.sampler.links import LinkSource

        if loaded.model.link is None:
            raise ConfluenceError(f"checkpoint {loaded.path} has no link head: train it on a link task first "
                                  "(confluence train-links)")
        self.loaded, self.store, self.task = loaded, store, task
        self.info = store.link_task(task)
        self.source = LinkSource(store, task, loaded.config)
        tables = DbTables.for_model(store, fitted_max_k(loaded.config.loss.max_k, [store]), loaded.config.model)
        self.col_tab, self.cat_tab = jnp.asarray(tables.column_embeddings), jnp.asarray(tables.categorical_embeddings)
        self.combiner: Any = None  # fitted by `calibrate`

    def close(self) -> None:
        self.source.close()

    def contexts(self, seed_ids: np.ndarray, scores: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per seed: the target rows its context holds and (with `scores`) the model's probability of each."""
        from confluence.training.links import link_inputs

        out: list[tuple[np.ndarray, np.ndarray]] = []
        bs = self.source.batch_size
        for lo in range(0, len(seed_ids), bs):
            ids = np.asarray(seed_ids[lo:lo + bs], dtype=np.int64)
            batch = self.source.batch(ids)
            p = None
            if scores:
                inputs = link_inputs(batch)
                p = np.asarray(_link_probabilities(self.loaded.model, inputs, self.col_tab, self.cat_tab,
                                                   batch.candidates.shape[1]))
            for i in range(len(ids)):
                cand = batch.candidates[i]
                out.append((batch.rows[i][cand], p[i][cand] if p is not None else np.zeros(int(cand.sum()))))
        return out

    def popular(self, seed_ids: np.ndarray) -> np.ndarray:
        """[n, 3, POPULAR_PRIOR]: the baselines' lists of each seed, from links known at its observation time: its
        anchor's own earlier targets (then the most linked rows), the most linked rows, the most linked in the
        last horizon."""
        arr = self.store.link_arrays(self.task)
        table = self.store.table(self.info.target_table)
        args = (np.asarray(arr.anchor_row), np.asarray(arr.obs_time), np.asarray(arr.offsets),
                np.asarray(arr.targets), self.info.horizon_us)
        catalog = (table.row_offset, table.row_offset + table.num_rows)
        pop = L.popularity(*args, catalog, seed_ids, POPULAR_PRIOR)
        recent = L.popularity(*args, catalog, seed_ids, POPULAR_PRIOR, window_us=self.info.horizon_us)
        return np.stack([L.past_targets(*args, seed_ids, POPULAR_PRIOR, fill=pop), pop, recent], axis=1)

    def features(self, rows: np.ndarray, p: np.ndarray, lists: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One seed's candidates (its context's target rows and the rows of its baselines' `lists`, each row once,
        ascending) and their features: the model's logit and whether the context holds the row; per list,
        log(1 + place) and whether the list holds it."""
        lists = [lst[lst >= 0] for lst in lists]
        cand = np.unique(np.concatenate([rows, *lists]))
        in_ctx = np.isin(cand, rows)
        logit = np.zeros(len(cand))
        q = np.clip(p.astype(np.float64), 1e-6, 1 - 1e-6)
        logit[in_ctx] = (np.log(q) - np.log1p(-q))[_positions(rows, cand[in_ctx])]
        cols = [logit, in_ctx]
        for lst in lists:
            inside = np.isin(cand, lst)
            place = np.zeros(len(cand))
            place[inside] = np.log1p(_positions(lst, cand[inside]))
            cols += [place, inside]
        return cand, np.stack(cols, axis=1).astype(np.float64)

    def calibrate(self, n: int | None = None) -> np.ndarray:
        """Fit how the model's probability and the fallback list's place combine into the chance of a link (a
        logistic regression over every candidate of the train seeds the head did not train on,
        `train_and_calibration_ids`; at most `n` of them, the latest); returns its coefficients."""
        from sklearn.linear_model import LogisticRegression

        from confluence.sampler.links import train_and_calibration_ids

        arr = self.store.link_arrays(self.task)
        _, ids = train_and_calibration_ids(self.store, self.task)
        if n is not None:
            ids = ids[np.argsort(np.asarray(arr.obs_time)[ids], kind="stable")[-n:]]
        if len(ids) == 0:
            raise ConfluenceError(f"link task {self.task!r}: no train seed after the ones the head trained on "
                                  "to calibrate the ranker on (it needs several observation times)")
        ids = np.sort(ids)
        ctx = self.contexts(ids)
        fallback = self.popular(ids)
        xs, ys = [], []
        for i, s in enumerate(ids):
            cand, x = self.features(*ctx[i], fallback[i])
            xs.append(x)
            ys.append(np.isin(cand, arr.targets[arr.offsets[s]:arr.offsets[s + 1]]))
        x, y = np.concatenate(xs), np.concatenate(ys)
        if y.all() or not y.any():
            raise ConfluenceError(f"link task {self.task!r}: the latest train seeds' candidates are all "
                                  f"{'links' if y.any() else 'non-links'}; nothing to calibrate on")
        self.combiner = LogisticRegression(C=1.0, max_iter=1000).fit(x, y)
        return np.concatenate([self.combiner.intercept_, self.combiner.coef_[0]])

    def rank(self, seed_ids: np.ndarray, k: int | None = None) -> np.ndarray:
        """[n, k] target rows, most probable first (-1 pads); `calibrate` first."""
        if self.combiner is None:
            raise ConfluenceError("LinkRanker.rank needs calibrate() first")
        k = k or self.info.k
        seed_ids = np.asarray(seed_ids, dtype=np.int64)
        ctx = self.contexts(seed_ids)
        fallback = self.popular(seed_ids)
        out = np.full((len(seed_ids), k), -1, dtype=np.int64)
        for i in range(len(seed_ids)):
            cand, x = self.features(*ctx[i], fallback[i])
            order = np.lexsort((cand, -self.combiner.decision_function(x)))[:k]
            out[i, :len(order)] = cand[order]
        return out


def _positions(rows: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The index in `rows` (distinct values) of each of `wanted` (all present)."""
    order = np.argsort(rows, kind="stable")
    return order[np.searchsorted(rows[order], wanted)]


def evaluate_links(loaded: Any, db: str | Store, *, tasks: Sequence[str] | None = None, split: str = "test",
                   max_seeds: int | None = 5000, gbdt: bool = False, progress: Any = None
                   ) -> dict[str, dict[str, Any]]:
    """The model beside the baselines on each link task (default: those of the store the checkpoint was trained
    on, else all): `run_link_baselines`' entry plus "model" (metrics), "model_vs_baseline" (the paired MAP@k
    interval against the best baseline) and, with `gbdt`, the LightGBM ranker and "model_vs_gbdt"."""
    store = db if isinstance(db, Store) else Store.open(db)
    trained = [t.split("/", 1)[1] for t in loaded.trained_tasks if t.startswith(f"{store.name}/")]
    if tasks is None:
        tasks = [t.name for t in store.link_tasks if t.name in trained] or None
    ranked_by: dict[str, dict[str, np.ndarray]] = {}
    out = run_link_baselines(store, tasks=tasks, split=split, max_seeds=max_seeds, gbdt=gbdt, progress=progress,
                             rankings=ranked_by)
    for task, entry in out.items():
        if "baseline" not in entry:
            continue
        arr = store.link_arrays(task)
        eval_ids = subsample(link_split_ids(store, task, split), max_seeds)
        counts, flat = L.truth_sets(np.asarray(arr.offsets), np.asarray(arr.targets), eval_ids)
        ranker = LinkRanker(loaded, store, task)
        try:
            ranker.calibrate()
            pred = ranker.rank(eval_ids)
        finally:
            ranker.close()
        best = ranked_by[task][entry["baseline"]["name"]]
        entry["model"] = L.metrics(pred, counts, flat)
        entry["model_vs_baseline"] = {**L.paired_bootstrap(pred, best, counts, flat),
                                      "baseline": entry["baseline"]["name"]}
        if "gbdt" in ranked_by[task]:
            entry["model_vs_gbdt"] = L.paired_bootstrap(pred, ranked_by[task]["gbdt"], counts, flat)
    return out
