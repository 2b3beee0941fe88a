"""CSV files read without silent misreads: DuckDB's dialect sniffer checked, its errors turned into one line.

DuckDB's sniffer never gives up: when no dialect (delimiter, quote, escape) parses every line of a file the same
way, it falls back to reading each line as **one column** named after the whole header line, to reading
**without quoting** (so quoted values keep their quote characters), or to **skipping the first lines** and taking
a later line for the header. Each hides a malformed line, such as a row with extra fields or a quote that is
never closed. `check_dialect` catches these fallbacks and re-reads the file the standard way (RFC 4180: a field
that starts with `"` is quoted, `""` inside it is a quote) with DuckDB's strict reader, which stops at the first
malformed line; `csv_problem` rewrites that error as `<file>: line <n>: <what is wrong>: <the line>`."""

from __future__ import annotations

import csv
import gzip
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import duckdb

from confluence.errors import DataError
from confluence.sources.raw import quote_literal

DELIMITERS = (",", "\t", ";", "|")  # the ones DuckDB's sniffer tries; the header is split with each
_MAX_HEADER_BYTES = 1 << 20
_LINE = re.compile(r"CSV Error on Line: (\d+)")
_ORIGINAL = "Original Line: "
_COUNTS = re.compile(r"Expected Number of Columns: (\d+) Found: (\d+)")
_CONVERT = re.compile(r'Error when converting column "(.*?)"\. Could not convert string "(.*?)" to \'?([A-Z_ ]+)')


@dataclass(frozen=True)
class Dialect:
    """What DuckDB's sniffer found for a whole file ('' = none)."""

    delimiter: str
    quote: str
    escape: str
    skip_rows: int  # lines skipped before the header (the sniffer skips lines that do not fit its dialect)
    columns: list[tuple[str, str]]  # (name, DuckDB type)

    def options(self) -> str:
        """The `read_csv` options that pin this dialect."""
        return (f"delim={quote_literal(self.delimiter)}, quote={quote_literal(self.quote)},"
                f" escape={quote_literal(self.escape)}")


def _empty(value: str) -> str:
    return "" if value == "(empty)" else value


def sniff(con: duckdb.DuckDBPyConnection, file: Path, options: str) -> Dialect:
    """Sniff the dialect and column types over the whole file (`sample_size=-1`). Raises duckdb.Error."""
    delim, quote, escape, skip, columns = con.sql(
        f"SELECT Delimiter, Quote, Escape, SkipRows, Columns FROM sniff_csv({quote_literal(str(file))}, {options},"
        " sample_size=-1)"
    ).fetchall()[0]
    return Dialect(_empty(delim), _empty(quote), _empty(escape), int(skip or 0),
                   [(c["name"], c["type"]) for c in columns])


def _open(file: Path) -> IO[bytes]:
    return gzip.open(file, "rb") if file.name.endswith(".gz") else file.open("rb")


def header_line(file: Path) -> str:
    """The file's first line (without BOM and line end), decoded as UTF-8 with replacement characters."""
    try:
        with _open(file) as fh:
            head = fh.readline(_MAX_HEADER_BYTES)
    except (OSError, EOFError) as exc:
        raise DataError(f"{file}: cannot read it ({exc})") from None
    return head.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")


def _contains(file: Path, needle: bytes) -> bool:
    try:
        with _open(file) as fh:
            while chunk := fh.read(1 << 24):
                if needle in chunk:
                    return True
    except (OSError, EOFError) as exc:
        raise DataError(f"{file}: cannot read it ({exc})") from None
    return False


def _split(line: str, delimiter: str) -> list[str]:
    try:
        return next(csv.reader([line], delimiter=delimiter, quotechar='"'), [])
    except csv.Error:
        return line.split(delimiter)


def header_split(line: str) -> tuple[str, int]:
    """The delimiter that splits the header line into the most fields, and that number."""
    best = max(DELIMITERS, key=lambda d: (len(_split(line, d)), -DELIMITERS.index(d)))
    return best, len(_split(line, best))


