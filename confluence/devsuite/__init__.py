"""The development suite: real relational databases beside nycflights13, each built by a script from its public
source (a repository brought here with the `fetch` tool, or a PyPI package), with reviewed metadata and tasks written
as in a real project (docs/guide/devsuite.md).

Each member is a module of this package (`confluence.devsuite.<name>`) with:

* `SOURCE`: where the data comes from (`repo` owner/name and `commit`, or a PyPI package and version), its
  `licence` (quoted) and a one-line `description`;
* `ROLE`: "tune" (recipes may be chosen on its validation split) or "check" (only ever measured: never used to
  choose a setting, so that it says how a recipe does on a database nobody tuned on);
* `build(source: Path, out: Path) -> Path`: read the source (a directory holding the source's files, e.g. a checkout
  made by `checkout`) and write the raw database as one Parquet file per table into `out`, deterministically
  (the same source gives the same bytes); returns `out`;

and beside it `<name>.metadata.json`, the reviewed metadata (tables, keys, time columns, tasks).
"""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path
from types import ModuleType

from confluence.errors import ConfluenceError

# the members, in the order the suite runs them
MEMBERS: tuple[str, ...] = ("euip", "f1db", "intl_football", "sakila", "tpcds", "unvotes")
ROLES = ("tune", "check")


def member(name: str) -> ModuleType:
    """The module of suite member `name` (a ConfluenceError naming the members otherwise)."""
    if name not in MEMBERS:
        raise ConfluenceError(f"no development-suite database {name!r}; the suite has {', '.join(MEMBERS) or 'none'}")
    return importlib.import_module(f"confluence.devsuite.{name}")


def members_with_role(role: str) -> tuple[str, ...]:
    """The members whose ROLE is `role` ("tune" or "check"), in the suite's order."""
    if role not in ROLES:
        raise ConfluenceError(f"no development-suite role {role!r}; the roles are {', '.join(ROLES)}")
    return tuple(name for name in MEMBERS if member(name).ROLE == role)


def metadata_path(name: str) -> Path:
    """The reviewed metadata file of member `name`."""
    return Path(__file__).with_name(f"{name}.metadata.json")


def checkout(git_dir: Path, commit: str, dest: Path, paths: tuple[str, ...] = ()) -> Path:
    """Extract `commit` of the (bare) git directory `git_dir` into `dest` (only under `paths` when given), the
    directory `build` reads. A mirror lacks the blobs of its largest files: those files are simply absent (`git
    archive` would stop at the first one)."""
    tree = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "-r", commit, "--", *paths],
                          capture_output=True, text=True, check=False)
    if tree.returncode != 0:
        raise ConfluenceError(f"{git_dir}: cannot read commit {commit}: {tree.stderr.strip()[:300]}")
    entries = [(line.split(None, 3)[2], line.split("\t", 1)[1]) for line in tree.stdout.splitlines()
               if line.split(None, 3)[1] == "blob"]
    batch = subprocess.Popen(["git", "--git-dir", str(git_dir), "cat-file", "--batch"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert batch.stdin is not None and batch.stdout is not None
    try:
        for sha, rel in entries:
            batch.stdin.write(sha.encode() + b"\n")
            batch.stdin.flush()
            header = batch.stdout.readline().split()
            if len(header) < 3 or header[1] != b"blob":  # "<sha> missing": a blob the mirror does not hold
                continue
            data = batch.stdout.read(int(header[2]))
            batch.stdout.read(1)  # the newline after the object
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    finally:
        batch.stdin.close()
        batch.wait()
    return dest


def write_table(con, query: str, out: Path, table: str) -> None:
    """Write a query's rows to `out/<table>.parquet` (zstd), as every member's build does: one writer thread on
    `con` gives the same bytes on every run."""
    from confluence.sources.raw import quote_literal

    target = quote_literal(str(out / f"{table}.parquet"))
    con.execute(f"COPY ({query}) TO {target} (FORMAT parquet, COMPRESSION zstd)")
