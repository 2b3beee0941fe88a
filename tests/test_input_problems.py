"""What a newcomer's data can get wrong, at the CLI: malformed CSV lines stop with the file and line; NaN / inf,
dangling foreign keys and empty tables are data warnings naming the table and column; --strict makes them errors.
Every malformed-CSV case runs with LF and with CRLF (Windows) line ends: same line, field count and excerpt."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.errors import DataError
from confluence.preprocess import pipeline, preprocess
from confluence.schema.draft import draft_metadata
from confluence.schema.validate import validate_against_data
from confluence.sources import open_source
from confluence.sources.data_warnings import DataWarning, StrictDataError
from tests.fixtures.bookstore import HashEncoder

runner = CliRunner()


def _csv(directory: Path, name: str, lines: list[str], eol: str = "\n") -> Path:
    """Write `name`.csv with `eol` after every line (bytes as given: "\r\n" is what Python's csv module and
    spreadsheets write)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.csv").write_bytes((eol.join(lines) + eol).encode())
    return directory


# LF and CRLF line ends: every malformed-CSV test runs with both and expects the same message
EOLS = pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])


def _rows(n: int = 59) -> list[str]:
    """A header and `n` rows: line k + 1 of the file holds row k (id k)."""
    return ["id,name,amount"] + [f"{i},name {i},{i * 1.5}" for i in range(1, n + 1)]


def _draft(src: Path, out: Path, *extra: str):
    return runner.invoke(app, ["draft-metadata", str(src), "-o", str(out), *extra])


# -- parse problems: the file, the line and what is wrong -------------------------------------------------------

@EOLS
def test_extra_fields_on_line_51_stop_draft_metadata(tmp_path, eol):
    lines = _rows()
    lines[50] += ",x,y"  # line 51 of the file (the header is line 1)
    src = _csv(tmp_path / "db", "sales", lines, eol)
    res = _draft(src, tmp_path / "meta.json")
    assert res.exit_code == 1, res.output
    assert "sales.csv: line 51: 5 fields where the header has 3: '50,name 50,75.0,x,y'" in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "meta.json").exists()
    with pytest.raises(DataError, match=r"sales\.csv: line 51: "):
        open_source(src)


@EOLS
def test_unterminated_quote_names_the_line(tmp_path, eol):
    lines = ["id,name,amount"] + [f'{i},"name {i}, the {i}th",{i * 1.5}' for i in range(1, 60)]
    lines[30] = '30,"name 30,45.0'  # line 31: the quote never closes
    src = _csv(tmp_path / "db", "sales", lines, eol)
    res = _draft(src, tmp_path / "meta.json")
    assert res.exit_code == 1, res.output
    assert "sales.csv: line 31: unterminated quote" in res.output and """closes it: '30,"name 30,45.0'""" in res.output
    # the same broken value in a file that quotes nothing else (the sniffer would read it without quoting)
    lines = _rows()
    lines[30] = '30,name 30,"45.0'
    res = _draft(_csv(tmp_path / "plain", "sales", lines, eol), tmp_path / "meta.json")
    assert res.exit_code == 1 and "line 31: unterminated quote" in res.output
    assert """closes it: '30,name 30,"45.0'""" in res.output


@EOLS
def test_non_numeric_value_names_line_and_value(tmp_path, eol):
    lines = _rows()
    lines[40] = "40,name 40,abc"  # line 41
    src = _csv(tmp_path / "db", "sales", lines, eol)
    out = tmp_path / "meta.json"
    res = _draft(src, out)
    assert res.exit_code == 0, res.output
    assert "warning: column 'sales.amount': 58 of its 59 non-null values are numbers" in res.output
    assert "line 41 of" in res.output and "'abc'" in res.output
    meta = json.loads(out.read_text())
    meta["tables"]["sales"]["columns"]["amount"]["stype"] = "numerical"
    out.write_text(json.dumps(meta))
    res = runner.invoke(app, ["validate-metadata", str(src), "-m", str(out)])
    assert res.exit_code == 1
    assert "column 'sales.amount': declared numerical" in res.output
    assert "line 41 of" in res.output and "sales.csv holds 'abc', which is not a number" in res.output


@EOLS
def test_other_malformed_csv_files(tmp_path, eol):
    # a line with a different delimiter count makes DuckDB's sniffer skip lines (or fall back): still the line
    bad = _csv(tmp_path / "semi", "t", ["id;name;v", '1;"a;b";2', "2;c;3", "3;d;4;5"], eol)
    with pytest.raises(DataError, match=r"t\.csv: line 4: 4 fields where the header has 3: '3;d;4;5'$"):
        open_source(bad)
    with pytest.raises(DataError, match=r"t\.csv: line 1 is empty"):
        open_source(_csv(tmp_path / "empty", "t", [""], eol))


SHOP_HEADER = "order_id,customer_id,placed_at,status,amount,note,gift"


