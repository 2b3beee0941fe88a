"""Draft a metadata file from the raw data (spec/metadata.md, "Drafting metadata automatically").

The draft is deterministic (same data -> same bytes) and explains itself: every column carries a `reason`
(why this stype / key / foreign key) and every table a `description` (why this primary key and temporal column).
Large tables are read through a systematic sample (every k-th row in the source's order), so drafting a big
database stays fast; a primary key found on the sample is confirmed on the whole table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from confluence.schema.metadata import ColumnMeta, DatabaseMeta, TableMeta, TaskMeta
from confluence.schema.relbench import draft_relbench_tasks
from confluence.schema.validate import type_family
from confluence.sources import data_warnings as dw
from confluence.sources.raw import RawDatabase, quote_ident
from confluence.stypes import SemanticType

__all__ = ["draft_metadata", "FK_CONTAINMENT", "FK_CONTAINMENT_STRING", "FK_CONTAINMENT_NAMED"]

# Fraction of a column's non-null (sampled) values that must be keys of the other table for a foreign key:
FK_CONTAINMENT = 0.99  # any integer / string column whose name looks like a key
FK_CONTAINMENT_STRING = 0.95  # string codes with many distinct values (a chance match is unlikely)
FK_CONTAINMENT_NAMED = 0.50  # the column's name agrees with the referenced table / key (real data dangles)
FK_STRING_MIN_DISTINCT = 10
CATEGORICAL_MAX_INT_DISTINCT = 10  # integer codes with at most this many values are categorical
CATEGORICAL_MAX_DISTINCT = 10_000
CATEGORICAL_MAX_RATIO = 0.5  # distinct / non-null at most this for a string to be categorical
TEXT_MIN_AVG_LEN = 30.0
NEAR_CONSTANT = 0.99  # a column whose most frequent value covers this share gets no task
PK_MAX_STRING_LEN = 64
MOSTLY_NUMBERS = 0.95  # a text column with at least this share (not all) of numbers among its values: a warning

_CREATION = re.compile(
    r"creat|insert|regist|sign(ed)?_?up|join|order|post|publish|open|submit|start|begin|sched|birth|born|issued|placed"
)
_TIMEY = re.compile(r"(^|_)(date|time|timestamp|ts|at|on|day|hour)($|_)|date|time")
_NOT_CREATION = re.compile(r"updat|modif|delet|(^|_)end|closed|due|expir|cancel|last|arr|finish|stop|until")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _singular(name: str) -> str:
    n = _norm(name)
    if n.endswith("ies"):
        return n[:-3] + "y"
    if n.endswith("s") and not n.endswith("ss"):
        return n[:-1]
    return n


def id_like(name: str) -> bool:
    """Does a column name look like a key (`id`, `*_id`, `*Id`, `*ID`, `*_key`, `uuid`)?"""
    low = name.lower()
    return (low in ("id", "uuid", "key") or low.endswith(("_id", "_key", "_uuid")) or low.startswith("id_")
            or re.search(r"[a-z0-9](Id|ID)$", name) is not None)


def names_agree(column: str, table: str, key: str) -> bool:
    """Does a column's name point at `table.key` (`customer_id` -> customers.customer_id / customers.id)?"""
    c, k, t, ts = _norm(column), _norm(key), _norm(table), _singular(table)
    if k != "id" and c == k:
        return True
    if c in {t + k, ts + k, t + "id", ts + "id", t, ts} and c != "":
        return True
    return k != "id" and len(k) >= 4 and c.endswith(k)


@dataclass
class _Stats:
    name: str
    position: int
    dtype: pa.DataType
    fam: str
    non_null: int = 0
    distinct: int = 0
    top_share: float = 0.0
    top_value: object = None
    avg_len: float = 0.0
    max_len: int = 0
    only_01: bool = False
    has_space: float = 0.0  # share of non-null strings containing whitespace
    numbers: int = 0  # strings: how many non-null values read as numbers

    @property
    def ratio(self) -> float:
        return self.distinct / self.non_null if self.non_null else 0.0


