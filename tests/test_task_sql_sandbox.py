"""A task's query is one read-only SELECT over the database's tables (confluence/sources/sandbox.py): hostile
queries from a shared metadata file are refused by `validate-metadata` and `preprocess`, naming the task and what is
refused, and nothing is written anywhere; ordinary queries still run; every raw source's connection is locked."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.sources import open_source
from tests.fixtures.bookstore import bookstore_metadata, write_bookstore

runner = CliRunner()
TASK = "pwn"

# (case, query, what the refusal says). {canary}: a file the query tries to write; {db}: a database it tries to
# create; {secret}: a Parquet file outside the database. Each query yields the task's columns (order_id, rating), so
# without the sandbox the harmful ones validate and preprocess "successfully".
HOSTILE = [
    ("read_text", "SELECT o.order_id, length(f.content) * 1.0 AS rating FROM orders o, read_text('/etc/hostname') f",
     "it calls the table function read_text"),
    ("read_csv_outside", "SELECT order_id, rating FROM orders WHERE rating IS NOT NULL AND order_id NOT IN"
     " (SELECT length(column0) FROM read_csv('/etc/passwd', header = false, columns = {'column0': 'VARCHAR'}))",
     "it calls the table function read_csv"),
    ("read_parquet_outside", "SELECT o.order_id, s.v AS rating FROM orders o, read_parquet('{secret}') s",
     "it calls the table function read_parquet"),
    ("file_as_table", "SELECT o.order_id, s.v AS rating FROM orders o, '{secret}' s",
     "it reads '{secret}', which is not a table of the database"),
    ("glob", "SELECT o.order_id, length(g.file) * 1.0 AS rating FROM orders o, glob('/etc/*') g",
     "it calls the table function glob"),
    ("copy_closing_the_subquery", "SELECT order_id, rating FROM orders) AS x; COPY (SELECT 42) TO '{canary}'"
     " (FORMAT csv); SELECT * FROM (SELECT order_id, rating FROM orders", "its query fails: Parser Error"),
    ("copy_then_comment", "SELECT order_id, rating FROM orders); COPY orders TO '{canary}' (FORMAT csv); --",
     "its query fails: Parser Error"),
    ("attach_create_table", "SELECT order_id, rating FROM orders); ATTACH '{db}' AS pwn;"
     " CREATE TABLE pwn.t AS SELECT 1 AS x; SELECT * FROM (SELECT order_id, rating FROM orders",
     "its query fails: Parser Error"),
    ("install_httpfs", "SELECT order_id, rating FROM orders); INSTALL httpfs; SELECT * FROM (SELECT order_id,"
     " rating FROM orders", "its query fails: Parser Error"),
    ("install_alone", "INSTALL httpfs", "it is an INSTALL or LOAD statement"),
    ("load", "LOAD httpfs", "it is an INSTALL or LOAD statement"),
    ("set", "SET enable_external_access = true", "it is a SET statement"),
    ("pragma", "PRAGMA database_list", "it is a PRAGMA statement"),
    ("two_statements", "SELECT order_id, rating FROM orders; COPY orders TO '{canary}' (FORMAT csv)",
     "it holds 2 statements"),
    ("block_comment_escape", "SELECT order_id, rating FROM orders /* a comment */); COPY orders TO '{canary}'"
     " (FORMAT csv); SELECT * FROM (SELECT 1 /* ( */", "its query fails: Parser Error"),
    ("copy_alone", "COPY orders TO '{canary}' (FORMAT csv)", "it is a COPY statement"),
    ("information_schema", "SELECT o.order_id, 1.0 AS rating FROM orders o, information_schema.tables t",
     "it reads 'information_schema.tables', which is not a table of the database"),
    ("duckdb_settings", "SELECT o.order_id, length(s.value) * 1.0 AS rating FROM orders o, duckdb_settings() s",
     "it calls the table function duckdb_settings"),
    ("current_setting", "SELECT order_id, length(current_setting('temp_directory')) * 1.0 AS rating FROM orders",
     "its query may not call current_setting()"),
    ("cte_calling_a_table_function", "WITH f AS (SELECT * FROM read_text('/etc/hostname'))"
     " SELECT o.order_id, length(f.content) * 1.0 AS rating FROM orders o, f", "the table function read_text"),
    ("cte_out_of_scope", "SELECT o.order_id, 1.0 AS rating FROM orders o,"
     " (WITH sqlite_master AS (SELECT 1) SELECT 1) x, sqlite_master s",
     "it reads 'sqlite_master', which is not a table of the database"),
    ("create_table", "CREATE TABLE pwn AS SELECT order_id, rating FROM orders", "it is a CREATE statement"),
    ("delete", "DELETE FROM orders", "it is a DELETE statement"),
    ("update", "UPDATE orders SET rating = 0", "it is an UPDATE statement"),
    ("describe", "DESCRIBE orders", "it uses DESCRIBE / SHOW / SUMMARIZE"),
]

# Ordinary task queries (anchor orders.order_id, numerical target `rating`) and their number of seeds.
ORDINARY = [
    ("cte_join_window", "WITH firsts AS (SELECT customer_id, min(ordered_at) AS first_at FROM orders GROUP BY ALL)"
     " SELECT o.order_id, (row_number() OVER (PARTITION BY o.customer_id ORDER BY o.order_id)) * 1.0 AS rating"
     " FROM orders o JOIN firsts f USING (customer_id) JOIN customers c ON c.customer_id = o.customer_id",
     4),  # the tiny bookstore's orders: one dangling and one NULL customer_id

    ("subquery_and_range", "SELECT order_id, r.range * 1.0 AS rating FROM main.orders, range(1) r"
     " WHERE order_id IN (SELECT order_id FROM Orders WHERE rating IS NOT NULL)", 5),  # one NULL rating
    ("recursive_cte_and_values", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3)"
     " SELECT o.order_id, v.w * (SELECT max(i) FROM n) AS rating FROM orders o, (VALUES (2.0)) v(w)", 6),
    ("unnest_and_trailing_comment", "SELECT order_id, x AS rating FROM orders, unnest([0.5]) t(x) -- all orders",
     6),
]


def _files(root: Path) -> dict[str, int]:
    """Every file and directory under `root` (a directory's size is -1), to compare before and after."""
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else -1) for p in sorted(root.rglob("*"))}