def csv_problem(file: Path, message: str, delimiter: str | None = None) -> str | None:
    """DuckDB's CSV error as `<file>: line <n>: <what>: <line>`, or None when the message names no line."""
    m = _LINE.search(message)
    if m is None:
        return None
    line_no = int(m.group(1))
    body = message[m.end():]
    original = ""
    if body.lstrip("\n").startswith(_ORIGINAL):
        original = body.lstrip("\n")[len(_ORIGINAL):].split("\n", 1)[0]
    shown = original if len(original) <= 200 else original[:200] + "..."
    if (c := _COUNTS.search(body)) is not None:
        found = len(_split(original, delimiter)) if delimiter and original else int(c.group(2))
        what = f"{found} fields where the header has {c.group(1)}"
    elif "unterminated quote" in body:
        what = ("unterminated quote: a field starts with '\"' but no '\"' right before a delimiter or the line"
                " end closes it")
    elif (c := _CONVERT.search(body)) is not None:
        what = f"column '{c.group(1)}' holds {c.group(2)!r}, which is not a {c.group(3).strip()}"
    else:
        lines = [s.strip() for s in body.split("\n") if s.strip()]
        rest = [s for s in lines[1:] if not s.startswith(("Possible fixes", "*", "file =", "Column "))]
        what = rest[0] if rest else "DuckDB cannot parse it"
    return f"{file}: line {line_no}: {what}: {shown!r}"


def csv_line_value(message: str) -> tuple[int, str] | None:
    """(line, value) of DuckDB's "could not convert" CSV error, or None for another error."""
    m, c = _LINE.search(message), _CONVERT.search(message)
    return (int(m.group(1)), c.group(2)) if m is not None and c is not None else None


def first_line(message: str) -> str:
    """The first line of a DuckDB error (the rest is the reader's options and suggested fixes)."""
    return message.strip().split("\n", 1)[0]


def _strict_error(con: duckdb.DuckDBPyConnection, file: Path, delimiter: str, fields: int,
                  options: str) -> duckdb.Error | None:
    """Read the file as RFC 4180 CSV (`"` quotes, `""` escapes) into `fields` text columns with DuckDB's strict
    reader; the error at the first malformed line, or None when every line parses."""
    cols = "{" + ", ".join(f"{quote_literal(f'c{i}')}: 'VARCHAR'" for i in range(fields)) + "}"
    try:
        con.sql(
            f"SELECT count(c0) FROM read_csv({quote_literal(str(file))}, {options}, auto_detect=false,"
            f" delim={quote_literal(delimiter)}, quote='\"', escape='\"', columns={cols})"
        ).fetchall()
    except duckdb.Error as exc:
        return exc
    return None


def _empty_header(file: Path) -> DataError:
    return DataError(f"{file}: line 1 is empty (an empty file?); the header must be the first line")


def _malformed(con: duckdb.DuckDBPyConnection, file: Path, delimiter: str, fields: int, options: str,
               otherwise: str) -> DataError:
    """The error for a file the sniffer could not read as one table: its first malformed line under a strict
    RFC 4180 read with `fields` fields, else `otherwise`."""
    if fields < 1:
        return _empty_header(file)
    exc = _strict_error(con, file, delimiter, fields, options)
    if exc is not None and (msg := csv_problem(file, str(exc), delimiter)) is not None:
        return DataError(msg)
    return DataError(f"{file}: {otherwise}")


def check_dialect(con: duckdb.DuckDBPyConnection, file: Path, dialect: Dialect, options: str) -> None:
    """Raise a DataError naming the line when the sniffer skipped lines, fell back to one column or fell back to
    no quoting because some line does not parse (see the module docstring)."""
    header = header_line(file)
    if not header.strip():
        raise _empty_header(file)
    if dialect.skip_rows:
        delimiter, fields = header_split(header)
        raise _malformed(con, file, delimiter, fields, options,
                         f"DuckDB's sniffer skipped its first {dialect.skip_rows} line(s) to find a table; the"
                         " header must be the first line and every line must have its fields")
    if len(dialect.columns) == 1:
        delimiter, fields = header_split(header)
        if fields > 1:
            raise _malformed(con, file, delimiter, fields, options,
                             f"DuckDB read each line as one column although the header splits into {fields}"
                             f" fields at {delimiter!r}; the file mixes dialects (delimiters or quoting)")
    elif dialect.quote == "" and dialect.delimiter != "\t" and _contains(file, b'"'):
        # Quote characters in a file read without quoting: fine if it reads the same way with quoting (a quote
        # inside a value), else some quoted value is broken. Tab-separated files have no quoting convention.
        exc = _strict_error(con, file, dialect.delimiter, len(dialect.columns), options)
        if exc is not None:
            raise DataError(csv_problem(file, str(exc), dialect.delimiter)
                            or f"{file}: not valid CSV: {first_line(str(exc))}")


def locate_failure(con: duckdb.DuckDBPyConnection, file: Path, options: str, exc: duckdb.Error) -> DataError:
    """A DataError for a file the sniffer itself failed on: the malformed line when a strict read finds one."""
    if (msg := csv_problem(file, str(exc))) is not None:
        return DataError(msg)
    delimiter, fields = header_split(header_line(file))
    return _malformed(con, file, delimiter, fields, options, f"DuckDB cannot read it as CSV ({first_line(str(exc))})")
