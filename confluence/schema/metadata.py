"""The metadata model (spec/metadata.md) and its JSON form.

`parse_metadata` checks the *shape* of the file (required fields, types, stype names, references between
tables / columns / tasks that need no data) and reports every problem at once as a `MetadataError`.
Checks that need the data (columns present in the data, unique PKs, task queries, ...) live in
`confluence.schema.validate`.

Key order is preserved on load and save, so a reviewed file round-trips byte for byte.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluence.errors import MetadataError
from confluence.stypes import SemanticType


@dataclass
class ColumnMeta:
    name: str
    stype: SemanticType
    foreign_key: str | None = None  # "table.column"
    description: str | None = None
    reason: str | None = None  # why a draft chose this stype (kept for review; not used by preprocessing)

    @property
    def fk_table(self) -> str | None:
        return self.foreign_key.split(".", 1)[0] if self.foreign_key else None

    @property
    def fk_column(self) -> str | None:
        return self.foreign_key.split(".", 1)[1] if self.foreign_key else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stype": self.stype.label}
        if self.foreign_key:
            out["foreign_key"] = self.foreign_key
        if self.description:
            out["description"] = self.description
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass
class TableMeta:
    name: str
    columns: dict[str, ColumnMeta]
    primary_key: str | None = None
    temporal_column: str | None = None
    description: str | None = None

    def non_ignored(self) -> list[ColumnMeta]:
        return [c for c in self.columns.values() if c.stype != SemanticType.IGNORED]

    def foreign_keys(self) -> list[ColumnMeta]:
        return [c for c in self.columns.values() if c.foreign_key and c.stype != SemanticType.IGNORED]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.description:
            out["description"] = self.description
        if self.primary_key:
            out["primary_key"] = self.primary_key
        if self.temporal_column:
            out["temporal_column"] = self.temporal_column
        out["columns"] = {name: c.to_json() for name, c in self.columns.items()}
        return out


SPLIT_NAMES = ("train", "val", "test")
# The fields each object of a metadata file may hold; any other name is an "unknown field" problem. Every one is
# described in docs/reference/metadata.md (tests/test_metadata_reference.py keeps that page complete).
DATABASE_FIELDS = ("name", "description", "tables", "tasks", "link_tasks")
TABLE_FIELDS = ("primary_key", "temporal_column", "columns", "description")
COLUMN_FIELDS = ("stype", "foreign_key", "description", "reason")
TASK_FIELDS = ("query", "anchor_table", "anchor_key", "target_column", "target_stype", "observation_time_column",
               "description", "exclude_columns", "split", "horizon", "reason")
LINK_TASK_FIELDS = ("query", "anchor_table", "anchor_key", "observation_time_column", "target_table", "target_key",
                    "horizon", "k", "split", "description", "reason")
MAX_LINK_K = 1000  # a ranked list longer than this is not a recommendation a user reads
SPLIT_FIELDS = ("val_time", "test_time", "column")
# a horizon's units in microseconds (each also in the plural: "30 days"): fixed lengths only
HORIZON_UNITS = {"second": 1_000_000, "minute": 60_000_000, "hour": 3_600_000_000, "day": 86_400_000_000,
                 "week": 604_800_000_000}
_HORIZON = re.compile(r"^\s*(\d+)\s*(second|minute|hour|day|week)s?\s*$")


def parse_horizon(text: Any) -> int:
    """A task's horizon such as "30 days", "1 day", "12 hours", "0 seconds" -> microseconds. Fixed-length units
    only (seconds, minutes, hours, days, weeks): a calendar month has no one length, say "31 days"."""
    m = _HORIZON.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not a horizon like '30 days' (a whole number of seconds, minutes, hours, "
                         "days or weeks)")
    return int(m.group(1)) * HORIZON_UNITS[m.group(2)]
_EPOCH = dt.datetime(1970, 1, 1)


def parse_time(text: str) -> dt.datetime:
    """An ISO 8601 time (`2021-01-01`, `2021-01-01 12:00:00`, `...T12:00:00+02:00`, `...Z`) as a naive UTC
    datetime; naive input is taken as UTC. ValueError when it is not one."""
    value = dt.datetime.fromisoformat(text)
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def epoch_us(value: dt.datetime) -> int:
    """Microseconds since 1970-01-01 of a naive UTC datetime (the store's time unit)."""
    return (value - _EPOCH) // dt.timedelta(microseconds=1)


@dataclass
class TaskSplit:
    """A task's own train / val / test split by observation time, as RelBench defines it: a row observed before
    `val_time` is train, before `test_time` val, else test. `column`, when given, names a column of the task's
    query that says which split each row belongs to (the RelBench file it came from); validation checks that
    the cut-offs put every row there."""

    val_time: str
    test_time: str
    column: str | None = None

    @property
    def val_us(self) -> int:
        return epoch_us(parse_time(self.val_time))

    @property
    def test_us(self) -> int:
        return epoch_us(parse_time(self.test_time))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"val_time": self.val_time, "test_time": self.test_time}
        if self.column:
            out["column"] = self.column
        return out