@pytest.fixture
def world(tmp_path):
    """A Parquet bookstore, a Parquet file outside it, and a working directory, under one temporary root."""
    root = tmp_path
    src = write_bookstore(root, "parquet", size="tiny")
    (root / "outside").mkdir()
    pq.write_table(pa.table({"v": [1.5, 2.5]}), root / "outside" / "secret.parquet")
    (root / "cwd").mkdir()
    (root / "meta").mkdir()
    (root / "out").mkdir()
    return root, src


def _metadata(root: Path, name: str, query: str) -> Path:
    meta = bookstore_metadata()
    meta["tasks"] = {TASK: {"query": query, "anchor_table": "orders", "anchor_key": "order_id",
                            "target_column": "rating", "target_stype": "numerical"}}
    path = root / "meta" / f"{name}.json"
    path.write_text(json.dumps(meta))
    return path


def _fill(text: str, root: Path) -> str:
    for key, path in (("{canary}", root / "pwned.csv"), ("{db}", root / "x.db"),
                      ("{secret}", root / "outside" / "secret.parquet")):
        text = text.replace(key, str(path))
    return text


@pytest.mark.parametrize("case,query,refusal", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_task_query_is_refused_and_writes_nothing(world, monkeypatch, case, query, refusal):
    root, src = world
    metadata = _metadata(root, case, _fill(query, root))
    refusal = _fill(refusal, root)
    monkeypatch.chdir(root / "cwd")
    before = _files(root)
    store = root / "out" / case
    commands = {
        "validate-metadata": ["validate-metadata", str(src), "-m", str(metadata)],
        "preprocess": ["preprocess", str(src), "-m", str(metadata), "-o", str(store), "-q"],
        "preprocess --no-validate": ["preprocess", str(src), "-m", str(metadata), "-o", str(store), "-q",
                                     "--no-validate"],
    }
    for command, args in commands.items():
        res = runner.invoke(app, args)
        assert res.exit_code == 1, f"{command}: {res.output}"
        assert f"task '{TASK}': its query" in res.output and refusal in res.output, f"{command}: {res.output}"
        assert "Traceback" not in res.output
        assert not (root / "pwned.csv").exists() and not (root / "x.db").exists(), command
        assert not store.exists(), command
        after = {k: v for k, v in _files(root).items() if not k.startswith("out/")}  # the store's own lock, if any
        assert after == {k: v for k, v in before.items() if not k.startswith("out/")}, command


@pytest.mark.parametrize("case,query,seeds", ORDINARY, ids=[c[0] for c in ORDINARY])
def test_ordinary_task_queries_still_run(world, monkeypatch, case, query, seeds):
    root, src = world
    metadata = _metadata(root, case, query)
    monkeypatch.chdir(root / "cwd")
    res = runner.invoke(app, ["validate-metadata", str(src), "-m", str(metadata)])
    assert res.exit_code == 0 and "OK (3 tables, 1 tasks)" in res.output, res.output
    from confluence.preprocess import preprocess
    from confluence.store import Store
    from tests.fixtures.bookstore import HashEncoder

    with pytest.warns(UserWarning):  # the tiny bookstore's NaN and dangling key
        out = preprocess(src, metadata, root / "out" / case, encoder=HashEncoder(), progress=False)
    task = json.loads((out / "metadata.json").read_text())["tasks"][0]
    assert task["name"] == TASK and task["num_seeds"] == seeds
    assert Store.open(out) is not None


@pytest.mark.parametrize("kind", ["parquet", "csv", "duckdb", "sqlite", "relbench"])
def test_source_connection_is_locked_down(tmp_path, monkeypatch, kind):
    """Defence in depth: whatever reached the connection could not read other files, write, attach, install or
    change a setting; the views, registered Arrow tables and the settings given at open still work."""
    monkeypatch.chdir(tmp_path)
    src = write_bookstore(tmp_path, kind, size="tiny")
    secret = tmp_path / "secret.parquet"
    pq.write_table(pa.table({"v": [1]}), secret)
    with open_source(src, memory_limit_mb=300, threads=1) as raw:
        con = raw.con.cursor()
        assert con.execute("SELECT count(*) FROM orders").fetchall() == [(6,)]
        assert con.execute("SELECT current_setting('threads'), current_setting('memory_limit')").fetchall() == [
            (1, "286.1 MiB")]
        con.register("extra", pa.table({"k": [1, 2]}))
        assert con.execute("SELECT count(*) FROM extra").fetchall() == [(2,)]
        for sql in (f"SELECT * FROM read_parquet('{secret}')", "SELECT * FROM read_text('/etc/hostname')",
                    f"COPY orders TO '{tmp_path / 'pwned.csv'}'", f"ATTACH '{tmp_path / 'x.db'}' AS x",
                    "INSTALL httpfs", "LOAD httpfs", "SET threads = 2", "SET enable_external_access = true",
                    "RESET lock_configuration", "PRAGMA threads = 2"):
            with pytest.raises(duckdb.Error):
                con.execute(sql).fetchall()
    assert not (tmp_path / "pwned.csv").exists() and not (tmp_path / "x.db").exists()