class _Drafter:
    def __init__(self, raw: RawDatabase, sample_rows: int):
        self.raw = raw
        self.sample_rows = sample_rows
        self.cur = raw.con.cursor()  # registered samples are local to this cursor
        self.sources: dict[str, str] = {}  # table -> relation to read its (sampled) rows from
        self.rows: dict[str, int] = {}
        self.sampled: dict[str, bool] = {}
        self.stats: dict[str, dict[str, _Stats]] = {}
        self.found = dw.WarningList()
        # where the source's own key hints come from, for the reasons
        self.recorded_in = "the PostgreSQL catalog" if raw.kind == "postgresql" else "the RelBench metadata"

    def q(self, sql: str) -> list[tuple]:
        return self.cur.execute(sql).fetchall()

    # -- sampling and statistics -------------------------------------------------------------------------
    def load(self, table: str, index: int) -> None:
        n = self.raw.num_rows(table)
        self.rows[table] = n
        # The (sampled) rows are loaded once into Arrow and registered on this cursor: every statistic below
        # then reads memory, not the source (a CSV view would be parsed again by each query).
        self.sampled[table] = n > self.sample_rows
        stride = math.ceil(n / self.sample_rows) if self.sampled[table] else 1
        parts, offset = [], 0
        for batch in self.raw.scan(table, batch_rows=max(stride * 8192, 65536)):
            size = batch.num_rows
            if stride > 1:  # rows 0, stride, 2*stride, ... of the whole table
                batch = batch.take(pa.array(range((-offset) % stride, size, stride), pa.int64()))
            parts.append(batch)
            offset += size
        rel = f"__draft_sample_{index}"
        schema = self.raw.schema(table)
        self.cur.register(rel, pa.Table.from_batches(parts, schema=schema))
        self.sources[table] = rel
        stats: dict[str, _Stats] = {}
        for pos, field in enumerate(schema):
            s = _Stats(field.name, pos, field.type, type_family(field.type))
            stats[field.name] = s
            if s.fam in ("nested", "binary", "other"):
                continue
            c = quote_ident(field.name)
            s.non_null, s.distinct = self.q(f"SELECT count({c}), count(DISTINCT {c}) FROM {rel}")[0]
            if s.non_null:
                top = self.q(
                    f"SELECT CAST({c} AS VARCHAR), count(*) AS n FROM {rel} WHERE {c} IS NOT NULL GROUP BY {c}"
                    f" ORDER BY n DESC, {c} LIMIT 1"
                )[0]
                s.top_value, s.top_share = top[0], top[1] / s.non_null
            if s.fam == "string" and s.non_null:
                # integer sums, so parallel aggregation cannot change the last bits of a ratio
                total, mx, spaces, numbers = self.q(
                    f"SELECT sum(length({c})), max(length({c})),"
                    f" count(*) FILTER (WHERE regexp_matches({c}, '\\s')), count(TRY_CAST({c} AS DOUBLE)) FROM {rel}"
                )[0]
                s.avg_len, s.max_len, s.has_space = total / s.non_null, int(mx), spaces / s.non_null
                s.numbers = int(numbers)
            if s.fam in ("integer", "float", "decimal") and s.non_null:
                (bad,) = self.q(f"SELECT count(*) FROM {rel} WHERE {c} NOT IN (0, 1)")[0]
                s.only_01 = bad == 0 and s.distinct == 2
        self.stats[table] = stats
        self.warn(table)

    def warn(self, table: str) -> None:
        """Data warnings of one table: empty, NaN / ±inf in float columns, text columns of numbers but a few."""
        if self.rows[table] == 0:
            self.found.add(dw.empty_table(table))
            return
        t = quote_ident(table)
        floats = [s for s in self.stats[table].values() if s.fam == "float"]
        if floats:  # counted over the whole table, in one pass
            counts = self.q("SELECT " + ", ".join(
                f"count(*) FILTER (WHERE isnan({quote_ident(s.name)})),"
                f" count(*) FILTER (WHERE isinf({quote_ident(s.name)}))" for s in floats) + f" FROM {t}")[0]
            for i, s in enumerate(floats):
                nan, inf = int(counts[2 * i]), int(counts[2 * i + 1])
                if nan or inf:
                    self.found.add(dw.non_finite(table, s.name, nan, inf, self.rows[table]))
        for s in self.stats[table].values():
            if s.fam != "string" or s.numbers == s.non_null or s.numbers < MOSTLY_NUMBERS * s.non_null:
                continue  # (the sample decides; the counts and the example come from the whole table)
            c = quote_ident(s.name)
            non_null, numbers = self.q(f"SELECT count({c}), count(TRY_CAST({c} AS DOUBLE)) FROM {t}")[0]
            example = self.raw.first_unconvertible(table, s.name, "DOUBLE")
            if example is not None:
                self.found.add(dw.mostly_numbers(table, s.name, int(numbers), int(non_null), example))

    # -- keys --------------------------------------------------------------------------------------------
    def primary_key(self, table: str) -> tuple[str | None, str]:
        hint = self.raw.hints.get(table)
        if hint is not None and hint.primary_key:
            return hint.primary_key, f"primary key '{hint.primary_key}': recorded in {self.recorded_in}"
        candidates = []
        for s in self.stats[table].values():
            if s.fam not in ("integer", "string") or s.non_null == 0 or self.rows[table] == 0:
                continue
            full = not self.sampled[table]
            if s.distinct != s.non_null or (full and s.non_null != self.rows[table]):
                continue
            if s.fam == "string" and s.max_len > PK_MAX_STRING_LEN:
                continue
            named = _norm(s.name) in {"id", _norm(table) + "id", _singular(table) + "id"}
            if s.fam == "integer" and not (id_like(s.name) or s.position == 0):
                continue
            candidates.append(((not named, not id_like(s.name), s.position), s))
        for _, s in sorted(candidates, key=lambda x: x[0]):
            c = quote_ident(s.name)
            ok = self.q(
                f"SELECT count({c}) = count(*) AND count(DISTINCT {c}) = count(*) FROM {quote_ident(table)}"
            )[0][0]
            if not ok:
                continue
            if _norm(s.name) in {"id", _norm(table) + "id", _singular(table) + "id"}:
                why = "its name says it is the table's id"
            elif id_like(s.name):
                why = "its name looks like a key"
            else:
                why = "it is the first column" if s.position == 0 else "it is a short unique code"
            return s.name, (f"primary key '{s.name}': unique and never NULL over all {self.rows[table]} rows,"
                            f" {s.fam} values, and {why}")
        return None, "no primary key: no integer or short string column is unique and never NULL"

    def foreign_key(self, table: str, s: _Stats, pks: dict[str, str]) -> tuple[str | None, str]:
        hint = self.raw.hints.get(table)
        if hint is not None and s.name in hint.foreign_keys:
            target = hint.foreign_keys[s.name]
            if target in pks:
                return f"{target}.{pks[target]}", f"foreign key to {target}.{pks[target]}: recorded in {self.recorded_in}"
        if s.fam not in ("integer", "string") or s.non_null == 0 or pks.get(table) == s.name:
            return None, ""
        best: tuple | None = None
        for target, pk in pks.items():
            named = names_agree(s.name, target, pk)
            if target == table and (not named or _norm(s.name) in {_norm(table), _singular(table)}):
                continue  # self-references only when the name says so (flights.flight is not a flight_id)
            if s.fam == "integer" and not (named or id_like(s.name)):
                continue  # small integers (counts, codes) are contained in any surrogate-key range by chance
            pk_fam = self.stats[target][pk].fam
            if pk_fam != s.fam:
                continue
            c = quote_ident(s.name)
            # all keys of the target: its in-memory copy when that holds every row, else the source itself
            keys = quote_ident(target) if self.sampled[target] else self.sources[target]
            (matched, total) = self.q(
                f"SELECT count(p.k), count(*) FROM"
                f" (SELECT {c} AS v FROM {self.sources[table]} WHERE {c} IS NOT NULL) s"
                f" LEFT JOIN (SELECT {quote_ident(pk)} AS k FROM {keys}) p ON s.v = p.k"
            )[0]
            share = matched / total
            if share >= FK_CONTAINMENT:
                rule = f"{share:.1%} of its non-null values are keys of {target}"
            elif s.fam == "string" and s.distinct >= FK_STRING_MIN_DISTINCT and share >= FK_CONTAINMENT_STRING:
                rule = f"{share:.1%} of its non-null values ({s.distinct} distinct codes) are keys of {target}"
            elif named and share >= FK_CONTAINMENT_NAMED:
                rule = f"its name matches {target}.{pk} and {share:.1%} of its non-null values are keys of {target}"
            else:
                continue
            rank = (named, share, target != table)
            if best is None or rank > best[0]:
                tie = " (name agreement broke a tie)" if best is not None and named and not best[0][0] else ""
                best = (rank, f"{target}.{pk}", f"foreign key to {target}.{pk}: {rule}{tie}")
        if best is None:
            return None, ""
        return best[1], best[2]

    # -- semantic types ----------------------------------------------------------------------------------
    def stype(self, s: _Stats) -> tuple[SemanticType, str]:
        t = str(s.dtype)
        if s.fam in ("nested", "binary", "other"):
            return SemanticType.IGNORED, f"{t} values cannot be encoded"
        if s.non_null == 0:
            return SemanticType.IGNORED, "always NULL"
        if s.fam == "timestamp":
            return SemanticType.TIMESTAMP, f"{t} is a timestamp / date type"
        if s.distinct == 1:
            return SemanticType.IGNORED, f"constant: every non-null value is {s.top_value!r}"
        if s.fam == "bool":
            return SemanticType.BOOLEAN, f"{t} is a boolean type"
        if s.only_01:
            return SemanticType.BOOLEAN, f"{t} holding only 0 and 1"
        if s.fam == "integer":
            if id_like(s.name):
                return SemanticType.IDENTIFIER, f"{t} whose name looks like a key"
            if s.distinct <= CATEGORICAL_MAX_INT_DISTINCT:
                return SemanticType.CATEGORICAL, f"integer code with only {s.distinct} distinct values"
            return SemanticType.NUMERICAL, f"{t} with {s.distinct} distinct values"
        if s.fam in ("float", "decimal"):
            return SemanticType.NUMERICAL, f"{t} with {s.distinct} distinct values"
        # strings
        if id_like(s.name):
            return SemanticType.IDENTIFIER, "string whose name looks like a key"
        shape = f"{s.distinct} distinct of {s.non_null} non-null, mean length {s.avg_len:.1f}"
        if s.avg_len >= TEXT_MIN_AVG_LEN and s.distinct > 20:
            return SemanticType.TEXT, f"long strings ({shape})"
        if s.ratio >= 0.9 and s.non_null > 1:
            return SemanticType.IDENTIFIER, f"short, mostly unique strings such as names or codes ({shape})"
        if s.distinct <= CATEGORICAL_MAX_DISTINCT and s.ratio <= CATEGORICAL_MAX_RATIO:
            return SemanticType.CATEGORICAL, f"low-cardinality strings ({shape})"
        if s.has_space >= 0.5:
            return SemanticType.TEXT, f"many distinct strings, mostly with spaces ({shape})"
        return SemanticType.IDENTIFIER, f"many distinct short strings without spaces ({shape})"

    def temporal(self, table: str, cols: dict[str, ColumnMeta]) -> tuple[str | None, str]:
        hint = self.raw.hints.get(table)
        if hint is not None and hint.temporal_column:
            return hint.temporal_column, f"temporal column '{hint.temporal_column}': recorded in {self.recorded_in}"
        if hint is not None and self.raw.kind == "relbench":
            return None, "no temporal column: the RelBench metadata records none (a static table)"
        options = []
        for c in cols.values():
            if c.stype != SemanticType.TIMESTAMP:
                continue
            s = self.stats[table][c.name]
            low = c.name.lower()
            score = 2 if _CREATION.search(low) else 1 if _TIMEY.search(low) else 0
            if _NOT_CREATION.search(low):
                score -= 2
            options.append(((-score, -s.non_null, s.position), c.name, score))
        if not options:
            return None, "no temporal column: the table has no timestamp column (a static table)"
        options.sort()
        _, name, score = options[0]
        why = {2: "its name says when the row was created", 1: "its name looks like a point in time"}.get(
            score, "the best-filled timestamp column")
        more = f" (of {len(options)} timestamp columns)" if len(options) > 1 else " (the only timestamp column)"
        return name, f"temporal column '{name}': {why}{more}"

    # -- the draft ---------------------------------------------------------------------------------------
    def draft(self, name: str) -> DatabaseMeta:
        for i, table in enumerate(self.raw.tables):
            self.load(table, i)
        pk_info = {t: self.primary_key(t) for t in self.raw.tables}
        pks = {t: pk for t, (pk, _) in pk_info.items() if pk is not None}
        tables: dict[str, TableMeta] = {}
        for table in self.raw.tables:
            pk, pk_why = pk_info[table]
            cols: dict[str, ColumnMeta] = {}
            for s in self.stats[table].values():
                if s.name == pk:
                    cols[s.name] = ColumnMeta(s.name, SemanticType.IDENTIFIER, reason=pk_why)
                    continue
                fk, fk_why = self.foreign_key(table, s, pks)
                if fk is not None:
                    cols[s.name] = ColumnMeta(s.name, SemanticType.IDENTIFIER, foreign_key=fk, reason=fk_why)
                    continue
                stype, why = self.stype(s)
                if self.rows[table] == 0 and stype == SemanticType.IGNORED:
                    why = "the table has no rows"
                cols[s.name] = ColumnMeta(s.name, stype, reason=why)
            tcol, t_why = self.temporal(table, cols)
            sample = (f"; statistics from a systematic sample of {self.sample_rows} of {self.rows[table]} rows"
                      if self.sampled[table] else "")
            tables[table] = TableMeta(table, cols, primary_key=pk, temporal_column=tcol,
                                      description=f"{pk_why}. {t_why}{sample}.")
        if self.raw.kind != "relbench":
            return DatabaseMeta(name=name, tables=tables, tasks=self.tasks(tables))
        # RelBench task folders: their tasks and split (may make autocomplete targets ignored, so first)
        rb = draft_relbench_tasks(self.raw, tables, self.found)
        tasks = {**rb.split_cell_masking(self.raw, tables, self.tasks(tables)), **rb.tasks}
        return DatabaseMeta(name=name, tables=tables, tasks=tasks, description=rb.description())

    def tasks(self, tables: dict[str, TableMeta]) -> dict[str, TaskMeta]:
        out: dict[str, TaskMeta] = {}
        for t in tables.values():
            if t.primary_key is None:
                continue
            for c in t.columns.values():
                s = self.stats[t.name][c.name]
                if not c.stype.can_be_target or c.name == t.temporal_column or s.top_share >= NEAR_CONSTANT:
                    continue
                name = f"{t.name}.{c.name}"
                out[name] = TaskMeta(
                    name=name,
                    query=f"SELECT {quote_ident(t.primary_key)}, {quote_ident(c.name)} FROM {quote_ident(t.name)}",
                    anchor_table=t.name, anchor_key=t.primary_key, target_column=c.name, target_stype=c.stype,
                    description=f"cell masking: predict {c.name} of a row of {t.name}",
                )
        return out


def draft_metadata(raw: RawDatabase, name: str | None = None, sample_rows: int = 100_000, *,
                   strict: bool = False) -> DatabaseMeta:
    """Draft metadata for a raw database: stypes, keys, foreign keys, temporal columns, cell-masking tasks.

    Deterministic for the same data; every choice carries its reason. A RelBench folder's `tasks/` become derived
    tasks with RelBench's split (`confluence.schema.relbench`). Tables with more than `sample_rows` rows
    are read through a systematic sample of about `sample_rows` rows. Data warnings (an empty table, NaN / ±inf
    in a float column, a text column of numbers but a few values) are issued with `warnings.warn`
    (`confluence.sources.data_warnings.DataWarning`); `strict=True` raises a `StrictDataError` listing them.
    """
    if sample_rows < 1:
        raise ValueError(f"sample_rows must be positive, got {sample_rows}")
    drafter = _Drafter(raw, sample_rows)
    try:
        meta = drafter.draft(name or raw.name)
    except duckdb.Error as exc:
        from confluence.errors import DataError

        raise DataError(f"{raw.path}: cannot draft metadata, DuckDB failed: {exc}") from None
    finally:
        drafter.cur.close()
    drafter.found.check_strict(strict)
    drafter.found.emit()
    return meta
