"""A persistent embedding cache keyed by (encoder fingerprint, exact string), so that unchanged strings are not
embedded again on the next run.

Layout: one append-only file per encoder fingerprint in the cache directory. The file starts with a header (magic,
format version, the fingerprint, dim, dtype, checksummed) followed by segments, one per append:

    segment header (32 bytes): magic b"CSEG", n (u32), dim (u32), pad (u32), payload bytes (u64),
                               blake2b-64 of the preceding 24 bytes (8 bytes)
    payload: n keys (16-byte blake2b of the UTF-8 string) + n vectors (n * dim of the cache dtype)
    trailer: blake2b-128 of the payload (16 bytes)

A segment is written with a single write and fsync under an exclusive `flock`, so a crash leaves at worst a torn
last segment. Opening verifies every checksum: a segment whose payload does not verify is skipped, and at the
first torn or unreadable segment header the rest of the file is ignored (and cut off before the next append).
A file whose header does not verify is discarded. A cache that loads is therefore never corrupt.

Vectors are stored as float16 by default (what preprocessing stores anyway). `encode_cached` rounds freshly
embedded vectors through the cache dtype too, so its result does not depend on which strings were hits.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from confluence.errors import ConfluenceError
from confluence.textenc.base import TextEncoder
from confluence.textenc.default import check_texts

log = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1
_FILE_MAGIC = b"CONFLUENCE-EMBCACHE\n"
_SEG_MAGIC = b"CSEG"
_SEG_HEAD = struct.Struct("<4sIIIQ")  # magic, n, dim, pad, payload bytes  (24 bytes)
_SEG_HEAD_SIZE = _SEG_HEAD.size + 8
_TRAILER = 16
_KEY = 16

ProgressHook = Callable[[int, int], None]
"""Called as hook(done, total) while misses are embedded (counts of distinct strings)."""

RICH_PROGRESS_MIN = 50_000
"""`encode_cached` shows a rich progress bar by default when at least this many distinct strings miss."""


def string_key(text: str) -> bytes:
    """The 16-byte cache key of one string (blake2b-128 of its UTF-8 bytes; surrogates escaped)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=_KEY).digest()


def _h8(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=8).digest()


