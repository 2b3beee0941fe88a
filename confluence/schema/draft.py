"""Draft a metadata file from the raw data (spec/metadata.md, "Drafting metadata automatically").

The draft is deterministic (same data -> same bytes) and explains itself: every column carries a `reason`
(why this stype / key / foreign key) and every table a `description` (why this primary key and temporal column).
Large tables are read through a systematic sample (every k-th row in the source's order), so drafting a big
database stays fast; a primary key found on the sample is confirmed on the whole table.

What it cannot decide it says, in the explanations and as a `DataWarning` (printed by `draft-metadata`): a key-like
column that is unique but for a few repeated or NULL values (`near_unique_key`: no primary key is guessed from
another column), and a table's own identifier column whose values happen to be keys of another table
(`chance_key_overlap`: no foreign key without a name pointing there).
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
NEAR_UNIQUE = 0.95  # a key-like column this unique and this filled, but not wholly: "looks like the key" (a warning)

_CREATION = re.compile(
    r"creat|insert|regist|sign(ed)?_?up|join|order|post|publish|open|submit|start|begin|sched|birth|born|issued|placed"
)
_TIMEY = re.compile(r"(^|_)(date|time|timestamp|ts|at|on|day|hour)($|_)|date|time")
_NOT_CREATION = re.compile(r"updat|modif|delet|(^|_)end|closed|due|expir|cancel|last|arr|finish|stop|until")
# words of a column pointing at another row of its own table (employees.manager_id, comments.parent_id)
_SELF_WORDS = re.compile(
    r"(^|_)(manager|parent|boss|supervisor|superior|mentor|reports?_?to|referr(er|ed_?by)|predecessor|successor"
    r"|prev(ious)?|next|original|replace[sd]?(_?by)?|reply(_?to)?|replied(_?to)?|in_?reply_?to|ancestor|root|master"
    r"|merged_?into|spouse|sponsor)($|_)")


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


def _snake(name: str) -> str:
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def own_id_name(column: str, table: str) -> bool:
    """Is a column named as its own table's identifier (`id`, `customer_id` / `customers_id` in customers)?"""
    return _norm(column) in {"id", _norm(table) + "id", _singular(table) + "id"}


def self_reference_name(column: str, table: str, key: str) -> bool:
    """Does a column's name say it points at another row of its own table: `manager_id`, `parent_id`, `ReportsTo`,
    or a name agreeing with the table's key other than the table's own name (`previous_order_id` in orders)?"""
    if own_id_name(column, table) or _norm(column) in {_norm(table), _singular(table)}:
        return False
    return names_agree(column, table, key) or _SELF_WORDS.search(_snake(column)) is not None


def names_agree(column: str, table: str, key: str) -> bool:
    """Does a column's name point at `table.key` (`customer_id` -> customers.customer_id / customers.id)?"""
    c, k, t, ts = _norm(column), _norm(key), _norm(table), _singular(table)
    if k != "id" and c == k:
        return True
    if c in {t + k, ts + k, t + "id", ts + "id", t, ts} and c != "":
        return True
    return k != "id" and len(k) >= 4 and c.endswith(k)


@dataclass(frozen=True)
class _NearKey:
    """A key-like column unique and never NULL but for a few rows (found over the whole table)."""

    column: str
    repeated: int  # how many distinct values occur more than once
    example: object  # the most repeated value (the smallest among equals)
    example_count: int
    nulls: int
    rows: int  # rows concerned: holding a repeated value or NULL

    def text(self) -> str:
        """`looks like the table's key but 1 value repeats (customer_id 17 twice)`."""
        parts = []
        if self.repeated:
            value = self.example if isinstance(self.example, int) else repr(self.example)
            times = "twice" if self.example_count == 2 else f"{self.example_count} times"
            verb = "value repeats" if self.repeated == 1 else "values repeat"
            parts.append(f"{self.repeated} {verb} ({self.column} {value} {times})")
        if self.nulls:
            parts.append(f"{self.nulls} row{' has' if self.nulls == 1 else 's have'} no {self.column} (NULL)")
        return "looks like the table's key but " + " and ".join(parts)


def _near_unique_warning(table: str, near: _NearKey) -> dw.DataWarning:
    return dw.DataWarning(
        f"column '{table}.{near.column}': {near.text()}: no primary key drafted; fix the data or set it by hand",
        code="near_unique_key", table=table, column=near.column, rows=near.rows)


