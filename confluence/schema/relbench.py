"""Draft the tasks of a RelBench dataset folder: one derived task per `tasks/<task>/` folder whose rows are exactly
that task's train ∪ val ∪ test rows, split as RelBench split them (docs/guide/relbench.md).

The task files (`confluence.sources.relbench_tasks`) name the entity column and table (`fkey_col_to_pkey_table`) and
the timestamp column (`time_col`); the remaining column is the target. RelBench does not record the task type in
them, so it is inferred from the target's values (and said so in the task's `reason`). The split is RelBench's
own: a row observed before the first validation timestamp is train, before the first test timestamp val, else
test; the draft checks that these cut-offs put every row of each file in that file's split, and the query's
`split` column lets validation check it again on every run. A recommendation / link-prediction folder (two
foreign keys, the destination a list of keys per row) becomes a link task whose query unnests the list, with the
same split; multilabel folders are skipped with a `DataWarning` saying why.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pyarrow as pa

from confluence.schema.metadata import LinkTaskMeta, TableMeta, TaskMeta, TaskSplit
from confluence.schema.validate import type_family
from confluence.sources import data_warnings as dw
from confluence.sources.raw import RawDatabase, quote_ident
from confluence.sources.relbench_tasks import SPLIT_FILES, TaskFolder, find_task_folders, view_name
from confluence.stypes import SemanticType

__all__ = ["RelbenchDraft", "draft_relbench_tasks", "RELBENCH_MULTICLASS", "TASK_TYPES"]

# RelBench's multiclass tasks keep class codes as numbers (AutoCompleteTask's ordinal encoding), which the values
# alone cannot tell from a regression target; these are the ones relbench/tasks/__init__.py registers.
RELBENCH_MULTICLASS = frozenset({
    "badges-class", "author-category", "item-plant", "item-shippoint", "item-incoterms", "sales-office",
    "sales-group", "sales-payterms", "sales-shipcond", "sales-incoterms",
})
# RelBench's task type (relbench/base/task_base.py, TaskType) of each target stype.
TASK_TYPES = {SemanticType.BOOLEAN: "binary_classification", SemanticType.NUMERICAL: "regression",
              SemanticType.CATEGORICAL: "multiclass_classification"}
_EPOCH = dt.datetime(1970, 1, 1)


@dataclass
class RelbenchDraft:
    """What the draft adds for a RelBench folder: its tasks, a line per task folder for the database's
    description, and the earliest validation / test cut-offs (for the cell-masking tasks' split)."""

    tasks: dict[str, TaskMeta] = field(default_factory=dict)
    link_tasks: dict[str, LinkTaskMeta] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # cell-masking tasks left out, and why
    val_us: int | None = None
    test_us: int | None = None

    def description(self) -> str | None:
        """The database description: what became of each task folder and how the other tasks are split."""
        if not self.notes:
            return None
        text = "RelBench dataset. Task folders under tasks/: " + "; ".join(self.notes) + "."
        if self.val_us is not None:
            text += (f" Cell-masking tasks use RelBench's cut-offs too (train before {iso(self.val_us)}, val before"
                     f" {iso(self.test_us)}), so training never reads rows of the validation or test period.")
        if self.left_out:
            text += " Left out: " + "; ".join(self.left_out) + "."
        return text

    def split_cell_masking(self, raw: RawDatabase, tables: dict[str, TableMeta],
                           tasks: dict[str, TaskMeta]) -> dict[str, TaskMeta]:
        """Give the cell-masking tasks of temporal tables RelBench's cut-offs (a hash split would train on rows of
        the test period) and leave out those that would still read that period: tasks of static tables (their
        contexts have no time cut-off) and tasks with no row before the validation cut-off."""
        if self.val_us is None or self.test_us is None:
            return tasks
        out: dict[str, TaskMeta] = {}
        static = sorted({t.anchor_table for t in tasks.values() if tables[t.anchor_table].temporal_column is None})
        if static:
            self.left_out.append(f"the cell-masking tasks of the static tables {', '.join(static)} (without a time,"
                                 " their contexts would show rows of the validation and test period)")
        before: dict[str, int] = {}  # table -> its rows before the validation cut-off (one scan per table)
        for name, task in tasks.items():
            tcol = tables[task.anchor_table].temporal_column
            if tcol is None:
                continue
            if task.anchor_table not in before:
                before[task.anchor_table] = raw.fetchall(
                    f"SELECT count(*) FROM {quote_ident(task.anchor_table)}"
                    f" WHERE epoch_ns({quote_ident(tcol)}) < {self.val_us * 1000}")[0][0]
            if before[task.anchor_table] == 0:
                self.left_out.append(f"cell-masking task {name} (no row of {task.anchor_table} is before the"
                                     f" validation cut-off {iso(self.val_us)})")
                continue
            task.split = TaskSplit(val_time=iso(self.val_us), test_time=iso(self.test_us))
            out[name] = task
        return out


def iso(us: int) -> str:
    """Epoch microseconds as an ISO time, naive UTC (`2021-01-01 00:00:00`, microseconds only when non-zero)."""
    return (_EPOCH + dt.timedelta(microseconds=us)).isoformat(sep=" ")


class _Skip(Exception):
    """A task folder the draft leaves out; the message says why."""


def draft_relbench_tasks(raw: RawDatabase, tables: dict[str, TableMeta], found: dw.WarningList) -> RelbenchDraft:
    """A task per usable folder under `<raw.path>/tasks/`. A target that is also a column of the entity table (an
    autocomplete task) is made `ignored` in `tables` (RelBench removes it from the database). Each folder left out
    adds a `relbench_task_skipped` DataWarning to `found`."""
    out = RelbenchDraft()
    cutoffs: list[tuple[int, int]] = []
    for folder in find_task_folders(raw.path):
        try:
            task, val_us, test_us = _draft_task(raw, tables, folder)
        except _Skip as why:
            out.notes.append(f"{folder.name} skipped ({why})")
            found.add(dw.DataWarning(f"RelBench task folder {folder.folder}: skipped: {why}",
                                     code="relbench_task_skipped", column=folder.name))
            continue
        if isinstance(task, LinkTaskMeta):
            out.link_tasks[task.name] = task
            out.notes.append(f"{folder.name} (link prediction)")
        else:
            out.tasks[task.name] = task
            out.notes.append(f"{folder.name} ({TASK_TYPES[task.target_stype]})")
        cutoffs.append((val_us, test_us))
    if cutoffs:
        out.val_us, out.test_us = min(v for v, _ in cutoffs), min(t for _, t in cutoffs)
    return out


def _draft_task(raw: RawDatabase, tables: dict[str, TableMeta], folder: TaskFolder
                ) -> tuple[TaskMeta | LinkTaskMeta, int, int]:
    missing = [f"{s}.parquet" for s in SPLIT_FILES if s not in folder.files]
    if missing:
        raise _Skip(f"no {', '.join(missing)} (RelBench writes train.parquet, val.parquet and test.parquet)")
    meta = folder.meta["train"]
    fkeys, tcol = meta.get("fkey_col_to_pkey_table"), meta.get("time_col")
    if not isinstance(fkeys, dict) or not isinstance(tcol, str):
        raise _Skip("train.parquet lacks RelBench's fkey_col_to_pkey_table / time_col metadata (Table.save writes"
                    " them), so its entity and time columns are unknown")
    if len(fkeys) == 2:
        return _draft_link_task(raw, tables, folder, fkeys, tcol)
    if len(fkeys) != 1:
        links = ", ".join(f"{c} -> {t}" for c, t in fkeys.items()) or "none"
        raise _Skip(f"its rows name {len(fkeys)} entities ({links}); an entity task names one, a link task two")
    (entity_col, entity_table), = fkeys.items()
    for split in SPLIT_FILES:
        for col in (entity_col, tcol):
            if col not in folder.columns[split]:
                raise _Skip(f"{split}.parquet has no column '{col}'")
    targets = [c for c in folder.columns["train"] if c not in (entity_col, tcol)]
    if len(targets) != 1:
        raise _Skip(f"train.parquet has {len(targets)} columns besides '{entity_col}' and '{tcol}'"
                    f" ({', '.join(targets) or 'none'}), so its target is not clear")
    target = targets[0]
    ttype = folder.types["train"][target]
    if type_family(ttype) not in ("bool", "integer", "float", "decimal", "string"):
        what = "a list per row: multilabel or link prediction" if type_family(ttype) == "nested" else str(ttype)
        raise _Skip(f"its target '{target}' holds {what}, which is not supported")
    table = tables.get(entity_table)
    if table is None or table.primary_key is None:
        raise _Skip(f"its entity table '{entity_table}' is not a table of db/ with a primary key")
    labelled = [s for s in SPLIT_FILES if target in folder.columns[s]]
    split_col = next(c for c in ("split", "relbench_split", "_relbench_split") if c not in (entity_col, tcol, target))
    e, t, y = quote_ident(entity_col), quote_ident(tcol), quote_ident(target)
    query = " UNION ALL ".join(
        f"SELECT {e}, {t}, {y if s in labelled else 'NULL AS ' + y}, '{s}' AS {quote_ident(split_col)}"
        f" FROM {view_name(folder.name, s)}" for s in SPLIT_FILES)
    span = {s: _span(raw, folder, s, tcol) for s in SPLIT_FILES}
    for s in SPLIT_FILES:
        if span[s][2] == 0:
            raise _Skip(f"{s}.parquet has no rows")
    for early, late in (("train", "val"), ("val", "test")):
        if span[early][1] >= span[late][0]:
            raise _Skip(f"{early}.parquet reaches {iso(span[early][1])}, not before the first row of {late}.parquet"
                        f" ({iso(span[late][0])}): the files are not split by time, so their split cannot be kept")
    val_us, test_us = span["val"][0], span["test"][0]
    stype, why = _infer_type(raw, folder, target, ttype, labelled)
    notes = []
    if target in table.columns and table.columns[target].stype != SemanticType.IGNORED:
        table.columns[target].stype = SemanticType.IGNORED
        table.columns[target].foreign_key = None
        table.columns[target].reason = (f"the target of RelBench task {folder.name} (an autocomplete task): RelBench"
                                        " removes it from the database, so no row may show it")
        notes.append(f"'{entity_table}.{target}' is made ignored (RelBench removes an autocomplete task's target"
                     " column from the database; set the other columns it removes, relbench/tasks/__init__.py"
                     " remove_columns, to ignored by hand)")
    if "test" not in labelled:
        notes.append(f"test.parquet has no '{target}' column (hidden labels): its rows are kept for prediction;"
                     " evaluation on test has nothing to score")
    autocomplete = target in table.columns
    horizon = "0 seconds" if autocomplete else _horizon(raw, folder, tcol)
    if autocomplete:
        notes.append("horizon 0 seconds (an autocomplete target is known at its row's time)")
    elif horizon is None:
        notes.append("its horizon is unknown (its observation times are not steps of one span): set the task's"
                     " horizon by hand for labelled context (sampler.labels)")
    else:
        notes.append(f"horizon {horizon}, the most common step between its observation times (RelBench steps them"
                     " by the task's timedelta, the span its target looks ahead)")
    counts = ", ".join(f"{s} {span[s][2]}" for s in SPLIT_FILES)
    reason = (f"RelBench task folder tasks/{folder.name} ({counts} rows): anchor {entity_table}.{entity_col}"
              f" (fkey_col_to_pkey_table), observation time '{tcol}' (time_col), target '{target}'. {why}. Split:"
              f" RelBench's own, by the files' timestamps: train before {iso(val_us)}, val before {iso(test_us)},"
              f" test after; column '{split_col}' names each row's file and validation checks it."
              + "".join(f" {n}." for n in notes))
    task = TaskMeta(
        name=folder.name, query=query, anchor_table=entity_table, anchor_key=entity_col, target_column=target,
        target_stype=stype, observation_time_column=tcol,
        description=f"RelBench task {folder.name}: {target} of a {entity_table} row, known after the observation time",
        split=TaskSplit(val_time=iso(val_us), test_time=iso(test_us), column=split_col), horizon=horizon,
        reason=reason)
    return task, val_us, test_us


def _draft_link_task(raw: RawDatabase, tables: dict[str, TableMeta], folder: TaskFolder, fkeys: dict[str, str],
                     tcol: str) -> tuple[LinkTaskMeta, int, int]:
    """A recommendation folder (RelBench's RecommendationTask): the source entity column, the observation time and
    the destination column, a list of destination keys per row. The link task's query unnests the list over the
    labelled files; its split is RelBench's, by the files' first timestamps."""
    lists = [c for c in fkeys if type_family(folder.types["train"].get(c, pa.null())) == "nested"]
    if len(lists) != 1:
        raise _Skip(f"a link task's destination column holds a list of keys per row; {len(lists)} of its key"
                    f" columns ({', '.join(fkeys)}) do")
    dst_col = lists[0]
    src_col = next(c for c in fkeys if c != dst_col)
    for role, col in (("source", src_col), ("destination", dst_col)):
        table = tables.get(fkeys[col])
        if table is None or table.primary_key is None:
            raise _Skip(f"its {role} table '{fkeys[col]}' is not a table of db/ with a primary key")
    for split in SPLIT_FILES:
        if src_col not in folder.columns[split] or tcol not in folder.columns[split]:
            raise _Skip(f"{split}.parquet lacks '{src_col}' or '{tcol}'")
    labelled = [s for s in SPLIT_FILES if dst_col in folder.columns[s]]
    span = {s: _span(raw, folder, s, tcol) for s in SPLIT_FILES}
    for early, late in (("train", "val"), ("val", "test")):
        if span[early][2] and span[late][2] and span[early][1] >= span[late][0]:
            raise _Skip(f"{early}.parquet reaches {iso(span[early][1])}, not before the first row of {late}.parquet"
                        f" ({iso(span[late][0])}): the files are not split by time, so their split cannot be kept")
    if "train" not in labelled or span["val"][2] == 0 or span["test"][2] == 0:
        raise _Skip("a link task needs labelled train rows and val / test rows to split by")
    val_us, test_us = span["val"][0], span["test"][0]
    horizon = _horizon(raw, folder, tcol)
    if horizon is None:
        raise _Skip("its observation times are not steps of one span, so the horizon a link task needs is unknown")
    s, t, d = (quote_ident(c) for c in (src_col, tcol, dst_col))
    query = " UNION ALL ".join(f"SELECT {s}, {t}, unnest({d}) AS {d} FROM {view_name(folder.name, x)}"
                               for x in labelled)
    notes = "" if "test" in labelled else (f" test.parquet has no '{dst_col}' column (hidden labels): nothing to"
                                           " score on test.")
    counts = ", ".join(f"{x} {span[x][2]}" for x in SPLIT_FILES)
    reason = (f"RelBench recommendation folder tasks/{folder.name} ({counts} rows): anchor"
              f" {fkeys[src_col]}.{src_col}, observation time '{tcol}', destination {fkeys[dst_col]} keys in the list"
              f" '{dst_col}' (fkey_col_to_pkey_table). Split: RelBench's own, train before {iso(val_us)}, val"
              f" before {iso(test_us)}. Horizon {horizon}, the most common step between its observation times. k"
              " 10: RelBench's eval_k is not in its files; set the dataset's own (rel-hm's 12, rel-stack's 100)."
              + notes)
    task = LinkTaskMeta(
        name=folder.name, query=query, anchor_table=fkeys[src_col], anchor_key=src_col,
        observation_time_column=tcol, target_table=fkeys[dst_col], target_key=dst_col, horizon=horizon,
        split=TaskSplit(val_time=iso(val_us), test_time=iso(test_us)), k=10,
        description=f"RelBench task {folder.name}: the {fkeys[dst_col]} rows a {fkeys[src_col]} row links to in the"
                    f" {horizon} after the observation time", reason=reason)
    return task, val_us, test_us


def _horizon(raw: RawDatabase, folder: TaskFolder, tcol: str) -> str | None:
    """The task's horizon as metadata text ("90 days"): RelBench draws a task's observation times `timedelta` apart
    and labels each with what happens in the next `timedelta`, so the most common step between consecutive distinct
    observation times (the shortest on a tie) is that span. None with one observation time or irregular ones."""
    c = quote_ident(tcol)
    times = " UNION ".join(f"SELECT DISTINCT epoch_ns({c}) // 1000 AS t FROM {view_name(folder.name, s)}"
                           f" WHERE {c} IS NOT NULL" for s in SPLIT_FILES)
    rows = raw.fetchall(f"SELECT step, count(*) AS n FROM (SELECT t - lag(t) OVER (ORDER BY t) AS step FROM ({times}))"
                        " WHERE step IS NOT NULL GROUP BY step ORDER BY n DESC, step LIMIT 1")
    if not rows or (rows[0][1] < 2 and raw.fetchall(f"SELECT count(*) FROM ({times})")[0][0] > 2):
        return None  # one observation time, or irregular ones (no step repeats)
    step = int(rows[0][0])
    for unit, us in (("days", 86_400_000_000), ("hours", 3_600_000_000), ("minutes", 60_000_000),
                     ("seconds", 1_000_000)):
        if step % us == 0:
            return f"{step // us} {unit}"
    return f"{max(1, round(step / 1_000_000))} seconds"


def _span(raw: RawDatabase, folder: TaskFolder, split: str, tcol: str) -> tuple[int, int, int]:
    """(first, last) observation time in epoch microseconds, floored as preprocessing floors them, and the rows."""
    c = quote_ident(tcol)
    lo, hi, n = raw.fetchall(f"SELECT epoch_ns(min({c})), epoch_ns(max({c})), count(*)"
                             f" FROM {view_name(folder.name, split)}")[0]
    if n and lo is None:
        raise _Skip(f"{split}.parquet's '{tcol}' is always NULL")
    return (int(lo) // 1000 if lo is not None else 0), (int(hi) // 1000 if hi is not None else 0), int(n)


def _infer_type(raw: RawDatabase, folder: TaskFolder, target: str, ttype: pa.DataType,
                labelled: list[str]) -> tuple[SemanticType, str]:
    """The target's stype and why: RelBench records no task type, so it comes from the values."""
    head = "Type inferred from the values (RelBench does not record the task type in its task files)"
    fam = type_family(ttype)
    if fam == "bool":
        return SemanticType.BOOLEAN, f"{head}: '{target}' is {ttype}, binary classification"
    if fam == "string":
        return SemanticType.CATEGORICAL, f"{head}: '{target}' holds strings, multiclass classification"
    y = quote_ident(target)
    rows = " UNION ALL ".join(f"SELECT {y} AS y FROM {view_name(folder.name, s)}" for s in labelled)
    distinct, non01, fractional = raw.fetchall(
        f"SELECT count(DISTINCT y), count(*) FILTER (WHERE y NOT IN (0, 1)),"
        f" count(*) FILTER (WHERE y <> round(y)) FROM ({rows}) WHERE y IS NOT NULL")[0]
    if non01 == 0 and distinct > 0:
        return SemanticType.BOOLEAN, f"{head}: '{target}' holds only 0 and 1, binary classification"
    if fractional == 0 and folder.name in RELBENCH_MULTICLASS:
        return SemanticType.CATEGORICAL, (f"{head}: '{target}' holds {distinct} whole-number class codes and RelBench"
                                          f" registers {folder.name} as multiclass classification")
    return SemanticType.NUMERICAL, (f"{head}: '{target}' holds {distinct} distinct numbers, regression (a multiclass"
                                    " task that stores class codes as numbers needs target_stype categorical)")
