"""`confluence devsuite list / build`: the development suite's real databases (docs/guide/devsuite.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer

from confluence.cli.common import fail
from confluence.errors import ConfluenceError

devsuite_app = typer.Typer(help="The development suite: real databases built from their public sources.",
                           no_args_is_help=True, rich_markup_mode=None)


@devsuite_app.command("list")
def list_cmd() -> None:
    """The suite's databases: name, role (tune: settings may be chosen on it; check: only measured), source."""
    from confluence.devsuite import MEMBERS, member

    for name in MEMBERS:
        mod = member(name)
        src = mod.SOURCE
        where = f"{src['repo']}@{src['commit']}" if "repo" in src else f"{src.get('package')}=={src.get('version')}"
        typer.echo(f"{name:<16} {mod.ROLE:<6} {where}  ({src.get('licence', '?')[:60]})")


@devsuite_app.command("build")
def build_cmd(
    name: str = typer.Argument(..., help="A suite database (confluence devsuite list)."),
    source: Path = typer.Option(None, "--source", help="The source: a directory of its files, or the git directory "
                                "the fetch tool brought (its recorded commit is extracted). Unused by generated "
                                "databases."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the raw database (one Parquet file per table)."),
) -> None:
    """Build one suite database from its source into --out (one Parquet file per table); its reviewed metadata
    ships in the package (the path is printed)."""
    import tempfile

    from confluence import outputs
    from confluence.devsuite import checkout, member, metadata_path

    try:
        mod = member(name)
        outputs.claim(out, "raw-database")
        with tempfile.TemporaryDirectory(prefix=f"devsuite-{name}-") as tmp:
            src = source
            git_dir = None if source is None else next(
                (d for d in (source, source / "repo") if (d / "HEAD").is_file() and (d / "objects").is_dir()), None)
            if git_dir is not None:  # the fetch tool's mirror (or any bare git directory): its recorded commit
                src = checkout(git_dir, mod.SOURCE["commit"], Path(tmp) / "src", tuple(mod.SOURCE.get("paths", ())))
            with outputs.locked(out), outputs.writing(out, f"the {name} database"):
                work = outputs.temp_dir(out, "raw-database")
                try:
                    mod.build(src, work)
                    outputs.replace_dir(work, out, "raw-database")
                finally:
                    shutil.rmtree(work, ignore_errors=True)
    except (ConfluenceError, OSError) as exc:
        fail(exc)
    typer.echo(f"wrote {out}; its metadata: {metadata_path(name)}")


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    """Add `confluence devsuite ...`."""
    del bench_app, text_app
    app.add_typer(devsuite_app, name="devsuite")
