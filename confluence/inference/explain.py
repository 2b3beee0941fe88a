"""Why this prediction: which context rows and cells moved it, and by how much (`predict --explain`,
`POST /explain`).

The method is occlusion on the model's own inputs, exact rather than approximated: a row's effect is the
prediction minus the prediction with that row's values replaced by values its columns hold in other contexts (the
mean over `SAMPLES` replacements, drawn from the contexts of the task's train seeds; a text cell is made NULL). The
row stays where it is, with its keys, so what is measured is what its values told the model, not that it was
there. A cell's effect is the same for one cell. Each costs one model call per replacement, batched as
predictions are. With several context draws per prediction (`--draws`), a row is replaced in every draw whose
context holds it and the draws are combined as the prediction combines them, so the effects are changes of the
answer `predict` gives. Two other meanings of "without the row" are settings (`how`): "remove" takes its cells
out of the context (padding), "null" makes them NULL; on planted-signal databases replacement ranked the planted
row first most often (docs/design/decisions.md, "Explanations").

The explained number is the target kind's (`TargetKind.explained`): a number in the target's units, the log-odds
of the predicted class (or of true), or a time in days. Effects do not add up to the prediction (rows interact);
their signs and sizes say what the answer leaned on. Labelled context rows (earlier answers of the same task that
the context shows) are rows like the others, with the role "label" and the answer they showed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from confluence.batch import SEQ_FIELDS, TrainingBatch
from confluence.errors import ConfluenceError
from confluence.inference.draws import combine_draws
from confluence.inference.predictor import HeadOutputs, Predictor
from confluence.sampler.builder import BuildResult
from confluence.sampler.show import CellDecoder, cell_value
from confluence.sampler.splits import subsample
from confluence.store.format import NO_CUTOFF, NULL_TIME, STATIC_TIME
from confluence.stypes import SemanticType
from confluence.targets import kind

ROLES = {0: "anchor", 1: "parent", 2: "child", 3: "label"}  # how the sampler reached a row (`BuildResult.via`)
DEFAULT_TOP = 8  # rows listed per explanation
DEFAULT_CELL_ROWS = 3  # rows (the most effective) whose cells are explained one by one
CELLS_SHOWN = 4  # cells per row `Explanation.text` prints (all are kept)

Key = tuple[str, int]  # ("row", global row) or ("label", seed of the task): a row the same in every draw


@dataclass
class CellEffect:
    """One cell of a row: its column (`table.column`), its value as the data holds it, its effect."""

    column: str
    value: str
    effect: float


@dataclass
class RowEffect:
    """One context row: where it is (table, primary key), how the sampler reached it (`role`: anchor, parent,
    child, label), its time, its effect on the explained number, in how many of the prediction's contexts it
    was, and (for the most effective rows) its cells' effects. A labelled row's `label` is the answer it showed."""

    table: str
    key: str
    role: str
    time: str | None
    effect: float
    contexts: int
    label: str | None = None
    cells: list[CellEffect] = field(default_factory=list)

    def describe(self) -> str:
        when = f" at {self.time}" if self.time else ""
        if self.role == "label":
            return f"earlier answer for {self.table} {self.key}{when}: {self.label}"
        return f"{self.table} {self.key}{when} ({self.role})"


@dataclass
class Explanation:
    """Why one prediction: the anchor, what is explained (`quantity`) and its value, and the context rows that
    moved it most (largest |effect| first) of the `rows_seen` rows its contexts held."""

    task: str
    anchor: str
    observation_time: str | None
    quantity: str
    prediction: float
    rows: list[RowEffect]
    rows_seen: int
    contexts: int
    method: str = "replace"  # what "without the row" meant (`HOWS`)
    answer: str = ""  # the prediction as `predict` states it (a value, a class, true / false, a time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Explanation:
        rows = [RowEffect(**{**r, "cells": [CellEffect(**c) for c in r.get("cells", [])]}) for r in d["rows"]]
        return cls(**{**d, "rows": rows})

    def text(self) -> str:
        """The explanation in a few lines, as the CLI prints it."""
        when = f" at {self.observation_time}" if self.observation_time else ""
        prob = f" (P = {1.0 / (1.0 + math.exp(-self.prediction)):.3g})" if self.quantity.startswith("log-odds") else ""
        said = f"{self.answer}; " if self.answer and not _restates(self.answer, self.prediction) else ""
        out = [f"{self.task} for {self.anchor}{when}: {said}{self.quantity} = {_num(self.prediction)}{prob} "
               f"(the {len(self.rows)} of {self.rows_seen} context rows that moved it most; effect = prediction "
               f"minus the prediction {WITHOUT.get(self.method, 'without the row')})"]
        for r in self.rows:
            out.append(f"  {_signed(r.effect):>10}  {r.describe()}")
            for c in r.cells[:CELLS_SHOWN]:
                out.append(f"  {'':>10}    {_signed(c.effect):>10}  {c.column} = {c.value}")
        return "\n".join(out)


def _restates(answer: str, value: float) -> bool:
    """Whether `answer` is the explained number itself (a numerical target's), so the text says it once."""
    try:
        return math.isclose(float(answer), value, rel_tol=1e-5, abs_tol=1e-6)
    except ValueError:
        return False


def _num(x: float) -> str:
    return f"{x:.4g}"


def _signed(x: float) -> str:
    return f"{x:+.3g}"


def _iso(us: int) -> str | None:
    if us in (STATIC_TIME, NULL_TIME, NO_CUTOFF):
        return None
    return str(np.datetime64(int(us), "us").astype("datetime64[s]"))


# ---- the occlusion itself


HOWS = ("replace", "remove", "null")  # what taking a row out means (`Explainer(how=...)`)
# the value tensors a replacement copies from a donor cell (a text cell, whose embedding lives in its own batch's
# text table, is made NULL instead)
DONOR_FIELDS = ("is_null", "numeric_values", "timestamp_values", "bool_values", "categorical_embed_ids")
DONOR_SEEDS = 64  # train seeds whose contexts give each column's replacement values
SAMPLES = 4  # replacements per row (or cell) averaged
WITHOUT = {"replace": "with the row's values replaced", "remove": "without the row", "null": "with the row NULL"}


@dataclass
class Donors:
    """Cells whose values replace a row's (how="replace"): their value tensors, flat, and per global column the
    indices of its cells."""

    values: dict[str, np.ndarray]
    pools: dict[int, np.ndarray]

    @classmethod
    def from_batches(cls, batches: list[TrainingBatch]) -> Donors:
        values: dict[str, list[np.ndarray]] = {f: [] for f in DONOR_FIELDS}
        cols = []
        for x in batches:
            ok = ~x.is_padding & ~x.is_target & x.seq_valid[:, None]
            for f in DONOR_FIELDS:
                values[f].append(getattr(x, f)[ok])
            cols.append(x.column_ids[ok])
        col = np.concatenate(cols) if cols else np.zeros(0, np.int32)
        order = np.argsort(col, kind="stable")
        uniq, start = np.unique(col[order], return_index=True)
        bounds = list(start[1:]) + [order.size]
        pools = {int(c): order[lo:hi] for c, lo, hi in zip(uniq, start, bounds, strict=True)}
        return cls({f: np.concatenate(v) if v else np.zeros(0) for f, v in values.items()}, pools)

    def choose(self, columns: np.ndarray, text: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A donor cell per position (its column's), -1 where none (a text cell, a column no donor shows)."""
        out = np.full(columns.size, -1, np.int64)
        for j, c in enumerate(columns.tolist()):
            pool = self.pools.get(c)
            if pool is not None and not text[j]:
                out[j] = pool[rng.integers(pool.size)]
        return out


Item = tuple[int, np.ndarray, np.ndarray | None]  # (sequence, positions, donor cells for "replace")


def occluded(batch: TrainingBatch, items: list[Item], how: str = "remove", donors: Donors | None = None
             ) -> TrainingBatch:
    """A batch of `batch`'s shape whose sequence j is `batch`'s sequence `items[j][0]` with the cells at positions
    `items[j][1]` taken out: marked as padding ("remove"), as NULL ("null"), or given the values of the donor
    cells `items[j][2]` ("replace"; NULL where the donor is -1). Sequences beyond the items are filler
    (`seq_valid` False). At most `batch_size` items."""
    b = batch.batch_size
    n = len(items)
    if n > b:
        raise ValueError(f"{n} occluded sequences do not fit a batch of {b}")
    idx = np.zeros(b, np.int64)
    idx[:n] = [it[0] for it in items]
    changes: dict[str, Any] = {f: getattr(batch, f)[idx] for f in SEQ_FIELDS}
    for j, (_, pos, src) in enumerate(items):
        if how == "remove":
            changes["is_padding"][j, pos] = True
        elif how == "null" or donors is None or src is None:
            changes["is_null"][j, pos] = True
        else:
            ok = src >= 0
            for f in DONOR_FIELDS:
                changes[f][j, pos[ok]] = donors.values[f][src[ok]]
            changes["is_null"][j, pos[~ok]] = True
    changes["fk_adj"] = batch.fk_adj[idx]
    for f in ("seed_ids", "anchor_rows", "obs_times", "wait_ref", "wait_scale"):
        changes[f] = getattr(batch, f)[idx]
    valid = np.zeros(b, bool)
    valid[:n] = True
    changes["seq_valid"] = valid
    return dataclasses.replace(batch, **changes)


def _take(h: HeadOutputs, idx: np.ndarray) -> HeadOutputs:
    return HeadOutputs(*(np.array(getattr(h, f)[idx]) for f in HeadOutputs.__dataclass_fields__))


def _forward_items(predictor: Predictor, batch: TrainingBatch, items: list[Item], how: str,
                   donors: Donors | None) -> HeadOutputs:
    bs = batch.batch_size
    parts = [predictor.forward(occluded(batch, items[lo:lo + bs], how, donors)) for lo in range(0, len(items), bs)]
    return HeadOutputs(*(np.concatenate([getattr(p, f) for p in parts]) for f in HeadOutputs.__dataclass_fields__))


def units(res: BuildResult, b: int) -> dict[Key, np.ndarray]:
    """The rows of sequence `b` of a build, each with the positions of its cells (not the target cell, not
    padding), keyed the same in every draw: ("row", global row) for a walked row, ("label", seed) for a labelled
    task row."""
    x = res.batch
    pos = np.flatnonzero(~x.is_padding[b] & ~x.is_target[b])
    local = x.seq_row_ids[b, pos].astype(np.int64)
    n_labels = int((res.labels[b] >= 0).sum()) if res.labels is not None else 0
    n_walk = int(res.nrows[b]) - n_labels
    out: dict[Key, np.ndarray] = {}
    for r in np.unique(local):
        key = ("label", int(res.labels[b, r - n_walk])) if r >= n_walk else ("row", int(res.rows[b, r]))
        out[key] = pos[local == r]
    return out


Request = tuple[int, tuple[int, ...], dict[int, np.ndarray]]  # (anchor i, what it is, {draw: positions})


class _Chunk:
    """Up to one batch of anchors: their contexts in every draw, the draws' head outputs, and the combined
    prediction; `effects` answers "how much does taking these cells out move each anchor's prediction"."""

    def __init__(self, predictor: Predictor, task: str, target: Any, ids: np.ndarray, context: str, how: str,
                 donors: Donors | None, samples: int, seed: int):
        self.predictor, self.task, self.how, self.donors, self.seed = predictor, task, how, donors, seed
        self.samples = samples if how == "replace" else 1
        store = predictor.store
        self.kind = kind(store.task(task).target_stype)
        sampler = predictor.stream.sampler
        self.builds = [sampler.build(target, ids, epoch=d, context=context) for d in range(predictor.draws)]
        self.bases = [predictor.forward(r.batch) for r in self.builds]
        self.n = len(ids)
        self.units = [[units(r, i) for i in range(self.n)] for r in self.builds]
        every = np.ones(self.n, bool)
        self.base_pred = self.kind.model_predictions(store, task, combine_draws(self.bases), every, None)
        self.base_value = self.kind.explained(self.base_pred, self.base_pred)

    def _donors_for(self, d: int, i: int, tag: tuple[int, ...], pos: np.ndarray, k: int) -> np.ndarray | None:
        if self.how != "replace" or self.donors is None:
            return None
        x = self.builds[d].batch
        # keyed on the anchor, its time, what is replaced and the sample: the same whatever else is asked with it
        rng = np.random.default_rng([self.seed, int(x.anchor_rows[i]) & 0xFFFFFFFF,
                                     int(x.obs_times[i]) & 0xFFFFFFFFFFFF, d, k, *[t & 0xFFFFFFFF for t in tag]])
        text = x.semantic_types[i, pos] == int(SemanticType.TEXT)
        return self.donors.choose(x.column_ids[i, pos], text, rng)

    def effects(self, requests: list[Request]) -> np.ndarray:
        """Per request (anchor i, a tag, {draw: positions}), the anchor's explained number minus the same with those
        cells taken out of those draws (the other draws as they were), combined over draws as the prediction is;
        with replacements, the mean over `samples` of them."""
        if not requests:
            return np.zeros(0)
        who = np.asarray([i for i, _, _ in requests], np.int64)
        values = np.zeros(who.size)
        for k in range(self.samples):
            per_draw = []
            for d, res in enumerate(self.builds):
                h = _take(self.bases[d], who)
                at = [m for m, (_, _, rem) in enumerate(requests) if d in rem]
                if at:
                    items = [(requests[m][0], requests[m][2][d],
                              self._donors_for(d, requests[m][0], requests[m][1], requests[m][2][d], k)) for m in at]
                    got = _forward_items(self.predictor, res.batch, items, self.how, self.donors)
                    for f in HeadOutputs.__dataclass_fields__:
                        getattr(h, f)[np.asarray(at, np.int64)] = getattr(got, f)
                per_draw.append(h)
            pred = self.kind.model_predictions(self.predictor.store, self.task, combine_draws(per_draw),
                                               np.ones(who.size, bool), None)
            values += self.kind.explained(pred, self.base_pred[who])
        return self.base_value[who] - values / self.samples


def _tag(k: Key) -> tuple[int, int]:
    return (1 if k[0] == "label" else 0, k[1])


class Explainer:
    """Explanations of a task's predictions by a `Predictor` (its contexts, draws and batch size)."""

    def __init__(self, predictor: Predictor, task: str, *, top: int = DEFAULT_TOP, cell_rows: int = DEFAULT_CELL_ROWS,
                 how: str = "replace", samples: int = SAMPLES, seed: int = 0):
        if top < 1:
            raise ConfluenceError(f"explain: rows per explanation (--explain) must be 1 or more, not {top}")
        if cell_rows < 0:
            raise ConfluenceError(f"explain: rows whose cells are explained must be 0 or more, not {cell_rows}")
        if how not in HOWS:
            raise ConfluenceError(f"explain: how must be one of {', '.join(HOWS)}, not {how!r}")
        if samples < 1:
            raise ConfluenceError(f"explain: replacements per row must be 1 or more, not {samples}")
        self.predictor, self.task, self.top, self.cell_rows = predictor, task, int(top), int(cell_rows)
        self.how, self.samples, self.seed = how, int(samples), int(seed)
        self._donors: Donors | None = None
        sampler = predictor.stream.sampler
        self.info = predictor.store.task(task)
        self.data = sampler.data[sampler.entry(task).db_idx]
        self.arrays = predictor.store.task_arrays(task)
        self.decoder = CellDecoder(predictor.store, self.data)

    def seeds(self, seed_ids: np.ndarray, context: str = "test",
              progress: Callable[[int], None] | None = None) -> list[Explanation]:
        """Explanations of seeds of the task (as `Predictor.task_outputs(seed_ids, context=...)` answers them)."""
        return self._explain(self.task, np.asarray(seed_ids, np.int64), context, progress)

    def anchors(self, rows: np.ndarray, obs: np.ndarray, context: str = "all",
                progress: Callable[[int], None] | None = None) -> list[Explanation]:
        """Explanations for anchor rows (global) at observation times (as `Predictor.anchor_outputs` answers)."""
        custom = self.predictor.stream.sampler.anchor_task(self.task, rows, obs)
        return self._explain(custom, np.arange(len(rows), dtype=np.int64), context, progress)

    def _explain(self, target: Any, ids: np.ndarray, context: str,
                 progress: Callable[[int], None] | None) -> list[Explanation]:
        out: list[Explanation] = []
        bs = self.predictor.batch_size
        for lo in range(0, ids.size, bs):
            chunk = _Chunk(self.predictor, self.task, target, ids[lo:lo + bs], context, self.how, self.donors(),
                           self.samples, self.seed)
            out.extend(self._chunk(chunk))
            if progress is not None:
                progress(chunk.n)
        return out

    def donors(self) -> Donors | None:
        """The replacement values (how="replace"): the cells of the contexts of up to `DONOR_SEEDS` train seeds
        of the task, spread over them, built once (the same for every request)."""
        if self.how != "replace":
            return None
        if self._donors is None:
            ids = subsample(self.predictor.seed_ids("train", self.task), DONOR_SEEDS)
            bs = self.predictor.batch_size
            sampler = self.predictor.stream.sampler
            self._donors = Donors.from_batches([sampler.build(self.task, ids[lo:lo + bs], context="train").batch
                                                for lo in range(0, ids.size, bs)])
        return self._donors

    def faithfulness(self, seed_ids: np.ndarray, k: int = 2, context: str = "test") -> dict[str, float]:
        """Whether the ranking is faithful: per seed, how much the answer moves when its `k` top-ranked rows are taken
        out together, and when `k` other rows drawn at random are (the anchor's own row never; a seed whose
        contexts hold fewer than 2k rows is skipped). Returns the mean |change| of each and the share of seeds
        where the top rows moved it more; a faithful ranking moves it clearly more."""
        ids = np.asarray(seed_ids, np.int64)
        top, rand, wins, n = [], [], 0, 0
        rng = np.random.default_rng(self.seed)
        bs = self.predictor.batch_size
        for lo in range(0, ids.size, bs):
            ch = _Chunk(self.predictor, self.task, self.task, ids[lo:lo + bs], context, self.how, self.donors(),
                        self.samples, self.seed)
            draws = range(len(ch.builds))
            reqs = []
            keys, eff = self._row_effects(ch)
            for i in range(ch.n):
                anchor = ("row", int(ch.builds[0].batch.anchor_rows[i]))
                ranked = sorted((k_ for k_ in keys[i] if k_ != anchor), key=lambda k_, i=i: -abs(eff[i][k_]))
                if len(ranked) < 2 * k:
                    continue
                chosen = ranked[:k]
                others = ranked[k:]
                drawn = [others[j] for j in rng.choice(len(others), size=k, replace=False)]
                for group, tag in ((chosen, 1), (drawn, 2)):
                    rem = {}
                    for d in draws:
                        pos = [ch.units[d][i][k_] for k_ in group if k_ in ch.units[d][i]]
                        if pos:
                            rem[d] = np.concatenate(pos)
                    reqs.append((i, (tag, *[t for k_ in group for t in _tag(k_)]), rem))
            moved = np.abs(ch.effects(reqs))
            for j in range(0, moved.size, 2):
                top.append(moved[j])
                rand.append(moved[j + 1])
                wins += moved[j] > moved[j + 1]
                n += 1
        return {"seeds": n, "top": float(np.mean(top)) if n else float("nan"),
                "random": float(np.mean(rand)) if n else float("nan"), "top_moves_more": wins / n if n else float("nan")}

    def _row_effects(self, ch: _Chunk) -> tuple[list[list[Key]], list[dict[Key, float]]]:
        """Every row any draw of each anchor holds, and each row's effect."""
        draws = range(len(ch.builds))
        keys = [sorted(set().union(*(ch.units[d][i] for d in draws))) for i in range(ch.n)]
        pairs = [(i, k) for i in range(ch.n) for k in keys[i]]
        row_req = [(i, _tag(k), {d: ch.units[d][i][k] for d in draws if k in ch.units[d][i]}) for i, k in pairs]
        eff: list[dict[Key, float]] = [{} for _ in range(ch.n)]
        for (i, k), e in zip(pairs, ch.effects(row_req), strict=True):
            eff[i][k] = float(e)
        return keys, eff

    def _chunk(self, ch: _Chunk) -> list[Explanation]:
        draws = range(len(ch.builds))
        keys, eff = self._row_effects(ch)
        ranked = [sorted(eff[i], key=lambda k, i=i: -abs(eff[i][k]))[:self.top] for i in range(ch.n)]
        # the cells of the most effective rows, one by one (a row has one cell per column in every draw)
        cell_req, cell_of = [], []
        for i in range(ch.n):
            for k in ranked[i][:self.cell_rows]:
                d0 = next(d for d in draws if k in ch.units[d][i])
                b0 = ch.builds[d0].batch
                pos0 = ch.units[d0][i][k]
                valued = b0.semantic_types[i, pos0] != int(SemanticType.IDENTIFIER)  # a key's value is the link
                for c in dict.fromkeys(b0.column_ids[i, pos0[valued]].tolist()):
                    rem = {}
                    for d in draws:
                        pos = ch.units[d][i].get(k)
                        if pos is not None:
                            pos = pos[ch.builds[d].batch.column_ids[i, pos] == c]
                            if pos.size:
                                rem[d] = pos
                    cell_req.append((i, (*_tag(k), int(c)), rem))
                    cell_of.append((i, k, d0, int(ch.units[d0][i][k][b0.column_ids[i, ch.units[d0][i][k]] == c][0])))
        cell_eff = ch.effects(cell_req)
        cells: dict[tuple[int, Key], list[CellEffect]] = {}
        for (i, k, d0, p), e in zip(cell_of, cell_eff, strict=True):
            col = self.data.column_names[int(ch.builds[d0].batch.column_ids[i, p])]
            cells.setdefault((i, k), []).append(
                CellEffect(col, cell_value(ch.builds[d0], i, p, self.decoder), float(e)))
        quantity = ch.kind.explained_quantity(self.predictor.store, self.info, ch.base_pred)
        answers = ch.kind.point(ch.base_pred)
        first = ch.builds[0].batch
        out = []
        for i in range(ch.n):
            rows = []
            for k in ranked[i]:
                row = self._row(ch, i, k, eff[i][k])
                row.cells = sorted(cells.get((i, k), []), key=lambda c: -abs(c.effect))
                rows.append(row)
            g = int(first.anchor_rows[i])
            t = self.data.table_of_row(g)
            anchor = f"{self.data.table_names[t]} {self.decoder.row(self.data.table_names[t], g - int(self.data.tab_row_off[t]))}"
            out.append(Explanation(self.task, anchor, _iso(int(first.obs_times[i])), quantity[i],
                                   float(ch.base_value[i]), rows, len(keys[i]), len(ch.builds), self.how,
                                   ch.kind.value_text(self.predictor.store, self.info, answers[i])))
        return out

    def _row(self, ch: _Chunk, i: int, k: Key, effect: float) -> RowEffect:
        held = [d for d in range(len(ch.builds)) if k in ch.units[d][i]]
        d0 = held[0]
        res = ch.builds[d0]
        pos = ch.units[d0][i][k]
        local = int(res.batch.seq_row_ids[i, pos[0]])
        if k[0] == "label":
            s = k[1]
            g = int(self.arrays.anchor_row[s])
            label_pos = pos[res.batch.column_ids[i, pos] == int(self.info.target_column_idx)]
            label = cell_value(res, i, int(label_pos[0]), self.decoder) if label_pos.size else None
            when = _iso(int(self.arrays.obs_time[s]))
        else:
            g, label = k[1], None
            when = _iso(int(self.data.row_time[g]))
        t = self.data.table_of_row(g)
        table = self.data.table_names[t]
        key = self.decoder.row(table, g - int(self.data.tab_row_off[t]))
        return RowEffect(table, key, ROLES.get(int(res.via[i, local]), "row"), when, effect, len(held), label)


def explain_seeds(predictor: Predictor, task: str, seed_ids: np.ndarray, *, context: str = "test",
                  top: int = DEFAULT_TOP, cell_rows: int = DEFAULT_CELL_ROWS,
                  progress: Callable[[int], None] | None = None) -> list[Explanation]:
    """`Explainer(predictor, task).seeds(...)`: one explanation per seed, in order."""
    return Explainer(predictor, task, top=top, cell_rows=cell_rows).seeds(seed_ids, context, progress)