def _chance_overlap_warning(table: str, column: str, share: float, target: str, key: str) -> dw.DataWarning:
    return dw.DataWarning(
        f"column '{table}.{column}': {share:.1%} of its non-null values are keys of {target}.{key}, but it is the"
        f" identifier column of {table} itself and its name does not point at {target}: no foreign key drafted (a"
        " chance overlap?); set it by hand if it is one", code="chance_key_overlap", table=table, column=column)


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
        self.sample_n: dict[str, int] = {}  # rows in the (sampled) in-memory copy
        self.near: dict[str, _NearKey] = {}  # table -> its near-unique key column (see near_key)
        self.unsure: set[str] = set()  # tables without a primary key because of their near-unique key column
        self.passed_over: dict[str, str] = {}  # table -> its unique column not drafted as the key (see near_key_first)
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
        self.sample_n[table] = sum(b.num_rows for b in parts)
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
            if s.fam == "integer" and not (id_like(s.name) or s.position == 0):
                continue
            candidates.append((_pk_rank(table, s), s))
        for _, s in sorted(candidates, key=lambda x: x[0]):
            c = quote_ident(s.name)
            ok = self.q(
                f"SELECT count({c}) = count(*) AND count(DISTINCT {c}) = count(*) FROM {quote_ident(table)}"
            )[0][0]
            if not ok:
                continue
            if own_id_name(s.name, table):
                why = "its name says it is the table's id"
            elif id_like(s.name):
                why = "its name looks like a key"
            else:
                why = "it is the first column" if s.position == 0 else "it is a short unique code"
            if self.near_key_first(table, s):  # customers.customer_id repeats: no guess from customers.email
                self.passed_over[table] = s.name
                return None, (f"no primary key: '{s.name}' is unique, but {self.near[table].column} is named as the"
                              " table's key")
            return s.name, (f"primary key '{s.name}': unique and never NULL over all {self.rows[table]} rows,"
                            f" {s.fam} values, and {why}")
        self.near_key_first(table, None)
        return None, "no primary key: no integer or short string column is unique and never NULL"

    def near_key_first(self, table: str, pk: _Stats | None) -> bool:
        """Record the table's near-unique key column (`near_key`). True when it is named as the table's id and the
        unique column `pk` is not: then no primary key is drafted. Without a primary key the draft says why (in
        `draft`, unless that column is a foreign key after all)."""
        near = self.near_key(table, pk.name if pk is not None else None)
        if near is not None:
            self.near[table] = near
            first = pk is not None and own_id_name(near.column, table) and not own_id_name(pk.name, table)
            if pk is None or first:
                self.unsure.add(table)
            return first
        return False

    def near_key(self, table: str, pk: str | None) -> _NearKey | None:
        """The best-ranked key-like column (as for the primary key) that is unique and never NULL but for a few
        rows (at least NEAR_UNIQUE of its values distinct and of its rows filled): a key with a data error more
        likely than no key. Decided on the sample, counted over the whole table."""
        n = self.sample_n[table]
        near = [s for s in self.stats[table].values()
                if s.name != pk and s.fam in ("integer", "string") and id_like(s.name) and s.non_null
                and not (s.fam == "string" and s.max_len > PK_MAX_STRING_LEN)
                and s.distinct >= NEAR_UNIQUE * s.non_null and s.non_null >= NEAR_UNIQUE * n]
        t = quote_ident(table)
        for s in sorted(near, key=lambda s: _pk_rank(table, s)):
            c = quote_ident(s.name)
            rows, non_null, distinct = self.q(f"SELECT count(*), count({c}), count(DISTINCT {c}) FROM {t}")[0]
            if distinct == non_null == rows or distinct < NEAR_UNIQUE * non_null or non_null < NEAR_UNIQUE * rows:
                continue  # unique after all (a worse-ranked column than the key), or not nearly so on all rows
            repeated, in_repeats = self.q(
                f"SELECT count(*), coalesce(sum(n), 0) FROM (SELECT count(*) AS n FROM {t} WHERE {c} IS NOT NULL"
                f" GROUP BY {c} HAVING count(*) > 1)")[0]
            example, count = None, 0
            if repeated:
                example, count = self.q(f"SELECT {c}, count(*) AS n FROM {t} WHERE {c} IS NOT NULL GROUP BY {c}"
                                        f" HAVING count(*) > 1 ORDER BY n DESC, {c} LIMIT 1")[0]
            return _NearKey(s.name, int(repeated), example, int(count), int(rows - non_null),
                            int(in_repeats) + int(rows - non_null))
        return None

    def own_identifier(self, table: str, column: str) -> bool:
        """Is a column its table's own identifier: named like it (`id`, `customer_id` in customers) or its
        near-unique key? Such a column links to another table only when its name says so."""
        near = self.near.get(table)
        return own_id_name(column, table) or (near is not None and near.column == column)

    def foreign_key(self, table: str, s: _Stats, pks: dict[str, str]) -> tuple[str | None, str]:
        """The foreign key of a column and its reason, or (None, why not) where that needs saying ("" else).

        A column whose name points at some table (`customer_id` -> customers) links to no other table on value
        overlap alone, nor does the table's own identifier column (`own_identifier`: `chance_key_overlap` when its
        values overlap another key); a self-reference needs a name saying so (`self_reference_name`)."""
        hint = self.raw.hints.get(table)
        if hint is not None and s.name in hint.foreign_keys:
            target = hint.foreign_keys[s.name]
            if target in pks:
                return f"{target}.{pks[target]}", f"foreign key to {target}.{pks[target]}: recorded in {self.recorded_in}"
        if s.fam not in ("integer", "string") or s.non_null == 0 or pks.get(table) == s.name:
            return None, ""
        own = self.own_identifier(table, s.name)
        pointed = [t for t in self.raw.tables if t != table and names_agree(s.name, t, pks.get(t, "id"))]
        best: tuple | None = None
        chance: tuple[float, str, str] | None = None  # (share, target, key) refused for an own identifier
        for target, pk in pks.items():
            if target == table:
                named = not own and not pointed and self_reference_name(s.name, table, pk)
                if not named:
                    continue  # self-references only when the name says so (flights.flight is not a flight_id)
            else:
                named = names_agree(s.name, target, pk)
                if pointed and not named:
                    continue  # orders.customer_id is about customers, even where customers has no key
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
            if target == table and not names_agree(s.name, table, pk):
                if share < FK_CONTAINMENT:
                    continue  # a self-reference by its name's word alone: all its values are keys of the table
                rule = (f"a self-reference: {share:.1%} of its non-null values are keys of {table} itself and its"
                        " name says it points at another row")
            elif share >= FK_CONTAINMENT:
                rule = f"{share:.1%} of its non-null values are keys of {target}"
            elif s.fam == "string" and s.distinct >= FK_STRING_MIN_DISTINCT and share >= FK_CONTAINMENT_STRING:
                rule = f"{share:.1%} of its non-null values ({s.distinct} distinct codes) are keys of {target}"
            elif named and share >= FK_CONTAINMENT_NAMED:
                rule = f"its name matches {target}.{pk} and {share:.1%} of its non-null values are keys of {target}"
            else:
                continue
            if own and not named:
                if chance is None or share > chance[0]:
                    chance = (share, target, pk)
                continue
            rank = (named, share, target != table)
            if best is None or rank > best[0]:
                tie = " (name agreement broke a tie)" if best is not None and named and not best[0][0] else ""
                best = (rank, f"{target}.{pk}", f"foreign key to {target}.{pk}: {rule}{tie}")
        if best is not None:
            return best[1], best[2]
        if chance is not None:
            share, target, pk = chance
            self.found.add(_chance_overlap_warning(table, s.name, share, target, pk))
            return None, (f"not a foreign key to {target}.{pk} although {share:.1%} of its non-null values are its"
                          f" keys: it is the identifier column of {table} itself and its name does not point at"
                          f" {target} (a chance overlap?)")
        keyless = [t for t in pointed if t not in pks]
        if keyless:
            return None, f"no foreign key: its name points at {keyless[0]}, which has no primary key"
        return None, ""

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
            fks = {s.name: self.foreign_key(table, s, pks) for s in self.stats[table].values() if s.name != pk}
            near = self.near.get(table) if table in self.unsure else None
            if near is not None and fks[near.column][0] is None:  # (a foreign key that repeats is no key)
                self.found.add(_near_unique_warning(table, near))
                other = (f" ('{self.passed_over[table]}' is unique, but {near.column} is named as the table's key)"
                         if table in self.passed_over else "")
                pk_why = f"no primary key: {near.column} {near.text()}{other}; fix the data or set it by hand"
            else:
                near = None
            cols: dict[str, ColumnMeta] = {}
            for s in self.stats[table].values():
                if s.name == pk:
                    cols[s.name] = ColumnMeta(s.name, SemanticType.IDENTIFIER, reason=pk_why)
                    continue
                fk, fk_why = fks[s.name]
                if fk is not None:
                    cols[s.name] = ColumnMeta(s.name, SemanticType.IDENTIFIER, foreign_key=fk, reason=fk_why)
                    continue
                stype, why = self.stype(s)
                if self.rows[table] == 0 and stype == SemanticType.IGNORED:
                    why = "the table has no rows"
                if near is not None and near.column == s.name:
                    why += f"; {near.text()}, so no primary key is drafted"
                cols[s.name] = ColumnMeta(s.name, stype, reason=f"{why}; {fk_why}" if fk_why else why)
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
        return DatabaseMeta(name=name, tables=tables, tasks=tasks, description=rb.description(),
                            link_tasks=rb.link_tasks)

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


def _pk_rank(table: str, s: _Stats) -> tuple[bool, bool, int]:
    """Primary-key candidates, best first: named as the table's id, then key-like names, then position."""
    return not own_id_name(s.name, table), not id_like(s.name), s.position


def draft_metadata(raw: RawDatabase, name: str | None = None, sample_rows: int = 100_000, *,
                   strict: bool = False) -> DatabaseMeta:
    """Draft metadata for a raw database: stypes, keys, foreign keys, temporal columns, cell-masking tasks.

    Deterministic for the same data; every choice carries its reason. A RelBench folder's `tasks/` become derived
    tasks with RelBench's split (`confluence.schema.relbench`). Tables with more than `sample_rows` rows
    are read through a systematic sample of about `sample_rows` rows. Data warnings (an empty table, NaN / ±inf
    in a float column, a text column of numbers but a few values, a key column but for a few repeated or NULL
    values, a table's own identifier column overlapping another table's key) are issued with `warnings.warn`
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
