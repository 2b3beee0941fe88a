"""PostgreSQL source URLs: tell one from a path, take our `schema` option out of what libpq gets, and show it
without its password (kept apart from `postgres.py` so that no caller pays for importing the driver)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote

from confluence.errors import DataError

URL_SCHEMES = ("postgresql://", "postgres://")
DEFAULT_SCHEMA = "public"
SCHEMA_OPTION = "schema"  # ours, removed before libpq sees the URL (libpq rejects unknown URL parameters)
CONNECT_TIMEOUT_S = 10  # unless the URL or PGCONNECT_TIMEOUT says otherwise (libpq alone waits for TCP's timeout)
_PASSWORD_KEYS = ("password", "sslpassword")


_ANY_SCHEME = re.compile(r"^(postgres(?:ql)?:/*)", re.IGNORECASE)  # a URL attempt, however misspelt


def is_postgres_url(source: object) -> bool:
    """Whether `source` is a PostgreSQL connection URL (`postgresql://...` or `postgres://...`)."""
    return isinstance(source, str) and source.startswith(URL_SCHEMES)  # libpq's prefixes, case-sensitive too


def looks_like_postgres_url(source: object) -> bool:
    """Whether `source` was meant as a PostgreSQL URL (`POSTGRESQL://`, `postgresql:/`, ...): such a string may hold
    a password, so it is only ever shown through `redact_url`, and refused unless `is_postgres_url`."""
    return isinstance(source, str) and _ANY_SCHEME.match(source) is not None


def _split_url(url: str) -> tuple[str, str, str, str]:
    """(scheme with its slashes, authority, path, query) of a libpq URL (or a misspelt one), decoding nothing."""
    m = _ANY_SCHEME.match(url)
    scheme, rest = (m.group(1), url[m.end():]) if m else url.split("://", 1)
    rest, _, query = rest.partition("?")
    authority, slash, path = rest.partition("/")
    return scheme, authority, slash + path, query


def _query_parts(query: str) -> list[tuple[str, str]]:
    """The raw `key=value` parts of a query string with each decoded key (values stay as written)."""
    return [(unquote(p.partition("=")[0]), p) for p in query.split("&") if p]


def redact_url(url: str) -> str:
    """The URL without its password (`user:secret@host` -> `user@host`, `password=` and `sslpassword=` parameters
    dropped): the only form in which a PostgreSQL source is ever shown, also when the URL is misspelt."""
    if "://" not in url and not looks_like_postgres_url(url):
        return url
    scheme, authority, path, query = _split_url(url)
    userinfo, at, hosts = authority.rpartition("@")
    if at:
        authority = userinfo.partition(":")[0] + "@" + hosts
    kept = [p for key, p in _query_parts(query) if key.lower() not in _PASSWORD_KEYS]
    return scheme + authority + path + ("?" + "&".join(kept) if kept else "")


def _secrets(url: str) -> list[str]:
    """Every password the URL or the environment holds (raw and decoded), to scrub from driver messages."""
    found: list[str] = []
    _, authority, _, query = _split_url(url)
    userinfo, at, _ = authority.rpartition("@")
    if at and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    found += [p.partition("=")[2] for key, p in _query_parts(query) if key.lower() in _PASSWORD_KEYS]
    if os.environ.get("PGPASSWORD"):
        found.append(os.environ["PGPASSWORD"])
    found += [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


@dataclass(frozen=True)
class PostgresTarget:
    """A parsed source URL: what libpq gets, which schema to read, and how messages name the source."""

    libpq_url: str  # the URL without our `schema` option (plus a connect timeout unless one is set)
    schema: str
    display: str  # the URL without its password
    secrets: tuple[str, ...]  # passwords to scrub from driver messages


def parse_url(url: str) -> PostgresTarget:
    """Split a source URL into libpq's URL and the schema to read (`?schema=NAME`, default `public`)."""
    if not is_postgres_url(url):
        raise DataError(f"{redact_url(url)}: not a PostgreSQL URL (expected postgresql://[user@][host][:port][/db])")
    display = redact_url(url)
    scheme, authority, path, query = _split_url(url)
    parts = _query_parts(query)
    schemas = [unquote(p.partition("=")[2]) for key, p in parts if key == SCHEMA_OPTION]
    if len(schemas) > 1:
        raise DataError(f"{display}: the URL names more than one schema ({', '.join(schemas)}); give one")
    if schemas and not schemas[0]:
        raise DataError(f"{display}: the URL's schema option is empty (give ?schema=NAME, or leave it out for"
                        f" '{DEFAULT_SCHEMA}')")
    kept = [p for key, p in parts if key != SCHEMA_OPTION]
    if not any(key == "connect_timeout" for key, _ in parts) and not os.environ.get("PGCONNECT_TIMEOUT"):
        kept.append(f"connect_timeout={CONNECT_TIMEOUT_S}")
    libpq = scheme + authority + path + ("?" + "&".join(kept) if kept else "")
    return PostgresTarget(libpq, schemas[0] if schemas else DEFAULT_SCHEMA, display, tuple(_secrets(url)))


def driver_message(exc: BaseException, target: PostgresTarget) -> str:
    """The driver's message on one line, without ADBC's prefixes and with any password replaced by ***."""
    msg = str(exc)
    for secret in target.secrets:
        msg = msg.replace(secret, "***")
    msg = re.sub(r"^(\w+: )?\[libpq\] ", "", msg.strip())
    msg = re.sub(r"^Failed to connect: ", "", msg)
    return re.sub(r"\s+", " ", msg).strip()
