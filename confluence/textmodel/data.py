"""Corpus -> tokenizer -> fixed-length `.npy` shards, the memory-mapped dataset, and shuffled batching.

On-disk layout of a prepared data directory::

    DIR/tokenizer.json       the subword tokenizer (HF `tokenizers`; byte-level BPE trained here, or given)
    DIR/meta.json            vocab_size, max_seq_len, special ids, counts, shard list, corpus description
    DIR/shard_00000.npy      int32 [num_samples, max_seq_len]; each row: up to max_seq_len-1 tokens, EOS, PAD...
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from confluence import outputs
from confluence.errors import ConfluenceError, DataError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]", "[MASK]")
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class TokenDataMeta:
    """Metadata of a prepared token data directory."""

    vocab_size: int
    max_seq_len: int
    pad_id: int
    eos_id: int
    mask_id: int
    bos_id: int
    num_samples: int
    num_documents: int
    num_tokens: int
    shards: tuple[str, ...]
    corpus: str

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["shards"] = list(self.shards)
        return d


# ---------------------------------------------------------------------------------------------- corpus reading


def iter_corpus(corpus: str | Path, column: str | None = None, source: str | Path | None = None) -> Iterator[str]:
    """Yield the documents of a corpus, in a deterministic order.

    `corpus` is a text file (one document per blank-line separated paragraph), a directory of text files (searched
    recursively, sorted), a Parquet file (`column` names the text column), or a processed relational store (a
    directory with `metadata.json`): its column-name texts and category strings, and, since a store keeps only
    the embeddings of text cells, the distinct text-cell values read from the raw database `source` when given.
    """
    path = Path(corpus)
    if not path.exists():
        raise DataError(f"corpus {path}: no such file or directory")
    if path.is_dir() and (path / "metadata.json").is_file():
        yield from _iter_store_texts(path)
        if source is not None:
            yield from _iter_source_texts(path, Path(source))
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise DataError(f"corpus {path}: directory holds no text files ({', '.join(TEXT_SUFFIXES)})")
        for f in files:
            yield from _iter_paragraphs(f)
    elif path.suffix.lower() == ".parquet":
        yield from _iter_parquet(path, column)
    else:
        yield from _iter_paragraphs(path)


def _iter_paragraphs(path: Path) -> Iterator[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise DataError(f"corpus file {path}: cannot read ({exc.strerror or exc})") from None
    for para in text.split("\n\n"):
        para = " ".join(para.split())
        if para:
            yield para


def _iter_parquet(path: Path, column: str | None) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"corpus {path}: not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    if column is None:
        raise DataError(f"corpus {path}: a Parquet corpus needs --column; columns are {names}")
    if column not in names:
        raise DataError(f"corpus {path}: no column {column!r}; columns are {names}")
    ftype = pf.schema_arrow.field(column).type
    if not (pa.types.is_string(ftype) or pa.types.is_large_string(ftype)):
        raise DataError(f"corpus {path}: column {column!r} has type {ftype}, expected a string column")
    for batch in pf.iter_batches(columns=[column], batch_size=8192):
        for value in batch.column(0).to_pylist():
            if value is not None and value.strip():
                yield value


def _iter_store_texts(path: Path) -> Iterator[str]:
    """Text values a processed store keeps as strings: column-name texts, then categories as "<column> is <value>"."""
    try:
        meta = json.loads((path / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"store {path}: cannot read metadata.json ({exc})") from None
    columns = meta.get("columns")
    if not isinstance(columns, list):
        raise DataError(f"store {path}: metadata.json has no 'columns' list; is this a processed store?")
    for col in columns:
        text = col.get("text")
        if text:
            yield text
    for table in meta.get("tables", []):
        for col in table.get("columns", []):
            cats = (col.get("stats") or {}).get("categories")
            if isinstance(cats, list):
                for value in cats:
                    yield f"{col.get('name')} is {value}"
    for task in meta.get("tasks", []):
        cats = (task.get("stats") or {}).get("categories")
        if isinstance(cats, list):
            for value in cats:
                yield f"{task.get('name')} is {value}"


def _iter_source_texts(store: Path, source: Path) -> Iterator[str]:
    """Distinct non-null values of every text-stype column of the store's database, read from its raw source."""
    from confluence.sources import open_source, quote_ident

    meta = json.loads((store / "metadata.json").read_text(encoding="utf-8"))
    text_cols = [(t["name"], c["name"]) for t in meta.get("tables", []) for c in t.get("columns", [])
                 if c.get("stype") == "text"]
    with open_source(source) as raw:
        for table, col in text_cols:
            try:
                rows = raw.fetchall(
                    f"SELECT DISTINCT CAST({quote_ident(col)} AS VARCHAR) AS v FROM {quote_ident(table)} "
                    f"WHERE {quote_ident(col)} IS NOT NULL ORDER BY v"
                )
            except Exception as exc:  # duckdb raises many error types
                raise DataError(f"source {source}: cannot read text column {table}.{col} ({exc})") from None
            for (value,) in rows:
                if value.strip():
                    yield value


