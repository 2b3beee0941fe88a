"""The PostgreSQL source against a real server that this module starts and stops itself (Debian's `postgresql`
package: initdb into a temporary directory, a free local port, a unix socket in that directory; no mocks).

Databases written: `shop` with the small bookstore in `public` (primary and foreign keys declared), the tiny
bookstore in schema `tiny` (primary keys only: it has a dangling key), `extras` (every column type the reader maps,
NULLs, a foreign key the draft could not infer, a composite key), `bulk` (a table of several ADBC batches),
`mixed` (timezone-aware times, decimals, booleans, text, with NULLs), `badnum` (NaN in a numeric(6,2) column) and
the empty schema `nothing` of `shop`. Skipped only when no PostgreSQL binaries
exist.
"""

from __future__ import annotations

import datetime as dt
import decimal
import filecmp
import glob
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import adbc_driver_postgresql.dbapi as pg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.errors import DataError
from confluence.preprocess import pipeline
from confluence.preprocess.pipeline import preprocess
from confluence.schema.draft import draft_metadata
from confluence.schema.metadata import save_metadata
from confluence.sources import DataWarning, open_source, redact_url
from confluence.sources.pg_url import parse_url
from confluence.sources.postgres import open_postgres
from tests.fixtures.bookstore import HashEncoder, bookstore_tables, write_bookstore, write_metadata
from tests.fixtures.net import free_port

USER = "confluence"
PASSWORD = "pw:s3cret@x"  # needs percent-encoding in a URL: both spellings must stay out of every message
PASSWORD_IN_URL = "pw%3As3cret%40x"
BULK_ROWS = 200_000
SMALL_BATCH_BYTES = 64 << 10


def _pg_bindir() -> Path | None:
    """The directory of initdb / pg_ctl: on PATH, else the newest /usr/lib/postgresql/*/bin (Debian)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    dirs = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    dirs.sort(key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0, reverse=True)
    return dirs[0] if dirs else None


class Server:
    """A PostgreSQL server in a temporary directory; `url()` names one of its databases."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="confluence-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        # initdb refuses to run as root: then the server runs as Debian's `postgres` user, owning the directory
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        (self.dir / "pw").write_text(PASSWORD + "\n")
        if self.as_user:
            shutil.chown(self.dir, "postgres")
            shutil.chown(self.dir / "pw", "postgres")

    def run(self, tool: str, *args: str) -> None:
        cmd = [*self.as_user, str(self.bindir / tool), *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            log = (self.dir / "log").read_text() if (self.dir / "log").exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}{res.stderr}{log}")

    def start(self) -> None:
        self.run("initdb", "-D", str(self.data), "-U", USER, "--pwfile", str(self.dir / "pw"), "-A", "scram-sha-256",
                 "-E", "UTF8", "--locale", "C", "-N")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -F -c shared_buffers=16MB"
                " -c max_connections=20")
        self.run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-l", str(self.dir / "log"), "-o", opts, "start")

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self.run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "shop", schema: str | None = None, password: str = PASSWORD_IN_URL) -> str:
        query = f"?schema={schema}" if schema else ""
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}{query}"


def _execute(url: str, *statements: str) -> None:
    with pg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)


def _ingest(url: str, schema: str, tables: dict[str, pa.Table], mode: str = "create") -> None:
    with pg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        for name, table in tables.items():
            cur.adbc_ingest(name, table, mode=mode, db_schema_name=schema)


def _payments(n: int = 40) -> pa.Table:
    """Timezone-aware times, exact decimals, booleans and text, each with NULLs (every 7th, 5th, 6th, 4th row)."""
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    return pa.table({
        "id": pa.array(range(1, n + 1), pa.int64()),
        "paid_at": pa.array([None if i % 7 == 3 else start + dt.timedelta(hours=37 * i, seconds=i) for i in range(n)],
                            pa.timestamp("us", tz="UTC")),
        "amount": pa.array([None if i % 5 == 2 else decimal.Decimal(f"{(i * 7919) % 10000 - 5000}.{i % 100:02d}")
                            for i in range(n)], pa.decimal128(10, 2)),
        "ok": pa.array([None if i % 6 == 1 else i % 3 == 0 for i in range(n)]),
        "memo": pa.array([None if i % 4 == 0 else f"paid for item {i % 9}" for i in range(n)]),
        "channel": pa.array([["web", "shop", "phone"][i % 3] for i in range(n)]),
    })


