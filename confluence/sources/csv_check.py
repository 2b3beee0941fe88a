"""CSV files read without silent misreads: DuckDB's dialect sniffer checked, its errors turned into one line.

DuckDB's sniffer never gives up: when no dialect (delimiter, quote, escape) parses every line of a file the same
way, it falls back to reading each line as **one column** named after the whole header line, to reading
**without quoting** (so quoted values keep their quote characters), or to **skipping the first lines** and taking
a later line for the header. Each hides a malformed line, such as a row with extra fields or a quote that is
never closed. `check_dialect` catches these fallbacks and re-reads the file the standard way (RFC 4180: a field
that starts with `"` is quoted, `""` inside it is a quote) with DuckDB's strict reader, which stops at the first
malformed line; `csv_problem` rewrites that error as `<file>: line <n>: <what is wrong>: <the line>`.

Windows line ends (CRLF) get the same message: DuckDB's "Original Line" of a CRLF file starts with the previous
line's `\n` (and, like an LF file's, with any blank lines before it), and where its strict reader stops without
naming a line ("state machine reached an invalid state", seen for a CRLF file whose broken line sits before a quoted
value spanning lines), Python's `csv` module finds the line instead (`python_problem`)."""

from __future__ import annotations

import csv
import gzip
import io
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
# what DuckDB says right after the "Original Line" (which may span lines: blank lines before it, a quoted value after)
_NOTES = re.compile(r"\n(?=Expected Number of Columns|Value with unterminated quote|Error when converting"
                    r"|Invalid unicode|Maximum line size|Possible fixes|Possible Solution)")
_UNTERMINATED = ("unterminated quote: a field starts with '\"' but no '\"' right before a delimiter or the line end"
                 " closes it")


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


def _original_and_notes(body: str) -> tuple[str, str]:
    """DuckDB's "Original Line" (its first line, without blank lines before it or line ends) and the notes after
    it, from the text after `CSV Error on Line: <n>`; the same for LF and CRLF files."""
    body = body.lstrip("\r\n")
    if not body.startswith(_ORIGINAL):
        return "", body
    text = body[len(_ORIGINAL):]
    if (m := _NOTES.search(text)) is not None:
        original, notes = text[:m.start()], text[m.end():]
    else:
        original, _, notes = text.lstrip("\r\n").partition("\n")
    return original.lstrip("\r\n").split("\n", 1)[0].rstrip("\r"), notes


def _header_delimiter(file: Path) -> str | None:
    try:
        return header_split(header_line(file))[0]
    except DataError:
        return None


def csv_problem(file: Path, message: str, delimiter: str | None = None) -> str | None:
    """DuckDB's CSV error as `<file>: line <n>: <what>: <line>`, or None when the message names no line. The
    fields of a line are counted with `delimiter` (by default the one that splits the header best): DuckDB's own
    count stops one past the header's."""
    m = _LINE.search(message)
    if m is None:
        return None
    line_no = int(m.group(1))
    original, notes = _original_and_notes(message[m.end():])
    if (c := _COUNTS.search(notes)) is not None:
        delimiter = delimiter or (_header_delimiter(file) if original else None)
        found = len(_split(original, delimiter)) if delimiter and original else int(c.group(2))
        what = f"{found} fields where the header has {c.group(1)}"
    elif "unterminated quote" in notes:
        what = _UNTERMINATED
    elif (c := _CONVERT.search(notes)) is not None:
        what = f"column '{c.group(1)}' holds {c.group(2)!r}, which is not a {c.group(3).strip()}"
    else:
        rest = [s.strip() for s in notes.split("\n") if s.strip()
                and not s.strip().startswith(("Possible fixes", "Possible Solution", "*", "file =", "Column "))]
        what = rest[0] if rest else "DuckDB cannot parse it"
    return _say(file, line_no, what, original)