def _shop_orders(n: int = 60) -> list[str]:
    """A 7-column orders file as Python's csv module writes it: notes quoted, every 7th spanning two lines."""
    return [SHOP_HEADER] + [
        f'{i},{i % 17},2024-01-{i % 28 + 1:02d} 10:00:00,{"open" if i % 2 else "done"},{i * 1.25},'
        + (f'"note {i},\nlong"' if i % 7 == 0 else f'"note {i}, long"') + f",{i % 2}" for i in range(1, n + 1)]


@EOLS
@pytest.mark.parametrize("case", ["extra_fields", "fewer_fields", "unterminated", "blank_lines_before",
                                  "semicolons_before_a_multiline_value"])
def test_malformed_lines_of_a_quoted_file(tmp_path, eol, case):
    # each record is one "line" as DuckDB counts them (a quoted value spanning two lines is one; so is a blank
    # line): record k of _shop_orders is line k + 1
    lines = _shop_orders()
    row50 = lines[50]
    want = {"extra_fields": f"line 51: 9 fields where the header has 7: {row50 + ',x,y'!r}",
            "fewer_fields": "line 51: 5 fields where the header has 7: '50,16,2024-01-23 10:00:00,done,62.5'",
            "unterminated": "line 51: unterminated quote: a field starts with '\"' but no '\"' right before a delimiter"
                            """ or the line end closes it: '50,16,2024-01-23 10:00:00,done,62.5,"note 50, long,0'""",
            "blank_lines_before": f"line 53: 9 fields where the header has 7: {row50 + ',x,y'!r}",
            # a CRLF file whose sniff fails outright ("Error when sniffing file") and whose strict read stops
            # without a line ("state machine reached an invalid state"): Python's csv module finds it
            "semicolons_before_a_multiline_value":
                """line 15: 1 fields where the header has 7: '14;14;2024-01-15 10:00:00;done;17.5;"note 14;'""",
            }[case]
    if case == "extra_fields":
        lines[50] += ",x,y"
    elif case == "fewer_fields":
        lines[50] = row50.split(',"')[0]
    elif case == "unterminated":
        lines[50] = row50.replace(' long"', " long")
    elif case == "blank_lines_before":
        lines[50:51] = ["", "", row50 + ",x,y"]
    else:
        lines[14] = lines[14].replace(",", ";")
    with pytest.raises(DataError) as err:
        open_source(_csv(tmp_path / "db", "orders", lines, eol))
    assert str(err.value) == f"{tmp_path / 'db' / 'orders.csv'}: {want}"


@EOLS
def test_well_formed_csv_files_still_read(tmp_path, eol):
    cases = {
        "one": (["word", "hello", "world"], ["word"], 2),  # a genuine one-column file
        "header_only": (["id,name,v"], ["id", "name", "v"], 0),
        "inner_quote": (['id,size', '1,5" floppy', '2,"3, or 4"'], ["id", "size"], 2),  # quote inside a value
        "tsv_quotes": (['id\tname', '1\t"Weird Al" Yankovic', '2\tBob'], ["id", "name"], 2),  # TSV: no quoting
    }
    for name, (lines, columns, rows) in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / ("t.tsv" if name.startswith("tsv") else "t.csv")).write_bytes((eol.join(lines) + eol).encode())
        with open_source(d) as raw:
            assert raw.schema("t").names == columns, name
            assert raw.num_rows("t") == rows, name
    with open_source(tmp_path / "inner_quote") as raw:
        assert [r[0] for r in raw.fetchall('SELECT size FROM t ORDER BY id')] == ['5" floppy', "3, or 4"]


def test_first_unconvertible_value_outside_csv(tmp_path):
    pq.write_table(pa.table({"x": ["1", None, "2.5", "n/a", "zz"]}), tmp_path / "t.parquet")
    with open_source(tmp_path) as raw:
        assert raw.first_unconvertible("t", "x") == "row 3 holds 'n/a'"
    pq.write_table(pa.table({"x": ["1", "2"]}), tmp_path / "t.parquet")
    with open_source(tmp_path) as raw:
        assert raw.first_unconvertible("t", "x") is None


# -- data warnings -------------------------------------------------------------------------------------------------

def _shop(tmp_path: Path, customer_ids: list[int]) -> tuple[Path, Path]:
    """customers (ids 1..50) and orders (200 rows, `amount` with one NaN and one inf), as CSV, plus metadata."""
    src = tmp_path / "shop"
    _csv(src, "customers", ["id,name"] + [f"{i},c{i}" for i in range(1, 51)])
    amounts = [str(float(i)) for i in range(200)]
    amounts[3], amounts[7] = "nan", "inf"
    _csv(src, "orders", ["order_id,customer_id,amount"]
         + [f"{i},{customer_ids[i % len(customer_ids)]},{amounts[i]}" for i in range(200)])
    meta = {"name": "shop", "tables": {
        "customers": {"primary_key": "id", "columns": {"id": {"stype": "identifier"}, "name": {"stype": "text"}}},
        "orders": {"primary_key": "order_id", "columns": {
            "order_id": {"stype": "identifier"},
            "customer_id": {"stype": "identifier", "foreign_key": "customers.id"},
            "amount": {"stype": "numerical"}}}}, "tasks": {}}
    path = tmp_path / "shop.metadata.json"
    path.write_text(json.dumps(meta))
    return src, path


