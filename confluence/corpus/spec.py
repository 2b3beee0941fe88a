"""What a pretraining corpus is: its spec (`CorpusSpec`), its members (`Member`), the file that records both
(`corpus.json`) and the read side (`open_corpus` -> `Corpus`), separate from the building (`build.py`) so that a
training run reads a corpus without importing the generators.

Layout of a corpus directory:

    corpus.json           the spec and every member with its role (train / heldout), written before building
    raw/<name>/           generator output (random: raw/ Parquet, random.metadata.json, spec.json; TPC-H: Parquet)
    stores/<name>/        processed stores (complete when their metadata.json exists: preprocess writes it last
                          and renames the store into place)

Members are `db_00000`, `db_00001`, ... (random databases of seeds seed, seed+1, ...), `tpch_sf0.01`, ..., and
databases of the user's own (`--database METADATA=SOURCE`), named by their metadata (`f1db`): preprocessed from
their source into `stores/<name>`, always trained on.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from confluence.errors import ConfluenceError
from confluence.store import format as fmt

CORPUS_FILE = "corpus.json"
FORMAT_VERSION = 1
MAX_DATABASES = 100_000  # names have five digits
MAX_ROWS = 100.0  # RandomSpec's limit on the row scale
MAX_HELDOUT = 0.5
MAX_TPCH_SCALE = 100.0
ROLES = ("train", "heldout")
MAX_EXTRA = 1_000  # databases of the user's own in one corpus
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


class CorpusError(ConfluenceError):
    """A corpus directory, spec or member is wrong (the message names which)."""


def random_name(i: int) -> str:
    """The member name of the i-th random database."""
    return f"db_{i:05d}"


def tpch_name(scale: float) -> str:
    """The member name of TPC-H at scale factor `scale` (`tpch_sf0.01`)."""
    return f"tpch_sf{scale:g}"


def is_heldout(i: int, heldout: float) -> bool:
    """Whether the i-th random database is held out: member i is held out when floor((i + 1) h + o) exceeds
    floor(i h + o), with o = max(0, 1 - 2h), in exact decimal arithmetic. That spreads the held-out members
    evenly (about a share h of any prefix, at least one of the first two when h > 0: db_00001) and depends on i
    alone, so growing a corpus keeps every earlier member's role. The databases are independent draws, so an
    even spread is as fair a choice as a random one."""
    h = Fraction(repr(float(heldout)))
    if h <= 0:
        return False
    o = max(Fraction(0), 1 - 2 * h)
    return math.floor((i + 1) * h + o) > math.floor(i * h + o)


@dataclass(frozen=True)
class Member:
    """One database of a corpus: `kind` "random" (with `seed`), "tpch" (with `scale`) or "database" (one of the
    user's own: its `source` and reviewed `metadata` file), `role` "train" or "heldout", its generator output `raw`
    (none for a database of the user's own: its source is read in place) and its processed `store`."""

    name: str
    kind: str
    role: str
    raw: Path
    store: Path
    seed: int | None = None
    scale: float | None = None
    source: str | None = None
    metadata: Path | None = None

    @property
    def complete(self) -> bool:
        """Whether its store is whole (metadata.json is written last, then the store is renamed into place)."""
        return (self.store / fmt.METADATA_FILE).is_file()

    @property
    def label(self) -> str:
        """The name with what generated it, for error messages: `db_00003 (seed 3)`, `tpch_sf0.01 (scale 0.01)`."""
        if self.kind == "random":
            return f"{self.name} (seed {self.seed})"
        if self.kind == "tpch":
            return f"{self.name} (scale {self.scale:g})"
        return f"{self.name} ({self.source} with {self.metadata})"

    def to_json(self) -> dict[str, Any]:
        """Its entry in corpus.json (paths are implied by the name, but for a database of the user's own)."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "role": self.role}
        if self.kind == "random":
            out["seed"] = self.seed
        elif self.kind == "tpch":
            out["scale"] = self.scale
        else:
            out.update(source=self.source, metadata=str(self.metadata))
        return out


@dataclass(frozen=True)
class Extra:
    """A database of the user's own in a corpus: member `name` (from its metadata's "name"), its `source` (what
    `confluence preprocess` reads: a folder, a DuckDB / SQLite file, a PostgreSQL URL), its reviewed `metadata`
    file and that file's sha256 (what identifies it: a source may move between machines, its metadata may not
    change)."""

    name: str
    source: str
    metadata: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        """Its entry in the spec part of corpus.json."""
        return {"name": self.name, "source": self.source, "metadata": self.metadata, "sha256": self.sha256}


def extra_database(metadata: str | Path, source: str | Path) -> Extra:
    """The corpus entry of a database of the user's own: its metadata file read and checked as `confluence
    preprocess` reads it (`schema.metadata.load_metadata`), named by its "name", identified by its bytes' digest.
    CorpusError when the file cannot be read or is invalid, naming the file and what is wrong."""
    from confluence.errors import MetadataError
    from confluence.schema.metadata import load_metadata

    path = Path(metadata)
    try:
        meta = load_metadata(path)
        data = path.read_bytes()
    except MetadataError as exc:
        raise CorpusError(f"--database {metadata}: {exc}") from None
    except OSError as exc:
        raise CorpusError(f"--database {metadata}: cannot read its metadata file ({exc.strerror or exc})") from None
    name = re.sub(r"[^a-z0-9_]+", "_", meta.name.strip().lower()).strip("_")[:40]
    return Extra(name, str(source), str(path), hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class CorpusSpec:
    """Everything that decides a corpus's bytes: `databases` random databases of seeds seed .. seed+databases-1
    at row scale `rows`, a share `heldout` of them held out (`is_heldout`), TPC-H at each scale factor of `tpch`
    (always train), the databases of the user's own `extra` (always train), and the text encoder's identity
    `encoder` ({"kind", "fingerprint", "dim"}, as stores record it)."""

    seed: int
    databases: int
    rows: float
    heldout: float
    tpch: tuple[float, ...]
    encoder: Mapping[str, Any] = field(default_factory=dict)
    extra: tuple[Extra, ...] = ()

    def __post_init__(self) -> None:
        check_arguments(self.databases, self.seed, self.rows, self.heldout, self.tpch)
        check_extra(self.extra)
        object.__setattr__(self, "extra", tuple(self.extra))
        object.__setattr__(self, "tpch", tuple(sorted(float(s) for s in self.tpch)))
        object.__setattr__(self, "rows", float(self.rows))
        object.__setattr__(self, "heldout", float(self.heldout))
        object.__setattr__(self, "encoder", dict(self.encoder))

    def members(self, root: Path) -> tuple[Member, ...]:
        """The members under the corpus directory `root`: the random databases, TPC-H, then the user's own."""
        root = Path(root)
        out = [Member(n, "random", "heldout" if is_heldout(i, self.heldout) else "train", root / "raw" / n,
                      root / "stores" / n, seed=self.seed + i)
               for i in range(self.databases) for n in [random_name(i)]]
        out += [Member(n, "tpch", "train", root / "raw" / n, root / "stores" / n, scale=s)
                for s in self.tpch for n in [tpch_name(s)]]
        out += [Member(e.name, "database", "train", root / "raw" / e.name, root / "stores" / e.name,
                       source=e.source, metadata=Path(e.metadata)) for e in self.extra]
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        """The spec part of corpus.json."""
        return {"seed": self.seed, "databases": self.databases, "rows": self.rows, "heldout": self.heldout,
                "tpch": list(self.tpch), "encoder": dict(self.encoder), "extra": [e.to_json() for e in self.extra]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CorpusSpec:
        """The spec recorded in corpus.json."""
        return cls(seed=obj["seed"], databases=obj["databases"], rows=obj["rows"], heldout=obj["heldout"],
                   tpch=tuple(obj["tpch"]), encoder=obj["encoder"],
                   extra=tuple(Extra(**e) for e in obj.get("extra", [])))

    def differences(self, recorded: CorpusSpec) -> list[str]:
        """What forbids building this spec where `recorded` was built: each differing field with both values.
        More databases than recorded is not a difference (the corpus grows; roles depend on the index only);
        fewer is. Likewise databases of the user's own added after the recorded ones grow it."""
        out = [f"{name}: {getattr(recorded, name)!r} recorded, {getattr(self, name)!r} asked"
               for name in ("seed", "rows", "heldout", "tpch", "encoder")
               if getattr(recorded, name) != getattr(self, name)]
        mine, theirs = ([(e.name, e.sha256) for e in x.extra] for x in (self, recorded))
        if mine[:len(theirs)] != theirs:  # adding databases grows the corpus; removing or changing one does not
            out.append(f"databases of your own: {[n for n, _ in theirs]} recorded, {[n for n, _ in mine]} asked "
                       "(or a metadata file changed)")
        if self.databases < recorded.databases:
            out.append(f"databases: {recorded.databases} recorded, {self.databases} asked (a corpus grows, it "
                       "never shrinks)")
        return out


def check_arguments(databases: int, seed: int, rows: float, heldout: float, tpch: Sequence[float]) -> None:
    """Raise CorpusError naming the first argument out of range (the CLI's flags have the same names)."""
    if isinstance(databases, bool) or not isinstance(databases, int) or not 1 <= databases <= MAX_DATABASES:
        raise CorpusError(f"databases must be an integer in 1..{MAX_DATABASES}, got {databases!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CorpusError(f"seed must be an integer >= 0, got {seed!r}")
    if not isinstance(rows, int | float) or not (0 < rows <= MAX_ROWS):
        raise CorpusError(f"rows must be a number in (0, {MAX_ROWS:g}] (the scale of the row counts), got {rows!r}")
    if not isinstance(heldout, int | float) or not (0 <= heldout <= MAX_HELDOUT):
        raise CorpusError(f"heldout must be a share in [0, {MAX_HELDOUT}], got {heldout!r}")
    for s in tpch:
        if not isinstance(s, int | float) or not (0 < s <= MAX_TPCH_SCALE):
            raise CorpusError(f"tpch scale factors must be in (0, {MAX_TPCH_SCALE:g}], got {s!r}")
    names = [tpch_name(float(s)) for s in tpch]
    if len(set(names)) != len(names):
        raise CorpusError(f"tpch scale factors must differ, got {list(tpch)}")


def check_extra(extra: Sequence[Extra]) -> None:
    """Raise CorpusError when the user's own databases are too many, one's member name is not a plain name (it
    names the store's folder: a corpus.json naming `../x` must not write outside the corpus) or two share one."""
    if len(extra) > MAX_EXTRA:
        raise CorpusError(f"at most {MAX_EXTRA} databases of your own in one corpus, got {len(extra)}")
    seen: dict[str, str] = {}
    for e in extra:
        if not isinstance(e.name, str) or not _NAME.match(e.name) or e.name.startswith(("db_", "tpch_")):
            raise CorpusError(f"database of your own {e.metadata}: member name {e.name!r} must be 1-40 of a-z, 0-9, "
                              "'_', start with a letter and not with db_ or tpch_ (the corpus's own members); its "
                              "metadata's \"name\" gives it")
        if e.name in seen:
            raise CorpusError(f"two databases of your own are both named {e.name!r} ({seen[e.name]} and "
                              f"{e.metadata}): give one another \"name\" in its metadata")
        seen[e.name] = e.metadata


@dataclass(frozen=True)
class Corpus:
    """A corpus directory read back: its `spec` and `members`. `train_stores` and `heldout_stores` are the store
    paths to train on and to validate on (`confluence train --db ...` takes either list). `built` and `skipped`
    name the members built and found complete by the `build_corpus` call that returned it (empty from
    `open_corpus`); `warnings` holds the data warnings of the members built (the generator plants dangling
    foreign keys on purpose)."""

    root: Path
    spec: CorpusSpec
    members: tuple[Member, ...]
    built: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    warnings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def train_stores(self) -> list[Path]:
        """Stores of the train members, in member order (random databases, TPC-H, the user's own)."""
        return [m.store for m in self.members if m.role == "train"]

    @property
    def heldout_stores(self) -> list[Path]:
        """Stores of the held-out random databases, in member order."""
        return [m.store for m in self.members if m.role == "heldout"]

    @property
    def incomplete(self) -> list[Member]:
        """Members whose store is not (or not wholly) built yet."""
        return [m for m in self.members if not m.complete]


def read_spec(root: Path) -> tuple[CorpusSpec, list[dict[str, Any]]]:
    """The spec and the member entries recorded in `root/corpus.json`; CorpusError when it is missing or
    unreadable."""
    path = Path(root) / CORPUS_FILE
    if not path.is_file():
        raise CorpusError(f"{root}: not a corpus (no {CORPUS_FILE}); build one with `confluence corpus build`")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        if obj.get("format_version") != FORMAT_VERSION:
            raise CorpusError(f"{path}: corpus format version {obj.get('format_version')!r}, this code reads "
                              f"version {FORMAT_VERSION}; build the corpus again")
        return CorpusSpec.from_json(obj["spec"]), list(obj["members"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorpusError(f"{path}: unreadable corpus file ({type(exc).__name__}: {exc})") from None


def write_spec(root: Path, spec: CorpusSpec) -> None:
    """Write `root/corpus.json` (the spec and its members) through a temporary file and a rename."""
    obj = {"format_version": FORMAT_VERSION, "spec": spec.to_json(),
           "members": [m.to_json() for m in spec.members(root)]}
    tmp = Path(root) / f".{CORPUS_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, Path(root) / CORPUS_FILE)


def open_corpus(root: str | Path, *, require_complete: bool = True) -> Corpus:
    """Read the corpus in `root` (what `build_corpus` wrote): its spec, members, train and held-out stores.
    With `require_complete` (the default) a member whose store is missing or half-written is an error naming
    it, so a training run never starts on part of a corpus."""
    root = Path(root)
    spec, entries = read_spec(root)
    members = spec.members(root)
    if [m.to_json() for m in members] != entries:
        raise CorpusError(f"{root / CORPUS_FILE}: its member list does not follow from its spec; build the corpus "
                          "again")
    corpus = Corpus(root, spec, members)
    missing = corpus.incomplete
    if require_complete and missing:
        names = ", ".join(m.name for m in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise CorpusError(f"{root}: {len(missing)} of {len(members)} member store(s) not built ({names}); run "
                          f"`confluence corpus build --out {root} ...` again to finish it")
    return corpus
