"""`build_corpus`: generate and preprocess every member of a pretraining corpus, in parallel, resumably.

Each member is one job: write its raw database (`confluence.synth.write_random`, or TPC-H with `tpchgen-cli`),
then `confluence.preprocess.preprocess` it into `stores/<name>`. Both steps write into a temporary directory that
is renamed into place, so a member killed mid-way leaves no half-written raw database or store, only a temporary
directory that the next run removes; a member whose store is complete is skipped. Jobs run in `workers` processes
started with "spawn" (JAX, numba and DuckDB threads do not survive a fork); every output is a function of the spec
alone, so the bytes do not depend on `workers` or on how many runs it took.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from confluence import outputs
from confluence.corpus.spec import (
    CORPUS_FILE,
    Corpus,
    CorpusError,
    CorpusSpec,
    Extra,
    Member,
    check_arguments,
    check_extra,
    extra_database,
    read_spec,
    write_spec,
)
from confluence.errors import ConfluenceError
from confluence.preprocess.embeddings import encoder_info
from confluence.synth.tpch import ensure_tpch, tpch_metadata_path, tpchgen_path
from confluence.textenc.base import TextEncoder
from confluence.textenc.registry import load_encoder
from confluence.toolkit.progress import Reporter

LOCK_FILE = ".lock"
TPCH_INSTALL = "pip install tpchgen-cli (or pip install -e '.[bench]')"


@dataclass(frozen=True)
class _Job:
    """What a worker needs to build one member (picklable: the encoder travels as its spec string unless the
    caller passed an encoder object)."""

    member: Member
    rows: float
    encoder: TextEncoder | str | None
    fingerprint: str
    embedding_cache: str | None
    threads: int | None


def build_corpus(
    out: str | Path,
    databases: int,
    *,
    seed: int = 0,
    rows: float = 1.0,
    heldout: float = 0.1,
    tpch: Sequence[float] = (),
    extra: Sequence[tuple[str | Path, str | Path] | Extra] = (),
    workers: int = 1,
    encoder: TextEncoder | str | None = None,
    embedding_cache: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Corpus:
    """Build (or finish) the corpus in `out`: `databases` random databases of seeds seed, seed+1, ... at row
    scale `rows` (`RandomSpec.rows`), about a share `heldout` of them held out for validation
    (`confluence.corpus.spec.is_heldout`), TPC-H at each scale factor of `tpch` (train; needs `tpchgen-cli`), and
    databases of the user's own, `extra`: (metadata file, source) pairs, preprocessed from their source (train;
    never a check database of the development suite: those stay unseen so that they measure what nobody tuned on).

    `encoder` is a `TextEncoder` or a spec string of `confluence.textenc.registry.load_encoder` (None: the
    shipped default, as `confluence preprocess`); `embedding_cache` a directory shared by the workers. `workers`
    processes build members at once (1: in this process). Members whose store is complete are skipped; a
    corpus of the same spec with more `databases` grows. Another spec in `out` is a CorpusError naming the
    differing fields unless `overwrite` (which deletes the corpus's raw/, stores/ and corpus.json first). A
    member that fails does not stop the others; the CorpusError raised at the end names each failed member
    and its seed (complete members are kept, a rerun retries the rest). `progress` shows one step per member.
    """
    check_arguments(databases, seed, rows, heldout, tpch)
    extra = tuple(e if isinstance(e, Extra) else extra_database(*e) for e in extra)
    check_extra(extra)
    refuse_check_databases(extra)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise CorpusError(f"workers must be an integer >= 1, got {workers!r}")
    if tpch and tpchgen_path() is None:
        raise CorpusError(f"--tpch needs tpchgen-cli (the 'bench' extra), which is not installed: {TPCH_INSTALL}")
    resolved = encoder if isinstance(encoder, TextEncoder) else load_encoder(encoder)
    spec = CorpusSpec(seed=seed, databases=databases, rows=rows, heldout=heldout, tpch=tuple(tpch),
                      encoder=encoder_info(resolved), extra=extra)
    root = Path(out)
    outputs.claim(root, "corpus", legacy=lambda p: (p / CORPUS_FILE).is_file())
    with outputs.locked(root, "built"), outputs.writing(root, "the corpus", "the members already built are kept"):
        outputs.mark(root, "corpus")
        _prepare(root, spec, overwrite)
        members = spec.members(root)
        todo = [m for m in members if not m.complete]
        skipped = tuple(m.name for m in members if m.complete)
        in_process = workers == 1 or len(todo) <= 1
        jobs = [_Job(m, spec.rows, resolved if in_process or isinstance(encoder, TextEncoder) else encoder,
                     str(resolved.fingerprint), None if embedding_cache is None else str(embedding_cache),
                     None if in_process else max(1, (os.cpu_count() or 1) // workers)) for m in todo]
        with Reporter(progress) as rep:
            rep.step(f"corpus members ({len(todo)} to build)", len(members))
            rep.advance(len(skipped))
            done, failed = _run(jobs, 1 if in_process else min(workers, len(jobs)), rep)
    if failed:
        raise CorpusError(f"{len(failed)} of {len(todo)} member(s) failed (the {len(members) - len(failed)} "
                          "others are complete and kept; run again to retry):\n"
                          + "\n".join(f"  - {m.label}: {why}" for m, why in failed)) from None
    return Corpus(root, spec, members, built=tuple(m.name for m in todo), skipped=skipped, warnings=done)


def refuse_check_databases(extra: Sequence[Extra]) -> None:
    """CorpusError when a database of the user's own is one of the development suite's check databases (by its
    metadata's name or its bytes): they are only ever measured, so no pretrained model may have seen them."""
    import hashlib

    from confluence import devsuite

    checks = {name: hashlib.sha256(devsuite.metadata_path(name).read_bytes()).hexdigest()
              for name in devsuite.members_with_role("check")}
    for e in extra:
        hit = e.name if e.name in checks else next((n for n, h in checks.items() if h == e.sha256), None)
        if hit is not None:
            raise CorpusError(f"--database {e.metadata}: {hit!r} is a check database of the development suite "
                              "(docs/guide/devsuite.md): it is only ever measured, never pretrained on")


def _prepare(root: Path, spec: CorpusSpec, overwrite: bool) -> None:
    """Check `spec` against the corpus already in `root` (or clear it with `overwrite`), record it in
    corpus.json, create raw/ and stores/ and remove the temporary directories of killed runs."""
    if (root / CORPUS_FILE).exists():
        if overwrite:
            for sub in ("raw", "stores"):
                shutil.rmtree(root / sub, ignore_errors=True)
            (root / CORPUS_FILE).unlink()
        else:
            recorded, _ = read_spec(root)
            diffs = spec.differences(recorded)
            if diffs:
                raise CorpusError(f"{root}: holds a corpus of another spec ({'; '.join(diffs)}); use the same "
                                  "settings, another --out, or --overwrite to rebuild it")
    write_spec(root, spec)
    for sub in ("raw", "stores"):
        (root / sub).mkdir(exist_ok=True)
        for leftover in (root / sub).glob(".tmp-*"):  # atomic_dir's and _tpch_raw's temporary directories
            shutil.rmtree(leftover, ignore_errors=True)
    for leftover in root.glob(f".{CORPUS_FILE}.tmp-*"):
        leftover.unlink(missing_ok=True)
    (root / LOCK_FILE).unlink(missing_ok=True)  # the lock of earlier versions (now beside the corpus)
    # stores/<name>.tmp-<pid> of killed runs are removed by preprocess's StoreWriter (recover_leftovers)


def _run(jobs: list[_Job], workers: int, rep: Reporter) -> tuple[dict[str, tuple[str, ...]],
                                                                  list[tuple[Member, str]]]:
    """Run the jobs (in this process when `workers` is 1), advancing `rep` once per member. Returns the data
    warnings of each member built and the failed members with their error, both in member order."""
    outcomes: dict[str, tuple[str, ...] | BaseException] = {}
    if workers == 1:
        for job in jobs:
            outcomes[job.member.name] = _attempt(lambda job=job: build_member(job))
            rep.advance(1)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(build_member, job): job for job in jobs}
            for fut in as_completed(futures):
                outcomes[futures[fut].member.name] = _attempt(fut.result)
                rep.advance(1)
    done = {j.member.name: r for j in jobs if not isinstance(r := outcomes[j.member.name], BaseException)}
    failed = [(j.member, _reason(r)) for j in jobs if isinstance(r := outcomes[j.member.name], BaseException)]
    return done, failed


def _attempt(call: Callable[[], tuple[str, ...]]) -> tuple[str, ...] | BaseException:
    """The result of `call`, or the exception it raised (one member's failure must not stop the others)."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - reported with the member's name at the end
        return exc


def _reason(exc: BaseException) -> str:
    """A failure in a line: a user error's own message; anything else (a bug) with its type."""
    return str(exc) if isinstance(exc, ConfluenceError) else f"{type(exc).__name__}: {exc}"


def build_member(job: _Job) -> tuple[str, ...]:
    """Write one member's raw database (unless there) and preprocess it into its store; returns its data
    warnings. Runs in a worker process."""
    from confluence.preprocess import preprocess
    from confluence.sources.data_warnings import recorded

    m = job.member
    if m.kind == "random":
        source, metadata = _random_raw(m, job.rows)
    elif m.kind == "tpch":
        source, metadata = _tpch_raw(m)
    else:  # a database of the user's own, read where it is
        source, metadata = m.source, m.metadata
    encoder = job.encoder if isinstance(job.encoder, TextEncoder) else load_encoder(job.encoder)
    if str(encoder.fingerprint) != job.fingerprint:
        raise CorpusError(f"the text encoder loaded in the worker has fingerprint {encoder.fingerprint!r}, the "
                          f"corpus records {job.fingerprint!r}")
    cache = None
    if job.embedding_cache is not None:
        from confluence.textenc.cache import EmbeddingCache

        cache = EmbeddingCache(job.embedding_cache)
    with recorded() as found:
        preprocess(source, metadata, m.store, encoder=encoder, embedding_cache=cache, threads=job.threads,
                   progress=False)
    return tuple(str(w) for w in found)


def _random_raw(m: Member, rows: float) -> tuple[Path, Path]:
    """The random database of member `m` (written if absent: write_random's directory appears atomically,
    so one present is whole); its raw folder and metadata file."""
    from confluence.synth.random_db import METADATA_FILE, SPEC_FILE, RandomSpec, write_random

    spec = RandomSpec(seed=m.seed, rows=rows)
    if not m.raw.exists():
        write_random(m.raw, spec)
    else:
        try:
            have = json.loads((m.raw / SPEC_FILE).read_text(encoding="utf-8"))["spec"]
            if not isinstance(have, dict):
                raise ValueError(f"its spec is a {type(have).__name__}, not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CorpusError(f"{m.raw}: not a random database written by the corpus ({exc}); remove it") from None
        want = dataclasses.asdict(spec)
        if have != want:
            keys = [*want, *(k for k in have if k not in want)]  # the spec's fields in order, then foreign ones
            differ = [k for k in keys if have.get(k, "unset") != want.get(k, "unset")]
            diffs = ", ".join(f"{k!s:.40} {have.get(k, 'unset')!r:.40} there, {want.get(k, 'unset')!r} here"
                              for k in differ[:8]) + (f", {len(differ) - 8} more" if len(differ) > 8 else "")
            raise CorpusError(f"{m.raw}: holds a random database of another spec ({diffs}; written by an earlier "
                              "generator?); remove it")
    return m.raw / "raw", m.raw / METADATA_FILE


def _tpch_raw(m: Member) -> tuple[Path, Path]:
    """TPC-H Parquet of member `m` (generated into a temporary directory renamed into place if absent); the
    folder and the shipped TPC-H metadata."""
    if not m.raw.exists():
        tmp = m.raw.parent / f".tmp-{m.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        started = time.perf_counter()
        try:
            ensure_tpch(tmp, float(m.scale))
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CorpusError(f"tpchgen-cli failed after {time.perf_counter() - started:.1f} s: {exc}") from exc
        os.replace(tmp, m.raw)
    return m.raw, tpch_metadata_path()


def describe(corpus: Corpus) -> list[dict[str, Any]]:
    """One row per member for `confluence corpus show`: name, role, and (when its store is complete) tables,
    rows, tasks and link tasks, read from the store's metadata."""
    from confluence.store import Store

    rows = []
    for m in corpus.members:
        row: dict[str, Any] = {"member": m.name, "role": m.role, "tables": None, "rows": None, "tasks": None,
                               "link_tasks": None}
        if m.complete:
            store = Store.open(m.store)
            row.update(tables=len(store.tables), rows=store.num_rows, tasks=len(store.tasks),
                       link_tasks=len(store.link_tasks))
        rows.append(row)
    return rows
