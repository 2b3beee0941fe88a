"""A PostgreSQL URL's password never reaches a message, however the URL is written (case, missing slashes, a bad
port or host) and whichever command reads it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.sources.pg_url import looks_like_postgres_url, redact_url

SECRET = "s3cr%2Ft-pw"
VARIANTS = [
    f"POSTGRESQL://alice:{SECRET}@localhost/shop",  # upper-case scheme
    f"Postgres://alice:{SECRET}@localhost/shop",
    f"postgresql:/alice:{SECRET}@localhost/shop",  # one slash
    f"postgresql:alice:{SECRET}@localhost/shop",  # none
    f"postgresql://alice:{SECRET}@localhost:99999/shop",  # a port out of range
    f"postgresql://alice:{SECRET}@localhost:1/shop",  # nothing listens there
    f"postgresql://alice:{SECRET}@no-such-host.invalid/shop",  # a host that does not resolve
    f"postgresql://alice@localhost:1/shop?password={SECRET}",  # the password as a parameter
]


@pytest.mark.parametrize("url", VARIANTS)
def test_redact_removes_the_password_from_every_form(url):
    assert looks_like_postgres_url(url)
    shown = redact_url(url)
    assert SECRET not in shown and "s3cr" not in shown and "alice" in shown


@pytest.mark.parametrize("url", VARIANTS)
@pytest.mark.parametrize("command", ["draft-metadata", "validate-metadata", "preprocess"])
def test_no_command_prints_the_password(url, command, tmp_path):
    meta = tmp_path / "m.json"
    meta.write_text('{"name": "x", "tables": {}}')
    args = {"draft-metadata": [url, "-o", str(tmp_path / "d.json")],
            "validate-metadata": [url, "--metadata", str(meta)],
            "preprocess": [url, "--metadata", str(meta), "--out", str(tmp_path / "s"), "-q"]}[command]
    r = CliRunner().invoke(app, [command, *args])
    assert r.exit_code != 0
    assert "s3cr" not in r.output and "Traceback" not in r.output, r.output
    assert "error:" in r.output