def _write_databases(server: Server) -> None:
    _execute(server.url("postgres"),
             *(f"CREATE DATABASE {db}" for db in ("shop", "extras", "bulk", "mixed", "badnum")))
    shop = server.url("shop")
    _execute(shop, "CREATE SCHEMA tiny", "CREATE SCHEMA nothing")
    _ingest(shop, "public", bookstore_tables("small"))
    _ingest(shop, "tiny", bookstore_tables("tiny"))
    _execute(shop,
             "ALTER TABLE customers ADD PRIMARY KEY (customer_id)", "ALTER TABLE books ADD PRIMARY KEY (book_id)",
             "ALTER TABLE orders ADD PRIMARY KEY (order_id)",
             "ALTER TABLE orders ADD FOREIGN KEY (customer_id) REFERENCES customers",
             "ALTER TABLE orders ADD FOREIGN KEY (book_id) REFERENCES books",
             # the updated row moves behind the others in the heap: a plain SELECT no longer gives key order
             "UPDATE customers SET name = name WHERE customer_id = 1",
             "ALTER TABLE tiny.customers ADD PRIMARY KEY (customer_id)",
             "ALTER TABLE tiny.books ADD PRIMARY KEY (book_id)", "ALTER TABLE tiny.orders ADD PRIMARY KEY (order_id)")
    _execute(server.url("extras"),
             "CREATE TYPE mood AS ENUM ('sad', 'happy')",
             "CREATE DOMAIN cents AS bigint",
             """CREATE TABLE events (id integer PRIMARY KEY, at_tz timestamptz, at_local timestamp, amount numeric(12, 2),
                ratio numeric, flag boolean, note text, day date, feeling mood, doc jsonb, tag uuid, tags text[],
                small smallint, score real, price cents, code char(3))""",
             """INSERT INTO events VALUES
                (1, '2024-03-01 12:00:00+02', '2024-03-01 12:00:00', 12.34, 1.5e30, true, 'first', '2024-03-01',
                 'happy', '{"a": 1}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{x,y}', 3, 1.5, 250, 'ab'),
                (2, NULL, NULL, NULL, 'NaN', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                (3, '2024-03-02 00:30:00-05', '1999-12-31 23:59:59.5', -0.01, 2, false, 'é ✓', '1815-12-23',
                 'sad', '[]', NULL, '{}', -3, -2.25, -1, NULL)""",
             "CREATE TABLE people (person_id bigint PRIMARY KEY, name text)",
             "INSERT INTO people SELECT g, 'person ' || g FROM generate_series(1, 20) g",
             """CREATE TABLE reviews (review_no integer PRIMARY KEY, buyer bigint REFERENCES people, stars integer)""",
             "INSERT INTO reviews SELECT g, 1 + g % 20, 1 + g % 5 FROM generate_series(1, 50) g",
             """CREATE TABLE lines (review_no integer REFERENCES reviews, line integer, words text,
                PRIMARY KEY (review_no, line))""",
             "INSERT INTO lines SELECT 1 + g % 50, g, 'w' || g FROM generate_series(1, 80) g")
    _execute(server.url("bulk"),
             f"""CREATE TABLE big AS SELECT g AS id, md5(g::text) AS h, g * 0.25::float8 AS x
                 FROM generate_series(1, {BULK_ROWS}) g ORDER BY g""",
             "ALTER TABLE big ADD PRIMARY KEY (id)")
    _execute(server.url("mixed"), """CREATE TABLE payments (id bigint PRIMARY KEY, paid_at timestamptz,
             amount numeric(10, 2), ok boolean, memo text, channel text)""")
    _ingest(server.url("mixed"), "public", {"payments": _payments()}, mode="append")
    _execute(server.url("badnum"), "CREATE TABLE vals (id integer PRIMARY KEY, amount numeric(6, 2))",
             "INSERT INTO vals VALUES (1, 1.25), (2, 'NaN')")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under /usr/lib/postgresql/*/bin")
    srv = Server(bindir)
    try:
        srv.start()
        _write_databases(srv)
        yield srv
    finally:
        srv.stop()


def _assert_no_password(text: str) -> None:
    for secret in (PASSWORD, PASSWORD_IN_URL, "wrong-pass", "s3cret"):
        assert secret not in text, text


# -- URLs, no server --------------------------------------------------------------------------------------------
def test_redact_url_drops_every_password():
    assert redact_url("postgresql://ann:se%40cret@db.example:5433/shop?schema=s") == \
        "postgresql://ann@db.example:5433/shop?schema=s"
    assert redact_url("postgres://ann:p:w@h1,h2/db") == "postgres://ann@h1,h2/db"
    assert redact_url("postgresql://h/db?user=ann&password=x&sslmode=require&sslpassword=y") == \
        "postgresql://h/db?user=ann&sslmode=require"
    assert redact_url("postgresql://ann@h/db") == "postgresql://ann@h/db"
    assert redact_url("postgresql://") == "postgresql://"


def test_parse_url_takes_our_schema_option_out_of_libpqs_url():
    t = parse_url("postgresql://ann:pw@h/db?sslmode=disable&schema=sales")
    assert t.schema == "sales" and t.display == "postgresql://ann@h/db?sslmode=disable&schema=sales"
    assert t.libpq_url.startswith("postgresql://ann:pw@h/db?sslmode=disable&connect_timeout=")
    assert parse_url("postgresql:///db?connect_timeout=3").libpq_url == "postgresql:///db?connect_timeout=3"
    assert parse_url("postgresql://h/db").schema == "public"
    with pytest.raises(DataError, match="more than one schema"):
        parse_url("postgresql://h/db?schema=a&schema=b")
    with pytest.raises(DataError, match="schema option is empty"):
        parse_url("postgresql://h/db?schema=")


def test_open_source_tells_urls_from_paths(tmp_path):
    with pytest.raises(DataError, match="a URL is a postgresql source, not 'csv'") as info:
        open_source(f"postgresql://u:{PASSWORD_IN_URL}@127.0.0.1:1/db", kind="csv")
    _assert_no_password(str(info.value))
    with pytest.raises(DataError, match="a postgresql source is a URL"):
        open_source(tmp_path, kind="postgresql")
    with pytest.raises(DataError, match="not a PostgreSQL URL libpq reads; write it as postgresql://"):
        open_source("Postgresql://h/db")  # libpq's prefixes are lower case: a misspelt URL, never read as a path


# -- reading ----------------------------------------------------------------------------------------------------
def test_bookstore_reads_as_from_parquet(server, tmp_path):
    with pg.connect(server.url()) as conn, conn.cursor() as cur:
        cur.execute("SELECT customer_id FROM customers")
        heap_order = [r[0] for r in cur.fetchall()]
    assert heap_order != sorted(heap_order)  # so the equal row order below is the reader's ORDER BY
    with open_source(server.url()) as raw, open_source(write_bookstore(tmp_path, "parquet", "small")) as pq_raw:
        assert raw.kind == "postgresql" and raw.name == "shop" and raw.tables == pq_raw.tables
        assert str(raw.path) == f"postgresql://{USER}@127.0.0.1:{server.port}/shop"
        for table in raw.tables:
            got, want = raw.sql(f'SELECT * FROM "{table}"').to_arrow_table(), \
                pq_raw.sql(f'SELECT * FROM "{table}"').to_arrow_table()
            assert got.column_names == want.column_names
            for name in got.column_names:
                if name != "gift":  # int8 in Parquet, smallint in PostgreSQL (it has no 1-byte integer)
                    assert got.schema.field(name).type == want.schema.field(name).type, f"{table}.{name}"
                assert got.column(name).to_pylist() == want.column(name).to_pylist(), f"{table}.{name}"


def test_types_map_to_what_the_other_readers_give(server):
    with open_source(server.url("extras")) as raw:
        assert raw.tables == ["events", "lines", "people", "reviews"]
        schema = raw.schema("events")
        types = {f.name: f.type for f in schema}
        assert types["at_tz"] == pa.timestamp("us", tz="Etc/UTC") and types["at_local"] == pa.timestamp("us")
        assert types["amount"] == pa.decimal128(12, 2) and types["ratio"] == pa.float64()
        assert types["flag"] == pa.bool_() and types["day"] == pa.date32() and types["small"] == pa.int16()
        assert types["score"] == pa.float32() and types["price"] == pa.int64()  # a domain reads as its base type
        for text in ("note", "feeling", "doc", "tag", "tags", "code"):
            assert types[text] == pa.string(), text
        rows = raw.sql("SELECT * FROM events ORDER BY id").to_arrow_table().to_pylist()
    utc = dt.UTC
    assert rows[0]["at_tz"].astimezone(utc) == dt.datetime(2024, 3, 1, 10, 0, tzinfo=utc)
    assert rows[2]["at_tz"].astimezone(utc) == dt.datetime(2024, 3, 2, 5, 30, tzinfo=utc)
    assert rows[2]["at_local"] == dt.datetime(1999, 12, 31, 23, 59, 59, 500000)
    assert rows[0]["amount"] == decimal.Decimal("12.34") and rows[2]["amount"] == decimal.Decimal("-0.01")
    assert rows[0]["ratio"] == 1.5e30 and rows[1]["ratio"] != rows[1]["ratio"]  # NaN stays NaN (then NULL)
    assert (rows[0]["feeling"], rows[0]["doc"], rows[0]["tags"], rows[0]["code"]) == ("happy", '{"a": 1}', "{x,y}",
                                                                                        "ab ")
    assert rows[0]["tag"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" and rows[2]["note"] == "é ✓"
    assert rows[2]["day"] == dt.date(1815, 12, 23) and rows[2]["flag"] is False
    assert all(v is None for k, v in rows[1].items() if k not in ("id", "ratio"))


def test_draft_prefills_keys_from_the_catalog(server):
    with open_source(server.url("extras")) as raw:
        assert raw.hints["reviews"].primary_key == "review_no"
        assert raw.hints["reviews"].foreign_keys == {"buyer": "people"}
        assert raw.hints["lines"].primary_key is None  # composite: not a hint
        assert raw.hints["lines"].foreign_keys == {"review_no": "reviews"}
        assert "events" in raw.hints and raw.hints["events"].foreign_keys == {}
        with pytest.warns(DataWarning, match="'events.ratio': 1 of 3 rows hold NaN"):
            meta = draft_metadata(raw)
    assert meta.name == "extras"
    reviews = meta.tables["reviews"]
    # `buyer` is an integer without a key-like name: only the catalog makes it a foreign key
    assert reviews.columns["buyer"].foreign_key == "people.person_id"
    assert "recorded in the PostgreSQL catalog" in (reviews.columns["buyer"].reason or "")
    assert "recorded in the PostgreSQL catalog" in reviews.description
    assert meta.tables["lines"].columns["review_no"].foreign_key == "reviews.review_no"


def test_large_table_streams_in_batches_and_arrives_complete(server):
    url = server.url("bulk")
    with pg.connect(url) as conn, conn.cursor() as cur:  # the same table is more than one batch at this hint
        cur.adbc_statement.set_options(**{"adbc.postgresql.batch_size_hint_bytes": str(SMALL_BATCH_BYTES)})
        cur.execute("SELECT id, h, x FROM big ORDER BY id")
        assert sum(1 for _ in cur.fetch_record_batch()) > 10
        cur.execute("SELECT count(*), sum(id)::bigint, sum(x), md5(string_agg(h, ',' ORDER BY id)) FROM big")
        want = cur.fetchall()[0]
    with open_postgres(url, batch_bytes=SMALL_BATCH_BYTES, memory_limit_mb=128) as raw:
        got = raw.fetchall("SELECT count(*), sum(id), sum(x), md5(string_agg(h, ',' ORDER BY id)) FROM big")[0]
        first = raw.fetchall("SELECT id FROM big LIMIT 1")[0][0]
    assert got == (BULK_ROWS, *want[1:]) and int(want[0]) == BULK_ROWS
    assert first == 1  # rows come in primary-key order


# -- the CLI and the stores -------------------------------------------------------------------------------------
def _same_files(a: Path, b: Path) -> list[str]:
    names_a = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    names_b = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    assert names_a == names_b
    assert len(names_a) > 20
    return [n for n in names_a if not filecmp.cmp(a / n, b / n, shallow=False)]


def test_cli_draft_validate_preprocess_give_the_parquet_store(server, tmp_path, monkeypatch):
    runner = CliRunner()
    url = server.url()
    res = runner.invoke(app, ["draft-metadata", url, "-o", str(tmp_path / "draft.json")])
    assert res.exit_code == 0, res.output
    assert "3 tables, 3 primary keys, 2 foreign keys" in res.output
    _assert_no_password(res.output)
    meta = write_metadata(tmp_path)
    res = runner.invoke(app, ["validate-metadata", url, "-m", str(meta)])
    assert res.exit_code == 0, res.output
    assert "OK (3 tables, 8 tasks)" in res.output
    monkeypatch.setattr(pipeline, "load_encoder", lambda spec: HashEncoder())
    parquet = write_bookstore(tmp_path, "parquet", "small")
    for src, out in ((url, "from_pg"), (str(parquet), "from_parquet")):
        res = runner.invoke(app, ["preprocess", src, "-m", str(meta), "-o", str(tmp_path / out), "-q",
                                  "--memory-limit-mb", "256", "--threads", "1"])
        assert res.exit_code == 0, res.output
        _assert_no_password(res.output)
    # the store records nothing of its source (no path, no kind): every file is identical, metadata.json included
    assert _same_files(tmp_path / "from_pg", tmp_path / "from_parquet") == []


def test_timezones_decimals_booleans_text_give_the_parquet_store(server, tmp_path):
    parquet = tmp_path / "mixed"
    parquet.mkdir()
    pq.write_table(_payments(), parquet / "payments.parquet")
    with open_source(parquet) as raw:
        meta = draft_metadata(raw, name="mixed")
    assert {c.name: c.stype.name for c in meta.tables["payments"].columns.values()} == {
        "id": "IDENTIFIER", "paid_at": "TIMESTAMP", "amount": "NUMERICAL", "ok": "BOOLEAN", "memo": "CATEGORICAL",
        "channel": "CATEGORICAL"}
    save_metadata(meta, tmp_path / "mixed.json")
    a = preprocess(server.url("mixed"), tmp_path / "mixed.json", tmp_path / "a", encoder=HashEncoder(), progress=False)
    b = preprocess(parquet, tmp_path / "mixed.json", tmp_path / "b", encoder=HashEncoder(), progress=False)
    assert _same_files(a, b) == []


def test_tiny_schema_gives_the_parquet_store(server, tmp_path):
    """NaN, NULLs in every type, a dangling and a NULL foreign key: the same store bytes as from Parquet."""
    meta = write_metadata(tmp_path)
    stores = []
    for src, out in ((server.url(schema="tiny"), "a"), (write_bookstore(tmp_path, "parquet", "tiny"), "b")):
        with pytest.warns(DataWarning) as found:
            stores.append(preprocess(src, meta, tmp_path / out, encoder=HashEncoder(), progress=False))
        assert sorted(w.message.code for w in found) == ["dangling_foreign_key", "non_finite"]
    a, b = stores
    assert _same_files(a, b) == []


# -- errors and credentials -------------------------------------------------------------------------------------
@pytest.mark.parametrize("case, expected", [
    ("password", "password authentication failed"),
    ("database", 'database "nosuchdb" does not exist'),
    ("schema", "no schema 'nope' (schemas: nothing, public, tiny)"),
    ("empty", "schema 'nothing' has no tables"),
    ("port", "cannot connect"),
    ("numeric", "column 'vals.amount' (numeric(6,2)) holds NaN"),
])
def test_errors_name_the_server_and_the_problem_never_the_password(server, case, expected):
    url = {"password": server.url(password="wrong-pass"), "database": server.url("nosuchdb"),
           "schema": server.url(schema="nope"), "empty": server.url(schema="nothing"),
           "port": server.url().replace(str(server.port), str(free_port())), "numeric": server.url("badnum")}[case]
    with pytest.raises(DataError) as info:
        open_source(url)
    msg = str(info.value)
    assert expected in msg and redact_url(url) in msg, msg
    _assert_no_password(msg)


def test_cli_error_exits_1_without_password_or_traceback(server, tmp_path):
    res = CliRunner().invoke(app, ["validate-metadata", server.url(password="wrong-pass"), "-m",
                                   str(write_metadata(tmp_path))])
    assert res.exit_code == 1
    assert "password authentication failed" in res.output and "Traceback" not in res.output
    _assert_no_password(res.output)


def test_credentials_from_the_pg_environment(server, monkeypatch):
    for name, value in {"PGHOST": "127.0.0.1", "PGPORT": str(server.port), "PGUSER": USER, "PGPASSWORD": PASSWORD,
                        "PGDATABASE": "shop"}.items():
        monkeypatch.setenv(name, value)
    with open_source("postgresql://") as raw:
        assert raw.name == "shop" and raw.tables == ["books", "customers", "orders"]
    with open_source("postgresql:///shop?schema=tiny") as raw:
        assert raw.num_rows("orders") == 6
    monkeypatch.setenv("PGHOST", str(server.dir))  # the unix socket
    with open_source("postgresql:///extras") as raw:
        assert raw.num_rows("people") == 20
    monkeypatch.setenv("PGPASSWORD", "wrong-pass")
    with pytest.raises(DataError, match="password authentication failed") as info:
        open_source("postgresql://")
    _assert_no_password(str(info.value))


def test_hostile_schema_name_stays_a_name_and_the_copy_is_locked(server, tmp_path):
    """`?schema=` is the only text of the user's that reaches the server: a bound parameter or a quoted identifier,
    so a name holding quotes and SQL reads that schema and runs nothing; the DuckDB copy then reaches no file."""
    name = 'we"ird; DROP TABLE keep; --'
    quoted = '"' + name.replace('"', '""') + '"'
    _execute(server.url("postgres"), "CREATE DATABASE hostile")
    _execute(server.url("hostile"), "CREATE TABLE keep (id integer PRIMARY KEY)", "INSERT INTO keep VALUES (1)",
             f"CREATE SCHEMA {quoted}", f"CREATE TABLE {quoted}.t (id integer PRIMARY KEY, v text)",
             f"INSERT INTO {quoted}.t VALUES (1, 'a'), (2, 'b')")
    with open_source(server.url("hostile", schema=urllib.parse.quote(name, safe=""))) as raw:
        assert raw.tables == ["t"] and raw.fetchall("SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "b")]
        with pytest.raises(duckdb.Error, match="disabled by configuration"):
            raw.con.execute(f"COPY t TO '{tmp_path / 'pwned.csv'}'")
    assert not (tmp_path / "pwned.csv").exists()
    with open_source(server.url("hostile")) as raw:
        assert raw.tables == ["keep"] and raw.num_rows("keep") == 1
