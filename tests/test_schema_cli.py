"""CLI: draft-metadata, validate-metadata and demo-data --raw-csv; errors print without a traceback."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from confluence.cli.main import app
from tests.fixtures.bookstore import bookstore_metadata, write_bookstore

runner = CliRunner()


def test_draft_then_validate(tmp_path):
    src = write_bookstore(tmp_path, "sqlite", size="small")
    out = tmp_path / "draft.json"
    res = runner.invoke(app, ["draft-metadata", str(src), "-o", str(out), "--name", "shop"])
    assert res.exit_code == 0, res.output
    assert "3 tables, 3 primary keys, 2 foreign keys" in res.output
    first = out.read_bytes()
    assert json.loads(first)["name"] == "shop"
    runner.invoke(app, ["draft-metadata", str(src), "-o", str(out), "--name", "shop"])
    assert out.read_bytes() == first
    res = runner.invoke(app, ["validate-metadata", str(src), "--metadata", str(out)])
    assert res.exit_code == 0, res.output
    assert "OK (3 tables" in res.output


def test_validate_prints_every_problem_and_exits_1(tmp_path):
    src = write_bookstore(tmp_path, "parquet", size="small")
    meta = bookstore_metadata()
    meta["tables"]["books"]["columns"]["genre"]["stype"] = "numerical"
    meta["tasks"]["order_rating"]["query"] = "SELECT FROM nowhere"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(meta))
    res = runner.invoke(app, ["validate-metadata", str(src), "-m", str(path)])
    assert res.exit_code == 1
    assert "2 problem(s)" in res.output
    assert "column 'books.genre'" in res.output and "task 'order_rating'" in res.output
    assert "Traceback" not in res.output


def test_bad_source_prints_error_without_traceback(tmp_path):
    res = runner.invoke(app, ["draft-metadata", str(tmp_path / "missing"), "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 1
    assert "no such file or directory" in res.output and "Traceback" not in res.output


def test_demo_data_raw_csv(tmp_path):
    res = runner.invoke(app, ["demo-data", "--out", str(tmp_path / "raw"), "--raw-csv"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == [
        ".confluence-output.json", "airlines.csv", "airports.csv", "flights.csv", "planes.csv", "weather.csv"]
