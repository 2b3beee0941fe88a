"""What the user's SQL may do on a raw source's DuckDB connection (docs/design/data_sources_and_metadata.md, "What a task
query may do").

A task's query comes from a metadata file, which people share with each other, and runs on the connection that
reads the raw database. Two layers keep it to reading that database:

- `check_task_query`: the query must be exactly one read-only SELECT, checked with DuckDB's own parser
  (`extract_statements`, then the AST of `json_serialize_sql` walked), that reads only the database's tables and
  its own WITH names, calls no table function but the pure generators `range`, `generate_series` and `unnest`, and
  no function that exposes the machine or the session (`current_setting`, `getenv`, ...). It runs as
  `task_subquery(query)`, on lines of its own, so a trailing `--` comment cannot swallow the closing parenthesis.
- `lock_down`: once a source's views exist, its connection reads only the files those views read, cannot write,
  attach, install or load anything, and its settings are frozen (`SET lock_configuration = true`). Settings the
  callers need (memory limit, threads) are therefore applied here, before the lock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb

from confluence.errors import MetadataError
from confluence.sources.raw import quote_literal

__all__ = ["ALLOWED_TABLE_FUNCTIONS", "REFUSED_FUNCTIONS", "check_task_query", "configure", "is_locked", "lock_down",
           "task_query_problem", "task_subquery"]

# Table functions that only generate values from their arguments (no file, no catalog, no setting).
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
# Scalar functions that expose the machine or the session (settings, environment, catalog, connection, versions),
# change state (sequences, the random seed, the log) or handle other SQL text; and every name with these prefixes
# (PostgreSQL's catalog and privilege functions, DuckDB's and PRAGMA's catalog functions) but pg_typeof.
REFUSED_FUNCTIONS = frozenset({
    "current_setting", "getenv", "getvariable", "current_database", "current_catalog", "current_schema",
    "current_schemas", "current_query", "current_query_id", "current_connection_id", "current_transaction_id",
    "txid_current", "current_user", "current_role", "session_user", "user", "version", "get_block_size",
    "in_search_path", "col_description", "obj_description", "shobj_description", "inet_client_addr",
    "inet_client_port", "inet_server_addr", "inet_server_port", "write_log", "nextval", "currval", "setval",
    "setseed", "sleep_ms", "json_serialize_sql", "json_deserialize_sql", "json_serialize_plan",
    "json_execute_serialized_sql", "query", "query_table",
})
_REFUSED_PREFIXES = ("pg_", "has_", "duckdb_", "pragma_")
_HARMLESS = frozenset({"pg_typeof"})
# Table references that read nothing by themselves (their parts are checked): subqueries, joins, VALUES lists,
# no FROM, PIVOT / UNPIVOT. Anything else (DESCRIBE / SHOW / SUMMARIZE, future kinds) is refused.
_PLAIN_REFS = frozenset({"SUBQUERY", "JOIN", "EXPRESSION_LIST", "EMPTY", "PIVOT"})
# How a refused statement kind (duckdb.StatementType) is named in messages: "it is <name> statement".
_STATEMENT_NAMES = {"LOAD": "an INSTALL or LOAD", "MULTI": "a PIVOT (or other multi-part)", "SET": "a SET",
                    "VARIABLE_SET": "a SET VARIABLE", "INSERT": "an INSERT", "UPDATE": "an UPDATE",
                    "ALTER": "an ALTER", "ATTACH": "an ATTACH", "EXPLAIN": "an EXPLAIN", "EXECUTE": "an EXECUTE",
                    "EXPORT": "an EXPORT", "EXTENSION": "an extension's", "COPY_DATABASE": "a COPY DATABASE",
                    "MERGE_INTO": "a MERGE INTO", "CREATE_FUNC": "a CREATE MACRO"}
TASK_VIEW_SCHEMA = "relbench_tasks"  # confluence.sources.relbench_tasks.TASK_SCHEMA (not imported: no cycle)


def task_subquery(query: str) -> str:
    """`query` as a parenthesised subquery on lines of its own, so that a trailing `--` comment ends at its line
    instead of swallowing the closing parenthesis. Use it only on a query `check_task_query` accepted."""
    return f"(\n{query}\n)"


def check_task_query(con: duckdb.DuckDBPyConnection, task: str, query: str) -> None:
    """Refuse a task query that is not exactly one read-only SELECT over the database's tables: a `MetadataError`
    naming the task and what is refused (another statement kind, several statements, a table function, a relation
    that is not a table of the database, a function that exposes the machine). A query that does not parse is
    refused with DuckDB's parser error. Why: the query comes from a shared metadata file and would otherwise run
    with the connection's full powers (read and write files, attach databases, install extensions)."""
    problem = task_query_problem(con, query)
    if problem is not None:
        raise MetadataError([f"task '{task}': {problem}"])