def _preprocess(src: Path, meta: Path, out: Path, *extra: str):
    return runner.invoke(app, ["preprocess", str(src), "-m", str(meta), "-o", str(out), "-q", *extra],
                         env={"COLUMNS": "200"})


NAN_WARNING = "column 'orders.amount': 2 of 200 rows hold NaN or ±inf (1 NaN, 1 ±inf), which are read as NULL"
ALL_DANGLING = "column 'orders.customer_id': none of its 200 non-null foreign-key values matches a key of customers.id"


def test_nan_inf_and_all_dangling_foreign_key_warn_at_every_command(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "load_encoder", lambda spec: HashEncoder())
    src, meta = _shop(tmp_path, [1000 + i for i in range(7)])  # no order's customer exists
    res = _draft(src, tmp_path / "draft.json")
    assert res.exit_code == 0 and f"warning: {NAN_WARNING}" in res.output
    res = runner.invoke(app, ["validate-metadata", str(src), "-m", str(meta)])
    assert res.exit_code == 0, res.output
    assert NAN_WARNING in res.output and ALL_DANGLING in res.output and "OK (2 tables" in res.output
    for extra in ((), ("--no-validate",)):  # found by the validation, or else by the passes: same words, once
        res = _preprocess(src, meta, tmp_path / "store", *extra)
        assert res.exit_code == 0, res.output
        assert res.output.count(NAN_WARNING) == 1 and res.output.count(ALL_DANGLING) == 1
        assert (tmp_path / "store" / "metadata.json").exists()


def test_strict_makes_warnings_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "load_encoder", lambda spec: HashEncoder())
    src, meta = _shop(tmp_path, [1000 + i for i in range(7)])
    res = _draft(src, tmp_path / "draft.json", "--strict")
    assert res.exit_code == 1 and NAN_WARNING in res.output and not (tmp_path / "draft.json").exists()
    res = runner.invoke(app, ["validate-metadata", str(src), "-m", str(meta), "--strict"])
    assert res.exit_code == 1 and NAN_WARNING in res.output and ALL_DANGLING in res.output
    for extra in ((), ("--no-validate",)):
        res = _preprocess(src, meta, tmp_path / "store", "--strict", *extra)
        assert res.exit_code == 1, res.output
        assert "2 data warning(s), errors in strict mode" in res.output
        assert NAN_WARNING in res.output and ALL_DANGLING in res.output and "Traceback" not in res.output
        assert not (tmp_path / "store").exists()


def test_partly_dangling_foreign_key_keeps_its_edges_and_warns(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "load_encoder", lambda spec: HashEncoder())
    src, meta = _shop(tmp_path, [1, 2, 3, 999])  # a quarter of the orders point at no customer
    res = _preprocess(src, meta, tmp_path / "store")
    assert res.exit_code == 0, res.output
    assert ("column 'orders.customer_id': 50 of its 200 non-null foreign-key values match no key of customers.id;"
            " their edges are dropped") in res.output
    store_meta = json.loads((tmp_path / "store" / "metadata.json").read_text())
    assert store_meta["graph"]["num_parent_edges"] == 150 and store_meta["graph"]["num_dangling"] == 50


def test_empty_table_warns_at_draft_time(tmp_path):
    src = _csv(tmp_path / "db", "empty", ["id,name"])
    _csv(src, "full", ["id,name", "1,a", "2,b"])
    res = _draft(src, tmp_path / "meta.json")
    assert res.exit_code == 0, res.output
    assert "warning: table 'empty': has no rows" in res.output and "1 data warning(s) above" in res.output
    reasons = {c["reason"] for c in json.loads((tmp_path / "meta.json").read_text())["tables"]["empty"]["columns"]
               .values()}
    assert reasons == {"the table has no rows"}
    res = _draft(src, tmp_path / "strict.json", "--strict")
    assert res.exit_code == 1 and "table 'empty': has no rows" in res.output
    assert not (tmp_path / "strict.json").exists()


def test_python_api_warns_or_raises(tmp_path):
    src, meta = _shop(tmp_path, [1000])
    with open_source(src) as raw:
        with pytest.warns(DataWarning) as caught:
            db = draft_metadata(raw)
        assert [(w.message.code, w.message.table, w.message.column, w.message.rows) for w in caught] == [
            ("non_finite", "orders", "amount", 2)]
        with pytest.raises(StrictDataError) as err:
            draft_metadata(raw, strict=True)
        assert err.value.warnings[0].key == ("non_finite", "orders", "amount")
        with pytest.warns(DataWarning, match=r"orders\.amount"):
            validate_against_data(db, raw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataWarning)  # the standard filters apply
            validate_against_data(db, raw)
    with pytest.raises(StrictDataError, match="none of its 200"):
        preprocess(src, meta, tmp_path / "store", encoder=HashEncoder(), progress=False, strict=True)