@dataclass
class TaskMeta:
    name: str
    query: str
    anchor_table: str
    anchor_key: str
    target_column: str
    target_stype: SemanticType
    observation_time_column: str | None = None
    description: str | None = None
    exclude_columns: list[str] = field(default_factory=list)
    split: TaskSplit | None = None  # the task's own split (RelBench); None: the run's sampler.split
    # how far past the observation time a derived task's query looks ("30 days"): its labels are known from
    # observation time + horizon (labelled context, `confluence.sampler.labels`); unused by cell-masking tasks
    horizon: str | None = None
    reason: str | None = None  # why a draft made this task (kept for review; not used by preprocessing)

    def is_cell_masking(self, db: DatabaseMeta) -> bool:
        """A cell-masking task predicts a column of the anchor table (same name, same stype)."""
        table = db.tables.get(self.anchor_table)
        col = table.columns.get(self.target_column) if table else None
        return col is not None and col.stype == self.target_stype and self.observation_time_column is None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "query": self.query,
            "anchor_table": self.anchor_table,
            "anchor_key": self.anchor_key,
            "target_column": self.target_column,
            "target_stype": self.target_stype.label,
        }
        if self.observation_time_column:
            out["observation_time_column"] = self.observation_time_column
        if self.description:
            out["description"] = self.description
        if self.exclude_columns:
            out["exclude_columns"] = list(self.exclude_columns)
        if self.split is not None:
            out["split"] = self.split.to_json()
        if self.horizon is not None:
            out["horizon"] = self.horizon
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass
class LinkTaskMeta:
    """A link task: "which rows of `target_table` will this anchor link to in the `horizon` after its observation
    time?". Its query returns one row per (anchor key, observation time, target key) link; the links of one anchor
    at one observation time are that seed's answer, a set scored by the top `k` rows predicted. Always split by
    observation time (`split`), since a ranked list is only meaningful against what came before."""

    name: str
    query: str
    anchor_table: str
    anchor_key: str
    observation_time_column: str
    target_table: str
    target_key: str
    horizon: str
    split: TaskSplit
    k: int = 10
    description: str | None = None
    reason: str | None = None

    @property
    def horizon_us(self) -> int:
        return parse_horizon(self.horizon)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "query": self.query,
            "anchor_table": self.anchor_table,
            "anchor_key": self.anchor_key,
            "observation_time_column": self.observation_time_column,
            "target_table": self.target_table,
            "target_key": self.target_key,
            "horizon": self.horizon,
            "k": self.k,
            "split": self.split.to_json(),
        }
        if self.description:
            out["description"] = self.description
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass
class DatabaseMeta:
    name: str
    tables: dict[str, TableMeta]
    tasks: dict[str, TaskMeta] = field(default_factory=dict)
    description: str | None = None
    link_tasks: dict[str, LinkTaskMeta] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["tables"] = {name: t.to_json() for name, t in self.tables.items()}
        out["tasks"] = {name: t.to_json() for name, t in self.tasks.items()}
        if self.link_tasks:
            out["link_tasks"] = {name: t.to_json() for name, t in self.link_tasks.items()}
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"


def _str(obj: dict, key: str, where: str, problems: list[str], required: bool = True) -> str | None:
    val = obj.get(key)
    if val is None:
        if required:
            problems.append(f"{where}: missing required field '{key}'")
        return None
    if not isinstance(val, str) or not val.strip():
        problems.append(f"{where}: field '{key}' must be a non-empty string, got {val!r}")
        return None
    return val