def _say(file: Path, line_no: int, what: str, line: str) -> str:
    shown = line if len(line) <= 200 else line[:200] + "..."
    return f"{file}: line {line_no}: {what}: {shown!r}"


class _Lines:
    """A text file's lines (line ends kept) for `csv.reader`, remembering those read for the current record."""

    def __init__(self, text: IO[str]):
        self.text = text
        self.taken: list[str] = []

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        line = self.text.readline()
        if not line:
            raise StopIteration
        self.taken.append(line)
        return line


def python_problem(file: Path, delimiter: str, fields: int) -> str | None:
    """The first malformed line as `csv_problem` words it, found with Python's `csv` module (RFC 4180 like DuckDB's
    strict reader: `"` quotes, `""` escapes; LF, CRLF or CR line ends), or None when every line has `fields` fields.
    For when DuckDB's strict reader fails without naming a line. Lines are counted as DuckDB counts them: one per
    record (a quoted value spanning lines is one) and one per blank line, the header being line 1."""
    try:
        with _open(file) as fh:
            lines = _Lines(io.TextIOWrapper(fh, encoding="utf-8", errors="replace", newline=""))
            reader = csv.reader(lines, delimiter=delimiter, quotechar='"', doublequote=True, strict=True)
            line_no = 0
            while True:
                lines.taken = []
                try:
                    row = next(reader, None)
                except csv.Error as exc:
                    # '"' expected after '"' (closed before something other than a delimiter), unexpected end of
                    # data (never closed), field larger than field limit (a quote that runs on): a broken quote
                    said = str(exc)
                    quote = "'\"'" in said or "end of data" in said or "field larger" in said
                    return _say(file, line_no + 1, _UNTERMINATED if quote else f"not valid CSV ({said})",
                                _first(lines.taken))
                if row is None:
                    return None
                line_no += 1
                if line_no > 1 and row and len(row) != fields:
                    return _say(file, line_no, f"{len(row)} fields where the header has {fields}", _first(lines.taken))
    except (OSError, EOFError):
        return None


def _first(taken: list[str]) -> str:
    return taken[0].lstrip("\ufeff").rstrip("\r\n") if taken else ""


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


def _first_bad_line(con: duckdb.DuckDBPyConnection, file: Path, delimiter: str, fields: int,
                    options: str) -> tuple[str | None, duckdb.Error | None]:
    """(the message naming the first malformed line, DuckDB's error) of a strict RFC 4180 read with `fields`
    fields; Python's `csv` module names the line when DuckDB's error does not. (None, None): every line parses."""
    exc = _strict_error(con, file, delimiter, fields, options)
    if exc is None:
        return None, None
    return csv_problem(file, str(exc), delimiter) or python_problem(file, delimiter, fields), exc


def _malformed(con: duckdb.DuckDBPyConnection, file: Path, delimiter: str, fields: int, options: str,
               otherwise: str) -> DataError:
    """The error for a file the sniffer could not read as one table: its first malformed line under a strict
    RFC 4180 read with `fields` fields, else `otherwise`."""
    if fields < 1:
        return _empty_header(file)
    msg, _ = _first_bad_line(con, file, delimiter, fields, options)
    return DataError(msg if msg is not None else f"{file}: {otherwise}")


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
        msg, exc = _first_bad_line(con, file, dialect.delimiter, len(dialect.columns), options)
        if exc is not None:
            raise DataError(msg or f"{file}: not valid CSV: {first_line(str(exc))}")


def locate_failure(con: duckdb.DuckDBPyConnection, file: Path, options: str, exc: duckdb.Error) -> DataError:
    """A DataError for a file the sniffer itself failed on: the malformed line when a strict read finds one."""
    if (msg := csv_problem(file, str(exc))) is not None:
        return DataError(msg)
    delimiter, fields = header_split(header_line(file))
    return _malformed(con, file, delimiter, fields, options, f"DuckDB cannot read it as CSV ({first_line(str(exc))})")
