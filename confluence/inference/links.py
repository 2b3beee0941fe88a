"""Ranking the target rows of a link task with a trained link head: "which rows of that table will this anchor link
to within the horizon?" answered as the k likeliest rows, for the task's seeds (evaluation) or any anchor at any
observation time (prediction, serving).

A question's candidates come from three places: the target rows its context reaches, scored by the head inside the
context; every row of the target table, scored by the head against the row's own context at the observation time
(the catalogue side, `LinkConfig.catalogue`: an exact top-k over the whole table, `targets.link.top_k`); and the
baselines' lists (the anchor's own earlier targets, the most linked rows, the most linked of the last horizon, the
rows other anchors linked to along with the anchor's own targets).
A logistic regression fitted on the latest train seeds, which the head never trained on (`calibrate`), turns each
candidate's scores, places and pair counts (how often and how lately the anchor linked to it, how often every anchor
did: `link.pair_counts`) into one chance of a link; the k likeliest are the answer. Where mixing the model's
scores in does not rank better on those seeds (cross-validated), the best baseline's list stands alone.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from confluence.errors import ConfluenceError
from confluence.sampler.links import catalogue_time
from confluence.store import Store
from confluence.targets import link as L

POPULAR_PRIOR = 100  # the length of each baseline list whose rows can enter a question's candidates
LIST_NAMES = ("past_targets", "popularity", "recent_popularity", "co_linked")  # the order of `lists`
KEPT_TIMES = 16  # the catalogue's keys are kept for this many observation times (the latest used)


@functools.partial(jax.jit, static_argnames=("num_rows",))
def _question_scores(model: Any, inputs: dict[str, jax.Array], col_tab: jax.Array, cat_tab: jax.Array,
                     num_rows: int) -> tuple[jax.Array, jax.Array]:
    """In-context link probabilities [B, num_rows] and the questions as the catalogue reads them [B, D]."""
    question, rows = model.link_states(inputs, col_tab, cat_tab, num_rows)
    return jax.nn.sigmoid(model.link(question, rows)), model.link.queries(question)


@jax.jit
def _catalogue_keys(model: Any, inputs: dict[str, jax.Array], col_tab: jax.Array, cat_tab: jax.Array) -> jax.Array:
    return model.catalogue_keys(inputs, col_tab, cat_tab)


class LinkRanker:
    """A checkpoint with a link head bound to one store's link task (module doc)."""

    def __init__(self, loaded: Any, store: Store, task: str):
        from confluence.model.inputs import DbTables, fitted_max_k
        from confluence.sampler.links import LinkSource

        if loaded.model.link is None:
            raise ConfluenceError(f"checkpoint {loaded.path} has no link head: train it on a link task first "
                                  "(confluence train-links)")
        self.loaded, self.store, self.task = loaded, store, task
        self.info = store.link_task(task)
        self.arr = store.link_arrays(task)
        self.catalogue_on = bool(loaded.config.link.catalogue)
        self.shortlist = int(loaded.config.link.shortlist)
        self.pair_counts = bool(loaded.config.link.pair_counts)
        self.forecast_windows = int(loaded.config.link.forecast_windows)
        self._forecasts: dict[int, np.ndarray] = {}  # cutoff -> every target row's forecast links
        self.source = LinkSource(store, task, loaded.config)
        tables = DbTables.for_model(store, fitted_max_k(loaded.config.loss.max_k, [store]), loaded.config.model)
        self.col_tab, self.cat_tab = jnp.asarray(tables.column_embeddings), jnp.asarray(tables.categorical_embeddings)
        self._keys: OrderedDict[int, np.ndarray] = OrderedDict()  # observation time -> the catalogue's keys [N, D]
        self.combiner: Any = None  # fitted by `calibrate`
        self.selection: dict[str, Any] = {}  # what `calibrate` chose and why

    def close(self) -> None:
        self.source.close()

    # -- the model's scores -----------------------------------------------------------------------------------
    def catalogue_keys(self, time: int) -> np.ndarray:
        """[N, D]: every row of the target table (in row order) read from its own context at observation time
        `time`, as the head's keys; kept for the `KEPT_TIMES` latest used times (a service asked at ever new times
        keeps a bounded number of copies)."""
        t = int(time)
        if t in self._keys:
            self._keys.move_to_end(t)
        else:
            from confluence.model.inputs import batch_to_inputs

            first, end = self.source.catalog
            rows = np.arange(first, end, dtype=np.int64)
            bs = self.source.item_batch_size
            parts = []
            for lo in range(0, len(rows), bs):
                chunk = rows[lo:lo + bs]
                inputs = batch_to_inputs(self.source.item_batch(chunk, np.full(len(chunk), t)).batch)
                keys = _catalogue_keys(self.loaded.model, inputs, self.col_tab, self.cat_tab)
                parts.append(np.asarray(keys)[:len(chunk)])
            self._keys[t] = np.concatenate(parts) if parts else np.zeros((0, 1), np.float32)
            while len(self._keys) > KEPT_TIMES:
                self._keys.popitem(last=False)
        return self._keys[t]

    def contexts(self, anchors: np.ndarray, times: np.ndarray
                 ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
        """Per question (anchor row, observation time): the target rows its context holds with the model's
        probability of each; and the questions as the catalogue reads them [n, D]."""
        from confluence.training.links import link_inputs

        out: list[tuple[np.ndarray, np.ndarray]] = []
        queries = []
        bs = self.source.batch_size
        for lo in range(0, len(anchors), bs):
            batch = self.source.anchor_batch(anchors[lo:lo + bs], times[lo:lo + bs])
            n = min(bs, len(anchors) - lo)
            p, q = _question_scores(self.loaded.model, link_inputs(batch), self.col_tab, self.cat_tab,
                                    batch.candidates.shape[1])
            p, q = np.asarray(p), np.asarray(q)
            for i in range(n):
                cand = batch.candidates[i]
                out.append((batch.rows[i][cand], p[i][cand]))
            queries.append(q[:n])
        d = self.loaded.config.model.d_model
        return out, (np.concatenate(queries) if queries else np.zeros((0, d), np.float32))

    def lists(self, anchors: np.ndarray, times: np.ndarray) -> np.ndarray:
        """[n, 4, POPULAR_PRIOR]: the baselines' lists of each question from links known at its observation time:
        its anchor's own earlier targets (then the most linked rows), the most linked rows, the most linked in the
        last horizon, the rows co-linked with its anchor's targets (then the most linked)."""
        a = self.arr
        common = (np.asarray(a.obs_time), np.asarray(a.offsets), np.asarray(a.targets), self.info.horizon_us)
        pop = L.popularity_at(*common, self.source.catalog, times, POPULAR_PRIOR)
        recent = L.popularity_at(*common, self.source.catalog, times, POPULAR_PRIOR, window_us=self.info.horizon_us)
        past = L.past_targets_at(np.asarray(a.anchor_row), *common, anchors, times, POPULAR_PRIOR, fill=pop)
        co = L.co_linked_at(np.asarray(a.anchor_row), *common, self.source.catalog, anchors, times, POPULAR_PRIOR,
                            fill=pop)
        return np.stack([past, pop, recent, co], axis=1)

    catalogue_time = staticmethod(catalogue_time)

    def shortlists(self, queries: np.ndarray, times: np.ndarray) -> np.ndarray:
        """[n, link.shortlist]: each question's best rows of the whole target table by the catalogue side (global
        rows, exact: `targets.link.top_k`; -1 pads a smaller table); empty without the catalogue side."""
        out = np.full((len(times), self.shortlist if self.catalogue_on else 0), -1, dtype=np.int64)
        if not self.catalogue_on:
            return out
        day = self.catalogue_time(times)
        for t in np.unique(day):
            at = np.flatnonzero(day == t)
            idx, _ = L.top_k(queries[at], self.catalogue_keys(int(t)), self.shortlist)
            out[at] = np.where(idx >= 0, idx + self.source.catalog[0], -1)
        return out

    def features(self, rows: np.ndarray, p: np.ndarray, lists: np.ndarray, query: np.ndarray | None = None,
                 time: int | None = None, short: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One question's candidates (its context's target rows, the catalogue's best `link.shortlist` rows and the
        rows of its baselines' `lists`, each once, ascending) and their features: the in-context logit and whether
        the context holds the row; the catalogue logit, log(1 + place) in the catalogue's list and whether it holds
        the row; per baseline list, log(1 + place) and whether it holds the row."""
        lists = [lst[lst >= 0] for lst in lists]
        first = self.source.catalog[0]
        if self.catalogue_on:
            keys = self.catalogue_keys(int(self.catalogue_time(np.array([time]))[0]))
            short = np.asarray(short)[np.asarray(short) >= 0]
        else:
            short = np.zeros(0, np.int64)
        cand = np.unique(np.concatenate([rows, short, *lists]))
        in_ctx = np.isin(cand, rows)
        logit = np.zeros(len(cand))
        q = np.clip(p.astype(np.float64), 1e-6, 1 - 1e-6)
        logit[in_ctx] = (np.log(q) - np.log1p(-q))[_positions(rows, cand[in_ctx])]
        cols = [logit, in_ctx]
        if self.catalogue_on:
            own = float(self.loaded.model.link.own_offset)
            cols.append(keys[cand - first].astype(np.float64) @ query.astype(np.float64) + own)
            lists = [short, *lists]
        for lst in lists:
            inside = np.isin(cand, lst)
            place = np.zeros(len(cand))
            place[inside] = np.log1p(_positions(lst, cand[inside]))
            cols += [place, inside]
        return cand, np.stack(cols, axis=1).astype(np.float64)

    def _candidates(self, anchors: np.ndarray, times: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        ctx, queries = self.contexts(anchors, times)
        fallback = self.lists(anchors, times)
        short = self.shortlists(queries, times)
        found = [self.features(*ctx[i], fallback[i], queries[i], int(times[i]), short[i]) for i in range(len(anchors))]
        return self.with_pair_counts(found, anchors, times) if self.pair_counts else found

    def with_pair_counts(self, found: list[tuple[np.ndarray, np.ndarray]], anchors: np.ndarray, times: np.ndarray
                         ) -> list[tuple[np.ndarray, np.ndarray]]:
        """`features`' candidates with more columns: log(1 + the anchor's known links to the row), how lately it
        linked to it (`targets.link.pair_counts_at`), log(1 + the row's known links), log(1 + those of the last
        horizon) and, with `link.forecast_windows`, log(1 + those expected in the coming one): how much and how
        lately, where the lists give only a place."""
        a = self.arr
        if len(self._forecasts) > KEPT_TIMES:
            self._forecasts.clear()
        counts = L.pair_counts_at(np.asarray(a.anchor_row), np.asarray(a.obs_time), np.asarray(a.offsets),
                                  np.asarray(a.targets), self.info.horizon_us, self.source.catalog, anchors, times,
                                  [cand for cand, _ in found], forecast_windows=self.forecast_windows,
                                  forecasts=self._forecasts)
        out = []
        for (cand, x), c in zip(found, counts, strict=True):
            extra = np.log1p(c)
            extra[:, 1] = c[:, 1]  # the recency is already in (0, 1]
            out.append((cand, np.concatenate([x, extra], axis=1)))
        return out

    # -- calibration and ranking ------------------------------------------------------------------------------
    def feature_groups(self) -> dict[str, list[int]]:
        """The columns of the candidates' features that each way of ranking reads: "model" all of them (with the
        pair counts, `with_pair_counts`, last); each baseline list (`LIST_NAMES`) its own place and membership."""
        first = 3 if self.catalogue_on else 2
        lists = (["catalogue"] if self.catalogue_on else []) + list(LIST_NAMES)
        width = first + 2 * len(lists) + (len(L.pair_count_names(self.forecast_windows)) if self.pair_counts else 0)
        out = {"model": list(range(width))}
        for j, name in enumerate(lists):
            if name != "catalogue":
                out[name] = [first + 2 * j, first + 2 * j + 1]
        return out

    def calibrate(self, n: int | None = None, folds: int = 3) -> np.ndarray:
        """Fit how the candidates' features combine into the chance of a link: a logistic regression over every
        candidate of the train seeds the head did not train on (`train_and_calibration_ids`; at most `n` of them,
        the latest). Which features it reads is chosen on those seeds by `folds`-fold cross-validated MAP@k: all of
        them (the model's scores and the lists), or one baseline list's alone where no mix ranks better on seeds
        it was not fitted on (the model then answers that list's order, with calibrated chances). The choice and
        the cross-validated MAP@k of each way are in `self.selection`. Returns the coefficients over all features
        (zero for the ones not read), intercept first."""
        from sklearn.linear_model import LogisticRegression

        from confluence.sampler.links import train_and_calibration_ids

        arr = self.arr
        _, ids = train_and_calibration_ids(self.store, self.task)
        if n is not None:
            ids = ids[np.argsort(np.asarray(arr.obs_time)[ids], kind="stable")[-n:]]
        if len(ids) == 0:
            raise ConfluenceError(f"link task {self.task!r}: no train seed after the ones the head trained on "
                                  "to calibrate the ranker on (it needs several observation times)")
        ids = np.sort(ids)
        found = self._candidates(np.asarray(arr.anchor_row)[ids], np.asarray(arr.obs_time)[ids])
        ys = [np.isin(cand, arr.targets[arr.offsets[s]:arr.offsets[s + 1]]) for (cand, _), s in zip(found, ids,
                                                                                                     strict=True)]
        y = np.concatenate(ys)
        if y.all() or not y.any():
            raise ConfluenceError(f"link task {self.task!r}: the latest train seeds' candidates are all "
                                  f"{'links' if y.any() else 'non-links'}; nothing to calibrate on")
        counts, flat = L.truth_sets(np.asarray(arr.offsets), np.asarray(arr.targets), ids)
        fold = np.arange(len(ids)) % max(1, min(folds, len(ids)))
        scores: dict[str, float] = {}
        for name, cols in self.feature_groups().items():
            pred = np.full((len(ids), self.info.k), -1, dtype=np.int64)
            for f in np.unique(fold):
                fit = np.flatnonzero(fold != f) if len(np.unique(fold)) > 1 else np.flatnonzero(fold == f)
                yf = np.concatenate([ys[i] for i in fit])
                if yf.all() or not yf.any():
                    continue
                lr = LogisticRegression(C=1.0, max_iter=1000).fit(
                    np.concatenate([found[i][1][:, cols] for i in fit]), yf)
                for i in np.flatnonzero(fold == f):
                    cand, x = found[i]
                    order = np.lexsort((cand, -lr.decision_function(x[:, cols])))[:self.info.k]
                    pred[i, :len(order)] = cand[order]
            scores[name] = L.metrics(pred, counts, flat)["map"]
        choice = max(scores, key=lambda name: (scores[name], name == "model"))  # ties: the model
        cols = self.feature_groups()[choice]
        lr = LogisticRegression(C=1.0, max_iter=1000).fit(np.concatenate([x[:, cols] for _, x in found]), y)
        self.combiner = _Combiner(lr, cols)
        self.selection = {"choice": choice, "calibration_map": scores, "n_seeds": len(ids)}
        coef = np.zeros(len(self.feature_groups()["model"]))
        coef[cols] = lr.coef_[0]
        return np.concatenate([lr.intercept_, coef])

    def rank_at(self, anchors: np.ndarray, times: np.ndarray, k: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """For any anchor rows (global) at observation times: [n, k] target rows, likeliest first (-1 pads), and
        [n, k] their chances of a link (NaN pads); `calibrate` first."""
        if self.combiner is None:
            raise ConfluenceError("LinkRanker.rank needs calibrate() first")
        k = k or self.info.k
        anchors, times = np.asarray(anchors, dtype=np.int64), np.asarray(times, dtype=np.int64)
        rows = np.full((len(anchors), k), -1, dtype=np.int64)
        chance = np.full((len(anchors), k), np.nan)
        for i, (cand, x) in enumerate(self._candidates(anchors, times)):
            z = self.combiner.decision_function(x)
            order = np.lexsort((cand, -z))[:k]
            rows[i, :len(order)] = cand[order]
            chance[i, :len(order)] = 1.0 / (1.0 + np.exp(-z[order]))
        return rows, chance

    def rank(self, seed_ids: np.ndarray, k: int | None = None) -> np.ndarray:
        """[n, k] target rows of the task's seeds `seed_ids`, likeliest first (-1 pads); `calibrate` first."""
        seed_ids = np.asarray(seed_ids, dtype=np.int64)
        return self.rank_at(np.asarray(self.arr.anchor_row)[seed_ids], np.asarray(self.arr.obs_time)[seed_ids],
                            k)[0]


class _Combiner:
    """A fitted logistic regression over some columns of the candidates' features."""

    def __init__(self, model: Any, cols: list[int]):
        self.model, self.cols = model, cols

    def decision_function(self, x: np.ndarray) -> np.ndarray:
        return self.model.decision_function(x[:, self.cols])


def _positions(rows: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The index in `rows` (distinct values) of each of `wanted` (all present)."""
    order = np.argsort(rows, kind="stable")
    return order[np.searchsorted(rows[order], wanted)]