class _Index:
    """Sorted 128-bit keys -> row into the cache's vector table."""

    def __init__(self) -> None:
        self.hi = np.zeros(0, np.uint64)
        self.lo = np.zeros(0, np.uint64)
        self.row = np.zeros(0, np.int64)

    def add(self, keys: np.ndarray, first_row: int) -> None:
        """Add keys [n, 2] u64 for rows first_row.. ; a key already present keeps its first row."""
        hi = np.concatenate([self.hi, keys[:, 0]])
        lo = np.concatenate([self.lo, keys[:, 1]])
        row = np.concatenate([self.row, np.arange(first_row, first_row + len(keys), dtype=np.int64)])
        order = np.lexsort((row, lo, hi))
        hi, lo, row = hi[order], lo[order], row[order]
        first = np.ones(len(hi), bool)
        first[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
        self.hi, self.lo, self.row = hi[first], lo[first], row[first]

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key [n, 2], or -1."""
        out = np.full(len(keys), -1, np.int64)
        if not len(self.hi) or not len(keys):
            return out
        pos = np.searchsorted(self.hi, keys[:, 0])
        # Equal `hi` values with different `lo` are a 2^-64 event; scan the (tiny) run of equal hi values.
        for shift in range(4):
            p = pos + shift
            ok = p < len(self.hi)
            pc = np.where(ok, p, 0)
            match = ok & (out < 0) & (self.hi[pc] == keys[:, 0]) & (self.lo[pc] == keys[:, 1])
            out[match] = self.row[pc[match]]
            if not (ok & (self.hi[pc] == keys[:, 0])).any():
                break
        return out


class EmbeddingCache:
    """Embeddings of strings on disk, one append-only, self-verifying file per encoder fingerprint.

    `EmbeddingCache(directory)` creates the directory if needed. Use with `encode_cached`, or directly with
    `lookup` / `add`. Safe against crashes (a torn append is ignored on the next open) and against concurrent
    writers (appends are serialised with `flock`; each process reads the others' segments before appending).
    """

    def __init__(self, directory: str | os.PathLike[str], dtype: str = "float16"):
        self.directory = Path(directory)
        if dtype not in ("float16", "float32"):
            raise ConfluenceError(f"embedding cache dtype must be 'float16' or 'float32', got {dtype!r}")
        self.dtype = np.dtype(dtype)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfluenceError(f"cannot create the embedding cache directory {str(self.directory)!r}: {exc}") from exc
        self._tables: dict[str, _Table] = {}

    def path_for(self, fingerprint: str) -> Path:
        """The cache file of one encoder fingerprint."""
        safe = re.sub(r"[^A-Za-z0-9._-]+", "-", fingerprint)[:48].strip("-.")
        digest = hashlib.blake2b(fingerprint.encode(), digest_size=8).hexdigest()
        return self.directory / f"{safe}-{digest}.{self.dtype.name}.emb"

    def table(self, fingerprint: str, dim: int) -> _Table:
        """The (opened, verified) cache table of one encoder."""
        t = self._tables.get(fingerprint)
        if t is None:
            t = _Table(self.path_for(fingerprint), fingerprint, dim, self.dtype)
            self._tables[fingerprint] = t
        elif t.dim != dim:
            raise ConfluenceError(f"encoder {fingerprint!r} reports dim {dim}, its cache holds dim {t.dim}")
        return t

    def lookup(self, fingerprint: str, dim: int, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(vectors float32 [n, dim] with zeros at misses, hit mask [n]) for `texts`."""
        return self.table(fingerprint, dim).lookup(string_keys(texts))

    def add(self, fingerprint: str, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Append the embeddings of `texts` (one durable segment)."""
        self.add_keys(fingerprint, string_keys(texts), vectors)

    def add_keys(self, fingerprint: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Append vectors under precomputed `string_keys` (one durable segment)."""
        vectors = np.asarray(vectors)
        if vectors.ndim != 2 or len(vectors) != len(keys):
            raise ConfluenceError(f"cache add: {len(keys)} keys but vectors of shape {vectors.shape}")
        self.table(fingerprint, vectors.shape[1]).append(keys, vectors)

    def __len__(self) -> int:
        return sum(len(t) for t in self._tables.values())


def string_keys(texts: Sequence[str]) -> np.ndarray:
    """The cache keys of `texts` as uint64 [n, 2] (the 16 bytes of `string_key`, little-endian halves)."""
    raw = b"".join([string_key(t) for t in texts])
    return np.frombuffer(raw, dtype="<u8").reshape(-1, 2).astype(np.uint64)


class _Table:
    """One fingerprint's cache file, loaded and verified."""

    def __init__(self, path: Path, fingerprint: str, dim: int, dtype: np.dtype):
        self.path, self.fingerprint, self.dim, self.dtype = path, fingerprint, int(dim), dtype
        self._header = self._make_header()
        self._index = _Index()
        self._chunks: list[np.ndarray] = []
        self._rows = 0
        self._vectors: np.ndarray | None = np.zeros((0, self.dim), self.dtype)
        self._end = 0  # bytes of the file read and verified so far (header included)
        self._tail_bad = False
        with self._locked() as fd:
            self._sync(fd)

    def __len__(self) -> int:
        return self._rows

    def _make_header(self) -> bytes:
        meta = json.dumps({"version": CACHE_FORMAT_VERSION, "fingerprint": self.fingerprint, "dim": self.dim,
                           "dtype": self.dtype.name}, sort_keys=True).encode()
        body = _FILE_MAGIC + struct.pack("<I", len(meta)) + meta
        return body + _h8(body)

    def _locked(self) -> _Lock:
        return _Lock(self.path)

    def _sync(self, fd: int) -> None:
        """Read and verify whatever lies beyond `_end` (other writers' segments, or the whole file)."""
        size = os.fstat(fd).st_size
        if size < self._end:  # someone discarded the file since we read it; start it afresh
            self._end = 0
        if self._end == 0:
            if size == 0:
                return
            head = os.pread(fd, len(self._header), 0)
            if head != self._header:
                if not head.startswith(_FILE_MAGIC) or size < len(self._header):
                    log.warning("embedding cache %s has a bad header; discarding it", self.path)
                else:
                    log.warning("embedding cache %s belongs to another encoder/format; discarding it", self.path)
                os.ftruncate(fd, 0)
                return
            self._end = len(self._header)
        pos = self._end
        self._tail_bad = False
        new_keys: list[np.ndarray] = []
        new_vecs: list[np.ndarray] = []
        while pos < size:
            head = os.pread(fd, _SEG_HEAD_SIZE, pos)
            if len(head) < _SEG_HEAD_SIZE or _h8(head[:_SEG_HEAD.size]) != head[_SEG_HEAD.size:]:
                self._tail_bad = True
                break
            magic, n, dim, _, nbytes = _SEG_HEAD.unpack(head[:_SEG_HEAD.size])
            if magic != _SEG_MAGIC or dim != self.dim or nbytes != n * (_KEY + dim * self.dtype.itemsize):
                self._tail_bad = True
                break
            end = pos + _SEG_HEAD_SIZE + nbytes + _TRAILER
            if end > size:
                self._tail_bad = True
                break
            body = os.pread(fd, nbytes + _TRAILER, pos + _SEG_HEAD_SIZE)
            payload, trailer = body[:nbytes], body[nbytes:]
            if hashlib.blake2b(payload, digest_size=_TRAILER).digest() == trailer:
                keys = np.frombuffer(payload, dtype="<u8", count=2 * n).reshape(n, 2).astype(np.uint64)
                vecs = np.frombuffer(payload, dtype=self.dtype, offset=_KEY * n).reshape(n, dim)
                new_keys.append(keys)
                new_vecs.append(vecs)
            else:
                log.warning("embedding cache %s: a segment at byte %d fails its checksum; skipped", self.path, pos)
            pos = end
        self._end = pos
        if new_keys:
            self._add_mem(np.concatenate(new_keys), np.concatenate(new_vecs))

    def _add_mem(self, keys: np.ndarray, vecs: np.ndarray) -> None:
        self._index.add(keys, self._rows)
        self._chunks.append(vecs)
        self._rows += len(vecs)
        self._vectors = None

    def _all(self) -> np.ndarray:
        if self._vectors is None:
            self._vectors = np.concatenate(self._chunks) if self._chunks else np.zeros((0, self.dim), self.dtype)
            self._chunks = [self._vectors]
        return self._vectors

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with self._locked() as fd:
            self._sync(fd)  # pick up segments other processes appended since we opened
        rows = self._index.lookup(keys)
        hit = rows >= 0
        out = np.zeros((len(keys), self.dim), np.float32)
        if hit.any():
            out[hit] = self._all()[rows[hit]]
        return out, hit

    def append(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        if vectors.shape[1] != self.dim:
            raise ConfluenceError(f"cache {self.path}: vectors of dim {vectors.shape[1]}, expected {self.dim}")
        if not len(keys):
            return
        vecs = np.ascontiguousarray(vectors, dtype=self.dtype)
        key_bytes = np.ascontiguousarray(keys, dtype="<u8")
        parts = [memoryview(key_bytes).cast("B"), memoryview(vecs).cast("B")]
        nbytes = sum(len(p) for p in parts)
        head = _SEG_HEAD.pack(_SEG_MAGIC, len(keys), self.dim, 0, nbytes)
        digest = hashlib.blake2b(digest_size=_TRAILER)
        for part in parts:
            digest.update(part)
        segment = [head + _h8(head), *parts, digest.digest()]
        with self._locked() as fd:
            self._sync(fd)
            if self._end == 0:
                os.ftruncate(fd, 0)
                _write_all(fd, self._header, 0)
                self._end = len(self._header)
            elif self._tail_bad:
                os.ftruncate(fd, self._end)  # cut off a torn segment before appending after it
                self._tail_bad = False
            pos = self._end
            for part in segment:
                _write_all(fd, part, pos)
                pos += len(part)
            os.fsync(fd)
            self._end = pos
        self._add_mem(keys, vecs)


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class _Lock:
    """Open the cache file and hold an exclusive flock on it."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = -1

    def __enter__(self) -> int:
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfluenceError(f"cannot open the embedding cache file {str(self.path)!r}: {exc}") from exc
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self.fd

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def encode_cached(
    encoder: TextEncoder,
    texts: Sequence[str],
    cache: EmbeddingCache | None,
    *,
    progress: ProgressHook | bool | None = None,
    chunk_size: int = 65_536,
) -> np.ndarray:
    """Embed `texts` (float32 [n, dim], input order), embedding only the distinct strings the cache misses.

    Misses are embedded in chunks of `chunk_size` distinct strings; each chunk is appended to the cache at once,
    so an interrupted run keeps its progress. `progress`: a hook(done, total) called after each chunk, False for
    none, or None for a rich progress bar on a terminal when at least RICH_PROGRESS_MIN strings miss. With a
    cache, vectors are rounded through the cache dtype whether they were hits or not (same result either way).
    """
    items = check_texts(texts)
    dim = int(encoder.dim)
    unique = list(dict.fromkeys(items))
    inverse = None
    if len(unique) != len(items):
        where = {t: i for i, t in enumerate(unique)}
        inverse = np.fromiter((where[t] for t in items), dtype=np.int64, count=len(items))
    if cache is not None:
        keys = string_keys(unique)
        vectors, hit = cache.table(encoder.fingerprint, dim).lookup(keys)
    else:
        vectors, hit = np.zeros((len(unique), dim), np.float32), np.zeros(len(unique), bool)
    missing = np.flatnonzero(~hit)
    hook, bar = _progress(progress, len(missing))
    try:
        for start in range(0, len(missing), chunk_size):
            idx = missing[start:start + chunk_size]
            batch = [unique[i] for i in idx]
            emb = np.asarray(encoder.encode(batch), dtype=np.float32)
            if emb.shape != (len(batch), dim):
                raise ConfluenceError(f"text encoder {encoder.fingerprint!r} returned shape {emb.shape} for "
                                      f"{len(batch)} texts, expected ({len(batch)}, {dim})")
            if cache is not None:
                stored = emb.astype(cache.dtype)
                cache.add_keys(encoder.fingerprint, keys[idx], stored)
                emb = stored.astype(np.float32)
            vectors[idx] = emb
            if hook is not None:
                hook(min(start + chunk_size, len(missing)), len(missing))
    finally:
        if bar is not None:
            bar.stop()
    return vectors if inverse is None else vectors[inverse]


def _progress(progress: ProgressHook | bool | None, total: int):
    """Resolve the `progress` argument into (hook or None, rich Progress to stop or None)."""
    if callable(progress):
        return progress, None
    if progress is False or (progress is None and total < RICH_PROGRESS_MIN) or total == 0:
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    if progress is None and not console.is_terminal:
        return None, None
    bar = Progress(TextColumn("embedding texts"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   console=console, transient=True)
    task = bar.add_task("embed", total=total)
    bar.start()
    return (lambda done, _total: bar.update(task, completed=done)), bar
