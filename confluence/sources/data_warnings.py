"""Data warnings: data that reads without error but is probably not what the user meant.

A NaN or ±inf in a numeric column (read as NULL), a foreign key whose values match no key of the referenced table
(its edges are dropped), an empty table (nothing to learn from), a text column holding numbers but for a few
values. Each is a `DataWarning` naming the table, the column and how many rows. The functions that find them
(`draft_metadata`, `validate_against_data`, `preprocess`) collect them in a `WarningList` (one warning per problem,
however many passes see it) and, at the end of the call, either emit them with Python's `warnings` module (the
default) or, with `strict=True`, raise one `StrictDataError` listing all of them. The CLI records them with
`recorded()` and prints them (`--strict` on the commands maps to `strict=True`).

Why Python's `warnings` module: the functions keep their return values (a draft, a store path), a script or
notebook shows the warnings without asking, and the standard filters apply
(`warnings.simplefilter("ignore", DataWarning)`). Strict mode is a keyword rather than the "error" filter so that
it lists every warning of the call at once instead of stopping at the first.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from confluence.errors import DataError

__all__ = ["DataWarning", "StrictDataError", "WarningList", "recorded", "empty_table", "non_finite",
           "dangling_foreign_key", "mostly_numbers"]


class DataWarning(UserWarning):
    """A suspicious but readable property of the data. `code` says which kind (`empty_table`, `non_finite`,
    `dangling_foreign_key`, `all_dangling_foreign_key`, `key_only_rows`, `mostly_numbers`); `table`, `column` and `rows`
    (how many rows are concerned) name it."""

    def __init__(self, message: str, *, code: str, table: str | None = None, column: str | None = None,
                 rows: int | None = None):
        super().__init__(message)
        self.text, self.code, self.table, self.column, self.rows = message, code, table, column, rows

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        """What makes two warnings the same problem (validation and the preprocessing passes both see it)."""
        return self.code, self.table, self.column

    def __str__(self) -> str:
        return self.text


class StrictDataError(DataError):
    """Raised instead of warning when strict mode is on; `warnings` lists every warning of the call."""

    def __init__(self, found: list[DataWarning]):
        self.warnings = list(found)
        super().__init__(f"{len(self.warnings)} data warning(s), errors in strict mode:\n"
                         + "\n".join(f"  - {w}" for w in self.warnings))


class WarningList:
    """The data warnings of one call, in the order found, without repeats (by `DataWarning.key`)."""

    def __init__(self) -> None:
        self.items: list[DataWarning] = []
        self._keys: set[tuple] = set()

    def add(self, w: DataWarning) -> None:
        if w.key not in self._keys:
            self._keys.add(w.key)
            self.items.append(w)

    def extend(self, ws: list[DataWarning]) -> None:
        for w in ws:
            self.add(w)

    def __len__(self) -> int:
        return len(self.items)

    def emit(self, stacklevel: int = 3) -> None:
        """Issue each warning with `warnings.warn` (`stacklevel` 3: the caller of the public function)."""
        for w in self.items:
            warnings.warn(w, stacklevel=stacklevel)

    def check_strict(self, strict: bool) -> None:
        """In strict mode, raise a `StrictDataError` listing the warnings, if any."""
        if strict and self.items:
            raise StrictDataError(self.items)


@contextmanager
def recorded() -> Iterator[list[DataWarning]]:
    """Record the `DataWarning`s issued inside the block into the yielded list (each one, even repeats of an
    earlier call) instead of printing them; other warnings are shown as usual."""
    found: list[DataWarning] = []
    others: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DataWarning)
            try:
                yield found
            finally:
                for w in caught:
                    if isinstance(w.message, DataWarning):
                        found.append(w.message)
                    else:
                        others.append(w)
    finally:
        for w in others:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


# -- the warnings, worded once for every place that finds them -------------------------------------------------

def empty_table(table: str) -> DataWarning:
    return DataWarning(f"table '{table}': has no rows (an empty file or table?); it gives nothing to learn from"
                       " and its columns look always NULL", code="empty_table", table=table, rows=0)


def non_finite(table: str, column: str, nan: int, inf: int, total: int) -> DataWarning:
    parts = ([f"{nan} NaN"] if nan else []) + ([f"{inf} ±inf"] if inf else [])
    return DataWarning(
        f"column '{table}.{column}': {nan + inf} of {total} rows hold NaN or ±inf ({', '.join(parts)}),"
        " which are read as NULL (missing)", code="non_finite", table=table, column=column, rows=nan + inf)


def outliers(table: str, column: str, count: int, total: int, timestamp: bool) -> DataWarning:
    """Values far outside any ordinary range (a sentinel, an overflow): kept, but left out of the column's mean and
    std (`confluence.preprocess.stats.NUMBER_BOUNDS`, `TIME_BOUNDS`)."""
    what = "dates before 1700 or after 2300" if timestamp else "numbers beyond ±1e18"
    return DataWarning(
        f"column '{table}.{column}': {count} of {total} rows hold {what} (a sentinel or an overflow?); they are kept"
        " as far-out values but left out of the column's mean and standard deviation, so the rest of the column is"
        " scaled as if they were absent", code="outliers", table=table, column=column, rows=count)


def dangling_foreign_key(table: str, column: str, dangling: int, non_null: int, target: str,
                         kept: bool = False) -> DataWarning:
    """A foreign key some (or all) of whose non-null values match no key of `target` (`table.column`); `kept`:
    preprocessing keeps such values as key-only rows (`preprocess(dangling_keys="keep")`) instead of dropping them."""
    if dangling >= non_null:
        return DataWarning(
            f"column '{table}.{column}': none of its {non_null} non-null foreign-key values matches a key of"
            f" {target}, so it links no rows (0 edges); is the foreign key right?",
            code="all_dangling_foreign_key", table=table, column=column, rows=dangling)
    return DataWarning(
        f"column '{table}.{column}': {dangling} of its {non_null} non-null foreign-key values match no key of"
        f" {target}; " + ("each distinct value becomes a key-only row of that table (dangling keys kept)" if kept
                          else "their edges are dropped"),
        code="dangling_foreign_key", table=table, column=column, rows=dangling)


def key_only_rows(table: str, rows: int) -> DataWarning:
    """Rows added to `table` for foreign-key values matching none of its keys (`preprocess(dangling_keys="keep")`),
    said per table when no validation named the referencing columns."""
    return DataWarning(
        f"table '{table}': {rows} key-only rows added, one per distinct foreign-key value that matches none of its"
        " keys (dangling keys kept; validate the data to see which columns hold them)",
        code="key_only_rows", table=table, rows=rows)


def mostly_numbers(table: str, column: str, numbers: int, non_null: int, example: str) -> DataWarning:
    return DataWarning(
        f"column '{table}.{column}': {numbers} of its {non_null} non-null values are numbers but the rest are"
        f" not ({example}), so the column is read as text; fix or blank those values to read it as numbers",
        code="mostly_numbers", table=table, column=column, rows=non_null - numbers)