def task_query_problem(con: duckdb.DuckDBPyConnection, query: str) -> str | None:
    """What `check_task_query` refuses in `query` (without the task's name), or None when it may run."""
    cur = con.cursor()
    try:
        statements = cur.extract_statements(query)
    except duckdb.Error as exc:
        return f"its query fails: {str(exc).strip().splitlines()[0]}"
    if not statements:
        return "its query is empty"
    if len(statements) > 1:
        return f"its query must be one read-only SELECT statement; it holds {len(statements)} statements"
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        what = _STATEMENT_NAMES.get(kind.name, "a " + kind.name.replace("_", " "))
        return f"its query must be one read-only SELECT statement; it is {what} statement"
    ast = json.loads(cur.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0][0])
    if ast.get("error") or len(ast.get("statements", [])) != 1:
        return ("its query must be one read-only SELECT statement; DuckDB cannot check it"
                f" ({ast.get('error_message', 'not one statement')})")
    relations = _relations(cur)
    found: list[str] = []
    try:
        _walk(ast["statements"][0], frozenset(), relations, found)
    except RecursionError:
        return "its query is nested too deeply to be checked"
    if not found:
        return None
    return "; ".join(dict.fromkeys(found))  # each refusal once, in query order


def _relations(cur: duckdb.DuckDBPyConnection) -> set[tuple[str, str]]:
    """(schema, name) of every table and view of the connection's own database (not attached ones, not temporary
    objects), lower-cased as DuckDB matches names."""
    rows = cur.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = current_database()"
        " AND NOT temporary UNION ALL SELECT schema_name, view_name FROM duckdb_views()"
        " WHERE database_name = current_database() AND NOT temporary AND NOT internal").fetchall()
    return {(s.lower(), n.lower()) for s, n in rows}


def _tables_note(relations: set[tuple[str, str]]) -> str:
    names = sorted(n if s == "main" else f"{s}.{n}" for s, n in relations)
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return f"a task query may read only the database's tables ({shown}) and its own WITH names"


