"""What every CLI module shares: how a user-facing error ends a command."""

from __future__ import annotations

from typing import NoReturn

import typer


def fail(error: object) -> NoReturn:
    """Print `error: <message>` on stderr and exit with status 1 (bad input; typer's usage errors exit 2). The
    message names what is wrong (a ConfluenceError's text); no traceback."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(code=1)
