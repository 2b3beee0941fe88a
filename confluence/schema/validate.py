"""Validate a metadata file against the data it describes (spec/metadata.md, "Validation").

`validate_against_data` runs every check and raises one `MetadataError` listing all problems, each naming the
table / column / task at fault. Checks that need no data (unknown stype, FK to a non-PK, a target stype that
cannot be a target, ...) already happen in `confluence.schema.metadata.parse_metadata`.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from confluence.errors import DataError, MetadataError
from confluence.schema.metadata import DatabaseMeta, LinkTaskMeta, TableMeta, TaskMeta, load_metadata
from confluence.sources import data_warnings as dw
from confluence.sources.raw import RawDatabase, quote_ident
from confluence.sources.sandbox import task_query_problem, task_subquery
from confluence.stypes import SemanticType

__all__ = ["check_against_data", "load_and_validate", "validate_against_data", "type_family"]


def type_family(t: pa.DataType) -> str:
    """Coarse family of an Arrow type: integer, float, decimal, bool, timestamp, string, binary, nested, other."""
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "timestamp"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_dictionary(t):
        return type_family(t.value_type)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_nested(t):
        return "nested"
    return "other"


_NUMERIC = ("integer", "float", "decimal")
# Key families that can be compared with each other (a FK must be comparable with its PK).
_KEY_GROUP = {"integer": "number", "decimal": "number", "float": "number", "string": "string",
              "timestamp": "timestamp", "bool": "bool", "binary": "binary"}


def _example(value: str | None, family: str) -> str:
    """Show a value fetched as VARCHAR (so no driver-side time-zone conversion is needed) for a message."""
    if value is None:
        return "NULL"
    return repr(value) if family == "string" else value


class _Checker:
    def __init__(self, meta: DatabaseMeta, raw: RawDatabase, keep_dangling: bool = False):
        self.meta, self.raw, self.keep_dangling = meta, raw, keep_dangling
        self.problems: list[str] = []
        self.found = dw.WarningList()
        self.schemas: dict[str, pa.Schema] = {}

    def q(self, sql: str) -> list[tuple]:
        return self.raw.fetchall(sql)

    def q_safe(self, sql: str) -> tuple:
        """A one-row query whose failure was already reported elsewhere: (0, None) when it fails."""
        try:
            return self.q(sql)[0]
        except duckdb.Error:
            return (0, None)

    def run(self) -> None:
        for name in self.raw.tables:
            if name not in self.meta.tables:
                self.problems.append(
                    f"table '{name}': in the data but not in the metadata (list it, with 'ignored' columns"
                    " if it should not be used)"
                )
        for table in self.meta.tables.values():
            if table.name not in self.raw.tables:
                self.problems.append(f"table '{table.name}': in the metadata but not in the data ({self.raw.path})")
                continue
            try:
                self.schemas[table.name] = self.raw.schema(table.name)
                self.check_columns(table)
            except (DataError, duckdb.Error) as exc:
                self.schemas.pop(table.name, None)
                self.problems.append(f"table '{table.name}': its data cannot be read: {str(exc).strip()}")
        for table in self.meta.tables.values():
            if table.name in self.schemas:
                try:
                    self.check_primary_key(table)
                    self.check_foreign_keys(table)
                except duckdb.Error as exc:
                    self.problems.append(f"table '{table.name}': its data cannot be read: {str(exc).strip()}")
        for task in self.meta.tasks.values():
            self.check_task(task)
        for link in self.meta.link_tasks.values():
            self.check_link_task(link)

    # -- tables and columns --------------------------------------------------------------------------------
    def check_columns(self, table: TableMeta) -> None:
        schema = self.schemas[table.name]
        floats: list[str] = []  # float numerical / categorical columns: NaN and ±inf are read as NULL
        for name in schema.names:
            if name not in table.columns:
                self.problems.append(
                    f"column '{table.name}.{name}': in the data but not in the metadata"
                    " (every column must be listed; use \"stype\": \"ignored\" to drop it)"
                )
        for col in table.columns.values():
            where = f"column '{table.name}.{col.name}'"
            if col.name not in schema.names:
                self.problems.append(f"{where}: in the metadata but not in the data")
                continue
            if col.stype == SemanticType.IGNORED:
                continue
            dtype = schema.field(col.name).type
            fam = type_family(dtype)
            if col.name == table.temporal_column and fam != "timestamp":
                self.problems.append(
                    f"{where}: is the temporal_column of '{table.name}' but holds {dtype} data,"
                    " not a timestamp or date"
                )
            elif col.stype == SemanticType.TIMESTAMP and fam != "timestamp":
                self.problems.append(f"{where}: declared timestamp but holds {dtype} data, not a timestamp or date"
                                     + self.bad_value(table.name, col.name, fam, "TIMESTAMP", "a timestamp"))
            elif col.stype == SemanticType.NUMERICAL and fam not in _NUMERIC:
                self.problems.append(f"{where}: declared numerical but holds non-numeric {dtype} data"
                                     + self.bad_value(table.name, col.name, fam, "DOUBLE", "a number"))
            elif col.stype == SemanticType.BOOLEAN:
                self.check_boolean(table.name, col.name, dtype, where)
            elif fam in ("nested", "binary", "other"):
                self.problems.append(
                    f"{where}: holds {dtype} data, which only the 'ignored' stype can take"
                )
            if fam == "float" and col.stype in (SemanticType.NUMERICAL, SemanticType.CATEGORICAL):
                floats.append(col.name)
        self.check_rows(table.name, floats)

    def bad_value(self, table: str, column: str, fam: str, sql_type: str, what: str) -> str:
        """For a text column declared numerical / timestamp: where its first value that is not `what` is."""
        if fam != "string":
            return ""
        try:
            found = self.raw.first_unconvertible(table, column, sql_type)
        except (DataError, duckdb.Error):
            return ""
        if found is None:
            return f" (every value reads as {what}: cast the column to {sql_type} in the source)"
        return f"; {found}, which is not {what}"

    def check_rows(self, table: str, floats: list[str]) -> None:
        """Data warnings from one pass over the table: no rows at all; NaN / ±inf in `floats` (read as NULL)."""
        counts = self.q("SELECT " + ", ".join(
            ["count(*)"] + [f"count(*) FILTER (WHERE isnan({quote_ident(c)})),"
                            f" count(*) FILTER (WHERE isinf({quote_ident(c)}))" for c in floats])
            + f" FROM {quote_ident(table)}")[0]
        total = int(counts[0])
        if total == 0:
            self.found.add(dw.empty_table(table))
        for i, column in enumerate(floats):
            nan, inf = int(counts[1 + 2 * i]), int(counts[2 + 2 * i])
            if nan or inf:
                self.found.add(dw.non_finite(table, column, nan, inf, total))

    def check_boolean(self, table: str, column: str, dtype: pa.DataType, where: str) -> None:
        fam = type_family(dtype)
        if fam == "bool":
            return
        if fam != "integer":
            self.problems.append(f"{where}: declared boolean but holds {dtype} data (need bool or 0/1 integers)")
            return
        c = quote_ident(column)
        n, example = self.q(
            f"SELECT count(*), min({c}) FROM {quote_ident(table)} WHERE {c} IS NOT NULL AND {c} NOT IN (0, 1)"
        )[0]
        if n:
            self.problems.append(
                f"{where}: declared boolean but {n} row(s) hold integers other than 0/1 (e.g. {example})"
            )

    def check_primary_key(self, table: TableMeta) -> None:
        pk = table.primary_key
        if pk is None or pk not in self.schemas[table.name].names:
            return
        where = f"table '{table.name}': primary key '{pk}'"
        c, t = quote_ident(pk), quote_ident(table.name)
        fam = type_family(self.schemas[table.name].field(pk).type)
        (nulls,) = self.q(f"SELECT count(*) FROM {t} WHERE {c} IS NULL")[0]
        if nulls:
            self.problems.append(f"{where} is NULL in {nulls} row(s)")
        dup_keys, dup_rows, example = self.q(
            f"SELECT count(*), coalesce(sum(n), 0), CAST(min(k) AS VARCHAR) FROM"
            f" (SELECT {c} AS k, count(*) AS n FROM {t} WHERE {c} IS NOT NULL GROUP BY {c} HAVING count(*) > 1)"
        )[0]
        if dup_keys:
            self.problems.append(
                f"{where} is not unique: {dup_keys} value(s) repeat over {dup_rows} rows (e.g. {_example(example, fam)})"
            )

    def check_foreign_keys(self, table: TableMeta) -> None:
        for col in table.foreign_keys():
            target = self.meta.tables.get(col.fk_table or "")
            if target is None or target.name not in self.schemas or col.name not in self.schemas[table.name].names:
                continue
            if col.fk_column not in self.schemas[target.name].names:
                continue
            mine = type_family(self.schemas[table.name].field(col.name).type)
            theirs = type_family(self.schemas[target.name].field(col.fk_column).type)
            if _KEY_GROUP.get(mine, mine) != _KEY_GROUP.get(theirs, theirs):
                self.problems.append(
                    f"column '{table.name}.{col.name}': foreign key holds {mine} values but"
                    f" '{col.foreign_key}' holds {theirs} values; they can never match"
                )
                continue
            c, k = quote_ident(col.name), quote_ident(col.fk_column)
            non_null, matched = self.q(
                f"SELECT count(f.v), count(p.k) FROM (SELECT {c} AS v FROM {quote_ident(table.name)}) f"
                f" LEFT JOIN (SELECT DISTINCT {k} AS k FROM {quote_ident(target.name)}) p ON f.v = p.k"
            )[0]
            if matched < non_null:
                self.found.add(dw.dangling_foreign_key(table.name, col.name, int(non_null - matched),
                                                       int(non_null), f"{target.name}.{col.fk_column}",
                                                       kept=self.keep_dangling))

    # -- tasks ---------------------------------------------------------------------------------------------
    def task_schema(self, where: str, sql: str) -> pa.Schema | None:
        """The result schema of a task's query, or None (and the problem recorded) when it ends with ';', is not
        one read-only SELECT of the tables (nothing runs then), or fails."""
        if sql.rstrip().endswith(";"):
            self.problems.append(f"{where}: its query ends with ';' (it is run as a subquery; remove the ';')")
            return None
        refused = task_query_problem(self.raw.con, sql)  # one read-only SELECT of the tables, or nothing runs
        if refused is not None:
            self.problems.append(f"{where}: {refused}")
            return None
        try:
            return self.raw.sql(f"SELECT * FROM {task_subquery(sql)} LIMIT 0").to_arrow_table().schema
        except duckdb.Error as exc:
            self.problems.append(f"{where}: its query fails: {str(exc).strip()}")
            return None

    def check_observation_time(self, where: str, query: str, schema: pa.Schema, column: str, key: str) -> None:
        """The observation-time column holds timestamps or dates, never NULL (every seed needs one)."""
        dtype = schema.field(column).type
        if type_family(dtype) != "timestamp":
            self.problems.append(f"{where}: observation_time_column '{column}' holds {dtype} data, not a timestamp"
                                 " or date")
            return
        o, k = quote_ident(column), quote_ident(key)
        n, example = self.q_safe(f"SELECT count(*), CAST(min({k}) AS VARCHAR) FROM {query} WHERE {o} IS NULL")
        if n:
            fam = type_family(schema.field(key).type)
            self.problems.append(f"{where}: observation_time_column '{column}' is NULL in {n} row(s) (e.g."
                                 f" anchor_key {_example(example, fam)}); every seed needs an observation time")

    def check_task(self, task: TaskMeta) -> None:
        where = f"task '{task.name}'"
        schema = self.task_schema(where, task.query)
        if schema is None:
            return
        query = task_subquery(task.query)
        cols = schema.names
        missing = False
        for field, name in (("anchor_key", task.anchor_key), ("target_column", task.target_column),
                            ("observation_time_column", task.observation_time_column)):
            if name is not None and name not in cols:
                self.problems.append(
                    f"{where}: {field} '{name}' is not a column of its query result (columns: {', '.join(cols)})"
                )
                missing = True
        if missing:
            return
        if task.observation_time_column is not None:
            self.check_observation_time(where, query, schema, task.observation_time_column, task.anchor_key)
        self.check_target_type(task, schema.field(task.target_column).type, where)
        if task.split is not None and task.split.column is not None:
            self.check_split_column(task, cols, where)
        self.check_keys(where, query, schema, task.anchor_key, "anchor_key", task.anchor_table, empty="seeds")

    def check_keys(self, where: str, query: str, schema: pa.Schema, key: str, field: str, table_name: str,
                   empty: str | None = None) -> None:
        """Every value of the query's column `key` names a row of `table_name` (its primary key, of the same type
        family); `empty`: what a query with no rows lacks, when that is a problem."""
        table = self.meta.tables.get(table_name)
        if table is None or table.primary_key is None or table.name not in self.schemas:
            return
        if table.primary_key not in self.schemas[table.name].names:
            return
        key_fam = type_family(schema.field(key).type)
        pk_fam = type_family(self.schemas[table.name].field(table.primary_key).type)
        if _KEY_GROUP.get(key_fam, key_fam) != _KEY_GROUP.get(pk_fam, pk_fam):
            self.problems.append(
                f"{where}: {field} '{key}' holds {key_fam} values but the primary key"
                f" '{table.name}.{table.primary_key}' holds {pk_fam} values"
            )
            return
        k, pk = quote_ident(key), quote_ident(table.primary_key)
        try:
            total, unmatched, example = self.q(
                f"SELECT count(*), count(*) FILTER (WHERE a.{pk} IS NULL), CAST(min(q.{k}) FILTER (WHERE a.{pk} IS NULL) AS VARCHAR)"
                f" FROM {query} q LEFT JOIN {quote_ident(table.name)} a ON q.{k} = a.{pk}"
            )[0]
        except duckdb.Error as exc:
            self.problems.append(f"{where}: its query fails: {str(exc).strip()}")
            return
        if total == 0 and empty is not None:
            self.problems.append(f"{where}: its query returns no rows, so the task has no {empty}")
        elif unmatched:
            self.problems.append(
                f"{where}: {unmatched} of {total} row(s) have {'an' if field[0] in 'aeiou' else 'a'} {field} '{key}' that matches no"
                f" '{table.name}' row (e.g. {_example(example, key_fam)}; NULL keys count too)"
            )

    def check_link_task(self, task: LinkTaskMeta) -> None:
        """A link task's query against the data: one read-only SELECT returning its anchor key, observation time
        and target key columns; every anchor and target key names a row; no NULL observation time."""
        where = f"link task '{task.name}'"
        schema = self.task_schema(where, task.query)
        if schema is None:
            return
        query = task_subquery(task.query)
        cols = schema.names
        missing = [(f, n) for f, n in (("anchor_key", task.anchor_key), ("target_key", task.target_key),
                                        ("observation_time_column", task.observation_time_column)) if n not in cols]
        for f, n in missing:
            self.problems.append(f"{where}: {f} '{n}' is not a column of its query result (columns: {', '.join(cols)})")
        if missing:
            return
        self.check_observation_time(where, query, schema, task.observation_time_column, task.anchor_key)
        self.check_keys(where, query, schema, task.anchor_key, "anchor_key", task.anchor_table, empty="links")
        self.check_keys(where, query, schema, task.target_key, "target_key", task.target_table)

    def check_split_column(self, task: TaskMeta, cols: list[str], where: str) -> None:
        """A task's own split with a `column` naming each row's split (a RelBench file): the cut-offs must put every
        row in the split it names, so the task's train / val / test rows are exactly the files' rows."""
        split = task.split
        assert split is not None and split.column is not None and task.observation_time_column is not None
        if split.column not in cols:
            self.problems.append(f"{where}: split.column '{split.column}' is not a column of its query result"
                                 f" (columns: {', '.join(cols)})")
            return
        o, c, k = (quote_ident(x) for x in (task.observation_time_column, split.column, task.anchor_key))
        query = task_subquery(task.query)
        # epoch_ns(o) < cut-off * 1000 is exactly "observation time floored to microseconds < cut-off", the rule
        # preprocessing and the sampler apply
        expected = (f"CASE WHEN epoch_ns({o}) < {split.val_us * 1000} THEN 'train'"
                    f" WHEN epoch_ns({o}) < {split.test_us * 1000} THEN 'val' ELSE 'test' END")
        rows = (f"SELECT CAST({c} AS VARCHAR) AS s, {expected} AS e, CAST({k} AS VARCHAR) AS k,"
                f" CAST({o} AS VARCHAR) AS t FROM {query} WHERE {o} IS NOT NULL")
        try:
            total, wrong = self.q(f"SELECT count(*), count(*) FILTER (WHERE s IS DISTINCT FROM e) FROM ({rows})")[0]
            if wrong:
                s, e, key, t = self.q(f"SELECT s, e, k, t FROM ({rows}) WHERE s IS DISTINCT FROM e"
                                      " ORDER BY t, k LIMIT 1")[0]
        except duckdb.Error as exc:
            self.problems.append(f"{where}: its split column cannot be checked: {str(exc).strip()}")
            return
        if wrong:
            self.problems.append(
                f"{where}: {wrong} of {total} row(s) are not in the split their column '{split.column}' names under"
                f" split.val_time {split.val_time!r} and split.test_time {split.test_time!r} (e.g."
                f" {task.anchor_key} {key} observed at {t} is named {s!r} but the cut-offs make it {e!r})")

    def check_target_type(self, task: TaskMeta, dtype: pa.DataType, where: str) -> None:
        fam = type_family(dtype)
        st = task.target_stype
        ok = {
            SemanticType.NUMERICAL: fam in _NUMERIC or fam == "bool",
            SemanticType.TIMESTAMP: fam == "timestamp",
            SemanticType.BOOLEAN: fam in ("bool", "integer"),
            SemanticType.CATEGORICAL: fam in ("string", "integer", "bool", "decimal", "float", "timestamp"),
        }.get(st, True)
        if not ok:
            self.problems.append(
                f"{where}: target_column '{task.target_column}' holds {dtype} data, which cannot be a"
                f" {st.label} target"
            )
        elif st == SemanticType.BOOLEAN and fam == "integer":
            c, query = quote_ident(task.target_column), task_subquery(task.query)
            n, example = self.q_safe(
                f"SELECT count(*), min({c}) FROM {query} WHERE {c} IS NOT NULL AND {c} NOT IN (0, 1)"
            )
            if n:
                self.problems.append(
                    f"{where}: boolean target_column '{task.target_column}' holds integers other than 0/1"
                    f" in {n} row(s) (e.g. {example})"
                )


def check_against_data(meta: DatabaseMeta, raw: RawDatabase, *, keep_dangling: bool = False
                       ) -> tuple[list[str], list[dw.DataWarning]]:
    """Every problem of `meta` against the data in `raw` (one line each) and every data warning (a NaN or ±inf
    read as NULL, a foreign key whose values match no key, an empty table), without raising or warning.
    `keep_dangling`: the warnings say unmatched keys become key-only rows (preprocess's `dangling_keys="keep"`)."""
    checker = _Checker(meta, raw, keep_dangling)
    checker.run()
    return checker.problems, checker.found.items


def validate_against_data(meta: DatabaseMeta, raw: RawDatabase, *, strict: bool = False) -> None:
    """Check `meta` against the data in `raw`; raise one MetadataError listing every problem found.

    Data warnings (`confluence.sources.data_warnings.DataWarning`) are issued with `warnings.warn`; with
    `strict=True` they are problems of the MetadataError instead.
    """
    _validate(meta, raw, strict, stacklevel=4)


def load_and_validate(path: str | Path, raw: RawDatabase, *, strict: bool = False) -> DatabaseMeta:
    """Load a metadata file (structural checks) and validate it against the data; returns the metadata."""
    meta = load_metadata(path)
    _validate(meta, raw, strict, stacklevel=4)
    return meta


def _validate(meta: DatabaseMeta, raw: RawDatabase, strict: bool, stacklevel: int) -> None:
    problems, found = check_against_data(meta, raw)
    if strict:
        problems = problems + [f"{w} (a warning; strict mode makes it an error)" for w in found]
    else:
        warned = dw.WarningList()
        warned.extend(found)
        warned.emit(stacklevel=stacklevel)
    if problems:
        raise MetadataError(problems)
