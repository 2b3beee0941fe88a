"""CLI of the shipped pretrained models: `confluence pretrained list | show | export` (`confluence.pretrained`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from confluence.cli.common import fail

pretrained_app = typer.Typer(help="Pretrained models shipped in the package (pretrained:NAME).", no_args_is_help=True,
                             rich_markup_mode=None)


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    app.add_typer(pretrained_app, name="pretrained")

    @pretrained_app.command("list")
    def list_cmd() -> None:
        """The shipped models: name, step, databases, size; use one as --checkpoint pretrained:NAME."""
        from confluence.pretrained import PREFIX, available, card

        names = available()
        if not names:
            typer.echo("no pretrained model is shipped in this installation")
        for name in names:
            c = card(name)
            typer.echo(f"{PREFIX}{name}  step {c.get('step')}  {c.get('bytes', 0) / 2**20:.1f} MiB  "
                       f"{c.get('corpus', '')}")

    @pretrained_app.command("show")
    def show_cmd(name: str = typer.Argument(..., help="NAME or pretrained:NAME")) -> None:
        """Print a shipped model's card (how it was made, what it measured) after checking its files."""
        from confluence.errors import ConfluenceError
        from confluence.pretrained import PREFIX, card, checkpoint_path

        name = name[len(PREFIX):] if name.startswith(PREFIX) else name
        try:
            path = checkpoint_path(name)
            typer.echo(json.dumps(card(name), indent=2))
            typer.echo(f"files checked against the card's sha256: {path}")
        except ConfluenceError as exc:
            fail(exc)

    @pretrained_app.command("export")
    def export_cmd(
        run: Path = typer.Argument(..., help="Run directory whose latest checkpoint is shipped."),
        name: str = typer.Option(..., "--name", help="The model's name (loaded as pretrained:NAME)."),
        info: Path = typer.Option(None, "--info", help="JSON file of card fields: corpus, hardware, wall time, "
                                                        "command, results."),
        to: Path = typer.Option(None, "--to", help="Directory to ship into (default: the installed package's)."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a shipped model of the same name."),
    ) -> None:
        """Ship a run's parameters as pretrained:NAME (at most 25 MiB), with a card recording each file's sha256."""
        from confluence.errors import ConfluenceError
        from confluence.pretrained import card, export_pretrained

        try:
            fields = json.loads(info.read_text()) if info else {}
            if not isinstance(fields, dict):
                raise ConfluenceError(f"--info {info}: expected a JSON object of card fields")
            dest = export_pretrained(run, name, fields, root=to, overwrite=overwrite)
        except (ConfluenceError, OSError, json.JSONDecodeError) as exc:
            fail(exc)
        typer.echo(f"shipped {run} as pretrained:{name} in {dest}")
        code = card(name, dest.parent).get("code") or {}
        if code.get("dirty"):
            typer.echo(f"note: the run was trained from a working tree that differed from commit {code.get('commit')} "
                       f"(diff sha256 {code.get('diff_sha256')}); the card records it, but the commit alone will not "
                       "rebuild these parameters")