# ---------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(documents: Iterable[str], vocab_size: int) -> Any:
    """Train a byte-level BPE tokenizer (no unknown tokens) with the special tokens at ids 0..4."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer=trainer)
    return tok


def load_tokenizer(path: str | Path) -> Any:
    """Load a `tokenizers` JSON file, checking it defines every special token."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise ConfluenceError(f"tokenizer {path}: cannot load ({exc})") from None
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise ConfluenceError(f"tokenizer {path}: lacks special tokens {missing} (needs {list(SPECIAL_TOKENS)})")
    return tok


def special_ids(tok: Any) -> dict[str, int]:
    """pad/unk/bos/eos/mask ids of a tokenizer."""
    return {name: tok.token_to_id(t) for name, t in zip(("pad", "unk", "bos", "eos", "mask"), SPECIAL_TOKENS, strict=True)}


def encode_rows(tok: Any, texts: list[str], max_seq_len: int) -> list[np.ndarray]:
    """Token rows for `texts`: each text split into chunks of max_seq_len-1 tokens, each chunk + EOS, padded."""
    ids = special_ids(tok)
    rows: list[np.ndarray] = []
    body = max_seq_len - 1
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        toks = enc.ids
        for start in range(0, max(len(toks), 1), body):
            chunk = toks[start : start + body]
            if not chunk:
                continue
            row = np.full(max_seq_len, ids["pad"], dtype=np.int32)
            row[: len(chunk)] = chunk
            row[len(chunk)] = ids["eos"]
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- prepare


def prepare_corpus(
    corpus: str | Path,
    out: str | Path,
    *,
    max_seq_len: int = 64,
    vocab_size: int = 4096,
    tokenizer: str | Path | None = None,
    column: str | None = None,
    source: str | Path | None = None,
    shard_size: int = 65536,
    min_tokens: int = 4,
) -> TokenDataMeta:
    """Tokenize `corpus` into fixed-length shards under `out` (written atomically). Returns the metadata.

    Texts shorter than `min_tokens` tokens are dropped (they make degenerate views).
    """
    if max_seq_len < 8:
        raise ConfluenceError(f"max_seq_len must be at least 8, got {max_seq_len}")
    out = Path(out)
    if out.exists():
        raise ConfluenceError(f"output {out} already exists; remove it or choose another --out")
    docs = list(iter_corpus(corpus, column, source))
    if not docs:
        raise DataError(f"corpus {corpus}: no non-empty text found")
    lock = outputs.OutputLock(out, "prepared").acquire()
    tmp = outputs.temp_dir(out, "text-corpus")
    try:
        if tokenizer is None:
            tok = train_tokenizer(docs, vocab_size)
        else:
            tok = load_tokenizer(tokenizer)
        tok.save(str(tmp / TOKENIZER_FILE))
        ids = special_ids(tok)
        rows: list[np.ndarray] = []
        n_tokens = 0
        for i in range(0, len(docs), 4096):
            for row in encode_rows(tok, docs[i : i + 4096], max_seq_len):
                n = int(np.argmax(row == ids["eos"]))
                if n >= min_tokens:
                    rows.append(row)
                    n_tokens += n
        if not rows:
            raise DataError(f"corpus {corpus}: no text has at least {min_tokens} tokens")
        data = np.stack(rows)
        shards = []
        for s, start in enumerate(range(0, len(data), shard_size)):
            name = f"shard_{s:05d}.npy"
            np.save(tmp / name, data[start : start + shard_size])
            shards.append(name)
        meta = TokenDataMeta(
            vocab_size=tok.get_vocab_size(),
            max_seq_len=max_seq_len,
            pad_id=ids["pad"],
            eos_id=ids["eos"],
            mask_id=ids["mask"],
            bos_id=ids["bos"],
            num_samples=len(data),
            num_documents=len(docs),
            num_tokens=n_tokens,
            shards=tuple(shards),
            corpus=str(corpus),
        )
        (tmp / META_FILE).write_text(json.dumps(meta.to_json(), indent=2), encoding="utf-8")
        outputs.replace_dir(tmp, out, "text-corpus")
    except OSError as exc:
        raise outputs.write_failure(exc, out, "the prepared text corpus") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        lock.release()
    return meta


def read_meta(data_dir: str | Path) -> TokenDataMeta:
    """Read and check `meta.json` of a prepared data directory."""
    path = Path(data_dir) / META_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        raw["shards"] = tuple(raw["shards"])
        return TokenDataMeta(**raw)
    except FileNotFoundError:
        raise ConfluenceError(f"{data_dir}: no {META_FILE}; run `confluence text prepare` first") from None
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise ConfluenceError(f"{path}: malformed token-data metadata ({exc})") from None