def _walk(node: Any, ctes: frozenset[str], relations: set[tuple[str, str]], found: list[str]) -> None:
    """Collect in `found` what the AST `node` does that a task query may not; `ctes`: WITH names in scope."""
    if isinstance(node, list):
        for item in node:
            _walk(item, ctes, relations, found)
        return
    if not isinstance(node, dict):
        return
    cte_map = node.get("cte_map")
    if isinstance(cte_map, dict) and cte_map.get("map"):
        # DuckDB binds WITH entries in order: each sees the earlier ones and itself (WITH RECURSIVE), the body all
        scope = set(ctes)
        for entry in cte_map["map"]:
            scope.add(str(entry["key"]).lower())
            _walk(entry["value"], frozenset(scope), relations, found)
        ctes = frozenset(scope)
        node = {k: v for k, v in node.items() if k != "cte_map"}
    kind = node.get("type")
    if "class" not in node and "modifiers" not in node and "sample" in node and "alias" in node:  # a table ref
        if kind == "BASE_TABLE":
            _base_table(node, ctes, relations, found)
        elif kind == "TABLE_FUNCTION":
            function = node.get("function") or {}
            name = str(function.get("function_name", "?")).lower()
            if name not in ALLOWED_TABLE_FUNCTIONS or function.get("catalog") or function.get("schema"):
                found.append(f"its query may read only the database's tables; it calls the table function {name}"
                             f" (allowed: {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})")
            _walk(function.get("arguments"), ctes, relations, found)
            return
        elif kind == "SHOW_REF":
            found.append("its query must be one read-only SELECT statement; it uses DESCRIBE / SHOW / SUMMARIZE")
        elif kind not in _PLAIN_REFS:
            found.append(f"its query must be one read-only SELECT statement; it uses a {kind} table reference")
    elif node.get("class") == "FUNCTION":
        name = str(node.get("function_name", "")).lower()
        if name not in _HARMLESS and (name in REFUSED_FUNCTIONS or name.startswith(_REFUSED_PREFIXES)):
            found.append(f"its query may not call {name}(), which exposes the machine or the session")
    for value in node.values():
        if isinstance(value, dict | list):
            _walk(value, ctes, relations, found)


def _base_table(node: dict[str, Any], ctes: frozenset[str], relations: set[tuple[str, str]],
                found: list[str]) -> None:
    catalog, schema = str(node.get("catalog_name") or ""), str(node.get("schema_name") or "")
    name = str(node.get("table_name") or "")
    shown = ".".join(p for p in (catalog, schema, name) if p)
    if not catalog and not schema and name.lower() in ctes:
        return
    if not catalog and (schema.lower() or "main", name.lower()) in relations and schema.lower() in (
            "", "main", TASK_VIEW_SCHEMA):
        return
    found.append(f"its query fails: it reads '{shown}', which is not a table of the database; {_tables_note(relations)}")


def configure(con: duckdb.DuckDBPyConnection, *, memory_limit_mb: int | None = None, threads: int | None = None
              ) -> None:
    """Apply DuckDB's memory limit and thread count (when given) and keep rows in insertion order, on a connection
    that is not locked yet."""
    if memory_limit_mb is not None:
        con.execute(f"SET memory_limit = '{int(memory_limit_mb)}MB'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    con.execute("SET preserve_insertion_order = true")


def lock_down(con: duckdb.DuckDBPyConnection, *, paths: Iterable[str | Path] = (),
              directories: Iterable[str | Path] = (), memory_limit_mb: int | None = None,
              threads: int | None = None) -> None:
    """Configure (`configure`) then lock a raw source's connection once its views and tables exist: it may read
    only `paths` (files) and `directories` (what its views read), never write a file, attach a database, install or
    load an extension, scan a Python variable by name, or change a setting again. Spilling to DuckDB's temporary
    directory, `register()`ed Arrow tables and the views keep working. Why: defence in depth behind
    `check_task_query`, should a query it accepted still reach the machine."""
    configure(con, memory_limit_mb=memory_limit_mb, threads=threads)
    files = [str(p) for p in paths]
    dirs = [str(d) for d in directories]
    if files:
        con.execute(f"SET allowed_paths = [{', '.join(quote_literal(f) for f in files)}]")
    if dirs:
        con.execute(f"SET allowed_directories = [{', '.join(quote_literal(d) for d in dirs)}]")
    for setting in ("python_enable_replacements = false", "enable_external_access = false",
                    "autoinstall_known_extensions = false", "autoload_known_extensions = false",
                    "lock_configuration = true"):
        con.execute(f"SET {setting}")


def is_locked(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether `lock_down` (or anyone) locked the connection's configuration: SET then fails."""
    value = con.cursor().execute("SELECT current_setting('lock_configuration')").fetchall()[0][0]
    return str(value).lower() == "true"