def parse_metadata(raw: Any, source: str = "metadata") -> DatabaseMeta:
    """Build a DatabaseMeta from parsed JSON, collecting every structural problem before raising."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise MetadataError([f"{source}: top level must be a JSON object, got {type(raw).__name__}"])
    for key in raw:
        if key not in DATABASE_FIELDS:
            problems.append(f"database: unknown field '{key}'")
    name = _str(raw, "name", "database", problems) or "unnamed"
    tables_raw = raw.get("tables")
    tables: dict[str, TableMeta] = {}
    if not isinstance(tables_raw, dict) or not tables_raw:
        problems.append("database: 'tables' must be a non-empty object of table name -> table")
        tables_raw = {}
    for tname, traw in tables_raw.items():
        where = f"table '{tname}'"
        if not isinstance(traw, dict):
            problems.append(f"{where}: must be an object")
            continue
        for key in traw:
            if key not in TABLE_FIELDS:
                problems.append(f"{where}: unknown field '{key}'")
        cols_raw = traw.get("columns")
        cols: dict[str, ColumnMeta] = {}
        if not isinstance(cols_raw, dict) or not cols_raw:
            problems.append(f"{where}: 'columns' must be a non-empty object of column name -> column")
            cols_raw = {}
        for cname, craw in cols_raw.items():
            cwhere = f"column '{tname}.{cname}'"
            if not isinstance(craw, dict):
                problems.append(f"{cwhere}: must be an object like {{\"stype\": \"numerical\"}}")
                continue
            for key in craw:
                if key not in COLUMN_FIELDS:
                    problems.append(f"{cwhere}: unknown field '{key}'")
            stype_name = _str(craw, "stype", cwhere, problems)
            stype = SemanticType.IGNORED
            if stype_name is not None:
                try:
                    stype = SemanticType.parse(stype_name)
                except ValueError as exc:
                    problems.append(f"{cwhere}: {exc}")
            fk = _str(craw, "foreign_key", cwhere, problems, required=False)
            if fk is not None and fk.count(".") != 1:
                problems.append(f"{cwhere}: foreign_key {fk!r} must look like 'table.column'")
                fk = None
            if fk is not None and stype != SemanticType.IDENTIFIER:
                problems.append(f"{cwhere}: a foreign key column must have stype 'identifier', not '{stype.label}'")
            cols[cname] = ColumnMeta(
                name=cname,
                stype=stype,
                foreign_key=fk,
                description=_str(craw, "description", cwhere, problems, required=False),
                reason=_str(craw, "reason", cwhere, problems, required=False),
            )
        pk = _str(traw, "primary_key", where, problems, required=False)
        if pk is not None and pk not in cols:
            problems.append(f"{where}: primary_key '{pk}' is not one of its columns")
        elif pk is not None and cols[pk].stype != SemanticType.IDENTIFIER:
            problems.append(f"{where}: primary_key '{pk}' must have stype 'identifier', not '{cols[pk].stype.label}'")
        tcol = _str(traw, "temporal_column", where, problems, required=False)
        if tcol is not None and tcol not in cols:
            problems.append(f"{where}: temporal_column '{tcol}' is not one of its columns")
        elif tcol is not None and cols[tcol].stype != SemanticType.TIMESTAMP:
            problems.append(f"{where}: temporal_column '{tcol}' must have stype 'timestamp', not '{cols[tcol].stype.label}'")
        tables[tname] = TableMeta(
            name=tname,
            columns=cols,
            primary_key=pk,
            temporal_column=tcol,
            description=_str(traw, "description", where, problems, required=False),
        )
    # Foreign keys must point at an existing table's primary key.
    for t in tables.values():
        for c in t.foreign_keys():
            target = tables.get(c.fk_table or "")
            where = f"column '{t.name}.{c.name}'"
            if target is None:
                problems.append(f"{where}: foreign_key '{c.foreign_key}' names unknown table '{c.fk_table}'")
            elif c.fk_column not in target.columns:
                problems.append(f"{where}: foreign_key '{c.foreign_key}' names unknown column '{c.fk_column}' of '{target.name}'")
            elif target.primary_key != c.fk_column:
                problems.append(
                    f"{where}: foreign_key '{c.foreign_key}' must point at the primary key of '{target.name}'"
                    f" ({target.primary_key or 'it has none'})"
                )
    tasks_raw = raw.get("tasks", {})
    tasks: dict[str, TaskMeta] = {}
    if not isinstance(tasks_raw, dict):
        problems.append("database: 'tasks' must be an object of task name -> task")
        tasks_raw = {}
    for kname, kraw in tasks_raw.items():
        where = f"task '{kname}'"
        if not isinstance(kraw, dict):
            problems.append(f"{where}: must be an object")
            continue
        for key in kraw:
            if key not in TASK_FIELDS:
                problems.append(f"{where}: unknown field '{key}'")
        query = _str(kraw, "query", where, problems)
        anchor_table = _str(kraw, "anchor_table", where, problems)
        anchor_key = _str(kraw, "anchor_key", where, problems)
        target_column = _str(kraw, "target_column", where, problems)
        stype_name = _str(kraw, "target_stype", where, problems)
        target_stype = SemanticType.NUMERICAL
        if stype_name is not None:
            try:
                target_stype = SemanticType.parse(stype_name)
                if not target_stype.can_be_target:
                    problems.append(
                        f"{where}: target_stype '{target_stype.label}' cannot be a target"
                        " (use numerical, categorical, boolean or timestamp)"
                    )
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
        if anchor_table is not None and anchor_table not in tables:
            problems.append(f"{where}: anchor_table '{anchor_table}' is not a table of the database")
        elif anchor_table is not None and tables[anchor_table].primary_key is None:
            problems.append(f"{where}: anchor_table '{anchor_table}' has no primary key to anchor on")
        excl = kraw.get("exclude_columns", [])
        if not isinstance(excl, list) or not all(isinstance(x, str) for x in excl):
            problems.append(f"{where}: exclude_columns must be a list of column names")
            excl = []
        if anchor_table in tables:
            for x in excl:
                if x not in tables[anchor_table].columns:
                    problems.append(f"{where}: exclude_columns names '{x}', not a column of '{anchor_table}'")
        obs_column = _str(kraw, "observation_time_column", where, problems, required=False)
        split = _task_split(kraw.get("split"), where, problems)
        if split is not None and obs_column is None and anchor_table in tables \
                and tables[anchor_table].temporal_column is None:
            problems.append(f"{where}: field 'split' splits rows by observation time, but the task has none"
                            f" (no observation_time_column, and table '{anchor_table}' has no temporal_column)")
        if split is not None and split.column is not None and obs_column is None:
            problems.append(f"{where}: field 'split.column' is checked against the observation_time_column, which"
                            " the task does not have")
        horizon = _str(kraw, "horizon", where, problems, required=False)
        if horizon is not None:
            try:
                parse_horizon(horizon)
            except ValueError as exc:
                problems.append(f"{where}: field 'horizon': {exc}")
        if None in (query, anchor_table, anchor_key, target_column, stype_name):
            continue
        tasks[kname] = TaskMeta(
            name=kname,
            query=query,  # type: ignore[arg-type]
            anchor_table=anchor_table,  # type: ignore[arg-type]
            anchor_key=anchor_key,  # type: ignore[arg-type]
            target_column=target_column,  # type: ignore[arg-type]
            target_stype=target_stype,
            observation_time_column=obs_column,
            description=_str(kraw, "description", where, problems, required=False),
            exclude_columns=list(excl),
            split=split,
            horizon=horizon,
            reason=_str(kraw, "reason", where, problems, required=False),
        )
    link_tasks = _link_tasks(raw.get("link_tasks", {}), tables, set(tasks), problems)
    if problems:
        raise MetadataError(problems)
    return DatabaseMeta(name=name, tables=tables, tasks=tasks, description=raw.get("description"),
                        link_tasks=link_tasks)


def _link_tasks(raw: Any, tables: dict[str, TableMeta], task_names: set[str], problems: list[str]
                ) -> dict[str, LinkTaskMeta]:
    """The `link_tasks` object: each link task's fields, with its anchor and target tables checked against the
    tables (both need a primary key), a horizon, a k in 1..MAX_LINK_K and a temporal split."""
    out: dict[str, LinkTaskMeta] = {}
    if not isinstance(raw, dict):
        problems.append("database: 'link_tasks' must be an object of task name -> link task")
        return out
    for kname, kraw in raw.items():
        where = f"link task '{kname}'"
        if not isinstance(kraw, dict):
            problems.append(f"{where}: must be an object")
            continue
        if kname in task_names:
            problems.append(f"{where}: a task of 'tasks' has the same name (task names are unique)")
        for key in kraw:
            if key not in LINK_TASK_FIELDS:
                hint = " (a link task's target is 'target_table' + 'target_key')" if key in TASK_FIELDS else ""
                problems.append(f"{where}: unknown field '{key}'{hint}")
        values = {f: _str(kraw, f, where, problems) for f in
                  ("query", "anchor_table", "anchor_key", "observation_time_column", "target_table", "target_key")}
        for role in ("anchor_table", "target_table"):
            table = values[role]
            if table is not None and table not in tables:
                problems.append(f"{where}: {role} '{table}' is not a table of the database")
                values[role] = None
            elif table is not None and tables[table].primary_key is None:
                what = "anchor on" if role == "anchor_table" else "name its rows by"
                problems.append(f"{where}: {role} '{table}' has no primary key to {what}")
                values[role] = None
        horizon = _str(kraw, "horizon", where, problems)
        if horizon is None:
            problems[-1] += (" (how far past the observation time the links are counted, e.g. '30 days'; a link"
                             " is known once its horizon has passed)")
        else:
            try:
                parse_horizon(horizon)
            except ValueError as exc:
                problems.append(f"{where}: field 'horizon': {exc}")
                horizon = None
        k = kraw.get("k", 10)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_LINK_K:
            problems.append(f"{where}: field 'k' must be a whole number from 1 to {MAX_LINK_K} (the length of the"
                            f" ranked list scored), got {k!r}")
            k = None
        split = _task_split(kraw.get("split"), where, problems)
        if split is None and "split" not in kraw:
            problems.append(f"{where}: missing required field 'split' (a link task is split by observation time:"
                            ' {"val_time": "...", "test_time": "..."})')
        if split is not None and split.column is not None:
            problems.append(f"{where}: field 'split.column' is not supported for link tasks")
        if None in values.values() or None in (horizon, k, split):
            continue
        out[kname] = LinkTaskMeta(
            name=kname, horizon=horizon, k=k, split=split,  # type: ignore[arg-type]
            description=_str(kraw, "description", where, problems, required=False),
            reason=_str(kraw, "reason", where, problems, required=False), **values)  # type: ignore[arg-type]
    return out


def _task_split(raw: Any, where: str, problems: list[str]) -> TaskSplit | None:
    """The optional `split` of a task: {"val_time": ISO time, "test_time": later ISO time, "column": name}."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{where}: field 'split' must be an object like"
                        ' {"val_time": "2021-01-01", "test_time": "2021-04-01"}')
        return None
    for key in raw:
        if key not in SPLIT_FIELDS:
            problems.append(f"{where}: field 'split' has an unknown field '{key}' (known: {', '.join(SPLIT_FIELDS)})")
    times: dict[str, dt.datetime] = {}
    for key in ("val_time", "test_time"):
        text = _str(raw, key, f"{where}, field 'split'", problems)
        if text is None:
            continue
        try:
            times[key] = parse_time(text)
        except ValueError:
            problems.append(f"{where}: field 'split.{key}' {text!r} is not an ISO time such as '2021-01-01' or"
                            " '2021-01-01 12:00:00'")
    column = _str(raw, "column", f"{where}, field 'split'", problems, required=False)
    if len(times) < 2:
        return None
    if not times["val_time"] < times["test_time"]:
        problems.append(f"{where}: field 'split' needs val_time < test_time, got val_time {raw['val_time']!r} and"
                        f" test_time {raw['test_time']!r}")
        return None
    return TaskSplit(val_time=raw["val_time"], test_time=raw["test_time"], column=column)


def load_metadata(path: str | Path) -> DatabaseMeta:
    """Read and structurally validate a metadata JSON file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MetadataError([f"{path}: cannot read the metadata file ({exc.strerror or exc})"]) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MetadataError([f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"]) from None
    return parse_metadata(raw, source=str(path))


def save_metadata(meta: DatabaseMeta, path: str | Path) -> None:
    """Write the metadata as stable, human-reviewable JSON (2-space indent, key order preserved)."""
    Path(path).write_text(meta.dumps(), encoding="utf-8")