def data_fingerprint(data_dir: str | Path) -> str:
    """sha256 of meta.json (identifies the data a run was trained on)."""
    return hashlib.sha256((Path(data_dir) / META_FILE).read_bytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- dataset + batches


class MMapTokenDataset:
    """Random access to the rows of a prepared data directory; shards are memory-mapped, never loaded whole."""

    def __init__(self, data_dir: str | Path):
        self.dir = Path(data_dir)
        self.meta = read_meta(self.dir)
        self._shards: list[np.ndarray] = []
        for name in self.meta.shards:
            try:
                arr = np.load(self.dir / name, mmap_mode="r")
            except (OSError, ValueError) as exc:
                raise ConfluenceError(f"{self.dir / name}: unreadable shard ({exc})") from None
            if arr.ndim != 2 or arr.shape[1] != self.meta.max_seq_len:
                raise ConfluenceError(
                    f"{self.dir / name}: shape {arr.shape}, expected (n, {self.meta.max_seq_len})"
                )
            self._shards.append(arr)
        self._offsets = np.cumsum([0] + [len(a) for a in self._shards])
        if self._offsets[-1] != self.meta.num_samples:
            raise ConfluenceError(
                f"{self.dir}: shards hold {self._offsets[-1]} rows, meta.json says {self.meta.num_samples}"
            )

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getitem__(self, idx: int) -> np.ndarray:
        if not 0 <= idx < len(self):
            raise IndexError(f"row {idx} out of range [0, {len(self)})")
        s = int(np.searchsorted(self._offsets, idx, side="right") - 1)
        return np.asarray(self._shards[s][idx - self._offsets[s]])

    def rows(self, idxs: np.ndarray) -> np.ndarray:
        """Rows at `idxs` stacked into int32 [len(idxs), max_seq_len]."""
        return np.stack([self[int(i)] for i in idxs]) if len(idxs) else np.zeros((0, self.meta.max_seq_len), np.int32)


def iter_text_batches(
    dataset: MMapTokenDataset,
    batch_size: int,
    *,
    seed: int = 0,
    buffer_size: int = 4096,
    start_batch: int = 0,
    drop_last: bool = True,
) -> Iterator[np.ndarray]:
    """One epoch of int32 [batch_size, max_seq_len] batches through a bounded streaming shuffle buffer.

    Rows stream in order of a seeded shard permutation; a buffer of `buffer_size` rows is kept and each output row
    is drawn uniformly from it. Deterministic for a seed; `start_batch` skips that many batches (resumption).
    """
    if batch_size <= 0:
        raise ConfluenceError(f"batch_size must be positive, got {batch_size}")
    rng = np.random.default_rng(seed)
    shard_order = rng.permutation(len(dataset._shards))
    stream = (
        int(dataset._offsets[s]) + i for s in shard_order for i in range(len(dataset._shards[s]))
    )
    buf: list[int] = []
    out: list[int] = []
    produced = 0

    def emit() -> Iterator[np.ndarray]:
        nonlocal produced, out
        if produced >= start_batch:
            yield dataset.rows(np.asarray(out))
        produced += 1
        out = []

    for idx in stream:
        buf.append(idx)
        if len(buf) >= buffer_size:
            j = int(rng.integers(len(buf)))
            buf[j], buf[-1] = buf[-1], buf[j]
            out.append(buf.pop())
            if len(out) == batch_size:
                yield from emit()
    while buf:
        j = int(rng.integers(len(buf)))
        buf[j], buf[-1] = buf[-1], buf[j]
        out.append(buf.pop())
        if len(out) == batch_size:
            yield from emit()
    if out and not drop_last:
        yield from emit()


def num_batches(dataset: MMapTokenDataset, batch_size: int, drop_last: bool = True) -> int:
    """Number of batches one epoch of `iter_text_batches` yields."""
    n = len(dataset)
    return n // batch_size if drop_last else -(-n // batch_size)


def split_for_devices(batch: np.ndarray, num_devices: int) -> np.ndarray:
    """[B, ...] -> [num_devices, B / num_devices, ...] (per-device slices); B must divide evenly."""
    if batch.shape[0] % num_devices:
        raise ConfluenceError(f"batch size {batch.shape[0]} is not divisible by {num_devices} devices")
    return batch.reshape(num_devices, batch.shape[0] // num_devices, *batch.shape[1:])


def strip_eos(tokens: np.ndarray, eos_id: int, pad_id: int) -> np.ndarray:
    """Replace EOS ids with the padding id (the model never attends to EOS)."""
    return np.where(tokens == eos_id, pad_id, tokens).astype(np.int32)
