"""The default frozen text encoder: a static model2vec model shipped in `confluence/data/text_encoder/`.

A static model maps each token of its vocabulary to one vector; a string's embedding is the mean of its tokens'
vectors (L2-normalised when the model's config says so, as the shipped one does). `StaticEncoder` loads any
model2vec model directory with `model2vec.StaticModel.from_pretrained` (local paths only, the HF hub is forced
offline) and encodes with its own fast path: the Rust tokenizer on chunks of strings in a thread pool (the
tokenizer releases the GIL), and the pooling as one sparse [n, vocab] x [vocab, dim] product per chunk. The
result equals `StaticModel.encode` up to float rounding (model2vec pools in the weights' float16; this pools in
float32).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import itertools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from confluence.errors import ConfluenceError

MAX_CHARS = 2048
"""Strings are cut to their first MAX_CHARS characters before tokenisation (a static model's mean over a very
long text is dominated by its first few hundred tokens' content anyway, and this bounds the cost of a single
huge cell)."""

MAX_TOKENS = 512
"""At most this many tokens of a (truncated) string are pooled, as model2vec's own default `max_length`."""

DEFAULT_NAME = "confluence-minilm-l6-v2-m2v256"
"""Name of the shipped model in its fingerprint."""

_CHUNK = 2048  # strings per tokenizer call / thread task
_MEMO_MAX_WORDS = 1_000_000  # the word memo is cleared when it would grow beyond this


def default_model_dir() -> Path:
    """The directory of the shipped default model (installed with the package as package data)."""
    return Path(str(importlib.resources.files("confluence").joinpath("data", "text_encoder")))


def default_num_threads() -> int:
    """Threads used by `StaticEncoder` unless told otherwise: `CONFLUENCE_TEXTENC_THREADS`, else the CPU count
    (at most 8)."""
    env = os.environ.get("CONFLUENCE_TEXTENC_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ConfluenceError(f"CONFLUENCE_TEXTENC_THREADS must be a positive integer, got {env!r}") from None
        if n < 1:
            raise ConfluenceError(f"CONFLUENCE_TEXTENC_THREADS must be a positive integer, got {env!r}")
        return n
    return max(1, min(os.cpu_count() or 1, 8))


def _sha256_files(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with p.open("rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def check_texts(texts: Sequence[str]) -> list[str]:
    """Return `texts` as a list, raising ConfluenceError naming the first element that is not a string."""
    if isinstance(texts, str):
        raise ConfluenceError("encode() takes a sequence of strings, got a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise ConfluenceError(f"text #{i} to embed is {type(t).__name__} {t!r}, not a string")
    return out


class StaticEncoder:
    """A frozen static (model2vec) text encoder loaded from a local model directory.

    Implements `confluence.textenc.TextEncoder`. `num_threads` threads tokenise and pool chunks of the input in
    parallel (default: `default_num_threads()`). Output is deterministic and independent of `num_threads` and
    `batch_size` (each string is embedded on its own; chunking only groups the work).
    """

    def __init__(self, model_dir: str | os.PathLike[str] | None = None, *, name: str | None = None,
                 num_threads: int | None = None):
        path = Path(model_dir) if model_dir is not None else default_model_dir()
        weights_file, tokenizer_file = path / "model.safetensors", path / "tokenizer.json"
        if not path.is_dir():
            raise ConfluenceError(f"model2vec model directory {str(path)!r} does not exist (only local "
                                  "directories are accepted; nothing is downloaded)")
        for f in (weights_file, tokenizer_file, path / "config.json"):
            if not f.is_file():
                raise ConfluenceError(f"model2vec model directory {str(path)!r} has no {f.name}; expected "
                                      "model2vec's saved format (model.safetensors, tokenizer.json, config.json)")
        # Never touch the network: a local directory is loaded as is, and the hub client is offline anyway.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # Our own threads parallelise; keep the Rust tokenizer from spawning its own pool per call on top.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from model2vec import StaticModel

        try:
            model = StaticModel.from_pretrained(path)  # an existing local path is loaded from disk, never the hub
        except Exception as exc:  # corrupt or foreign files: name the directory
            raise ConfluenceError(f"cannot load model2vec model from {str(path)!r}: {exc}") from exc
        self._path = path
        is_default = model_dir is None or path.resolve() == default_model_dir().resolve()
        self._name = name or (DEFAULT_NAME if is_default else path.resolve().name)
        self._num_threads = num_threads if num_threads is not None else default_num_threads()
        if self._num_threads < 1:
            raise ConfluenceError(f"num_threads must be >= 1, got {self._num_threads}")
        emb = np.asarray(model.embedding)
        self._table = np.ascontiguousarray(emb, dtype=np.float32)  # [vocab rows, dim], pooled in f32
        weights, mapping = getattr(model, "weights", None), getattr(model, "token_mapping", None)
        self._weights = None if weights is None else np.asarray(weights, dtype=np.float32)
        self._mapping = None if mapping is None else np.asarray(mapping, dtype=np.int64)
        self._normalize = bool(model.normalize)
        self._unk = getattr(model, "unk_token_id", None)
        tok = model.tokenizer
        tok.no_padding()
        tok.enable_truncation(MAX_TOKENS)
        self._tokenizer = tok
        # Word -> token ids memo: short strings share words, and a dict lookup per word is ~5x cheaper than the
        # Rust normaliser + pre-tokeniser per string. Only for tokenizers where that gives identical ids.
        self._memo: dict[str, list[int]] | None = {} if _word_memo_ok(tok) else None
        self._fingerprint = f"model2vec:{self._name}:{_sha256_files([weights_file, tokenizer_file])}"

    @property
    def dim(self) -> int:
        """Output size D_t (256 for the shipped model)."""
        return int(self._table.shape[1])

    @property
    def fingerprint(self) -> str:
        """`model2vec:<name>:<sha256 of model.safetensors + tokenizer.json>`."""
        return self._fingerprint

    @property
    def num_threads(self) -> int:
        """Threads used by `encode`."""
        return self._num_threads

    @property
    def model_dir(self) -> Path:
        """The directory the model was loaded from."""
        return self._path

    def __repr__(self) -> str:
        return f"StaticEncoder({str(self._path)!r}, dim={self.dim}, threads={self._num_threads})"

    def encode(self, texts: Sequence[str], batch_size: int = 4096) -> np.ndarray:
        """Embed `texts` into float32 [len(texts), dim]. Strings are cut to MAX_CHARS characters and MAX_TOKENS
        tokens first; a string with no known token (e.g. "") embeds to the zero vector."""
        items = check_texts(texts)
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        if not items:
            return out
        step = max(1, min(int(batch_size), _CHUNK))
        starts = range(0, len(items), step)

        def work(start: int) -> None:
            out[start:start + step] = self._encode_chunk(items[start:start + step])

        if self._num_threads == 1 or len(starts) == 1:
            for s in starts:
                work(s)
        else:
            with ThreadPoolExecutor(max_workers=self._num_threads) as pool:
                list(pool.map(work, starts))
        return out

    def _rust_ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat token ids, offsets [n + 1]) of `texts` through the Rust tokenizer (truncates to MAX_TOKENS)."""
        try:
            encodings = self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        except TypeError:  # lone surrogates (e.g. from undecodable bytes) are not valid UTF-8: replace them
            texts = [t.encode("utf-8", "replace").decode("utf-8") for t in texts]
            encodings = self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        ids = [e.ids for e in encodings]
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)), out=offsets[1:])
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(offsets[-1]))
        return flat, offsets

    def _memo_ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat token ids, offsets [n + 1]) of plain printable-ASCII `texts`, word by word through the memo.

        All strings are split at once (`" ".join(texts).split(" ")`: string i owns `texts[i].count(" ") + 1`
        consecutive pieces), pieces are looked up in the memo, and only unseen pieces go to the tokenizer.
        """
        memo = self._memo
        if memo is None:
            return self._rust_ids(texts)
        words = " ".join(texts).split(" ")
        per_word = list(map(memo.get, words))
        if None in per_word:
            fresh = sorted({w for w, ids in zip(words, per_word, strict=True) if ids is None})
            if len(memo) + len(fresh) > _MEMO_MAX_WORDS:  # start a new memo; never mutate one in use
                memo = self._memo = {}
            encoded = self._tokenizer.encode_batch_fast(fresh, add_special_tokens=False)
            found = {w: e.ids for w, e in zip(fresh, encoded, strict=True)}
            memo.update(found)
            per_word = [ids if ids is not None else found[w] for w, ids in zip(words, per_word, strict=True)]
        word_tokens = np.fromiter(map(len, per_word), dtype=np.int64, count=len(per_word))
        flat = np.fromiter(itertools.chain.from_iterable(per_word), dtype=np.int64, count=int(word_tokens.sum()))
        pieces = np.fromiter((t.count(" ") + 1 for t in texts), dtype=np.int64, count=len(texts))
        first_piece = np.zeros(len(texts), dtype=np.int64)
        np.cumsum(pieces[:-1], out=first_piece[1:])
        tokens = np.add.reduceat(word_tokens, first_piece) if len(texts) else word_tokens[:0]
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(tokens, out=offsets[1:])
        if tokens.size and tokens.max() > MAX_TOKENS:  # keep each string's first MAX_TOKENS tokens
            position = np.arange(len(flat)) - np.repeat(offsets[:-1], tokens)
            flat = flat[position < MAX_TOKENS]
            offsets[1:] = np.cumsum(np.minimum(tokens, MAX_TOKENS))
        return flat, offsets

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each (already truncated) string, as lists (the path `encode` uses, for tests)."""
        out: list[list[int]] = [[] for _ in texts]
        for idx, (flat, offsets) in self._split_ids(texts):
            for j, i in enumerate(idx):
                out[i] = flat[offsets[j]:offsets[j + 1]].tolist()
        return out

    def _split_ids(self, texts: list[str]) -> list[tuple[list[int], tuple[np.ndarray, np.ndarray]]]:
        """[(indices, (flat ids, offsets))] for the memo-path and Rust-path subsets of `texts`."""
        if self._memo is None:
            return [(list(range(len(texts))), self._rust_ids(texts))]
        plain = [t.isascii() and t.isprintable() for t in texts]
        if all(plain):
            return [(list(range(len(texts))), self._memo_ids(texts))]
        fast = [i for i, p in enumerate(plain) if p]
        slow = [i for i, p in enumerate(plain) if not p]
        parts = [(slow, self._rust_ids([texts[i] for i in slow]))]
        if fast:
            parts.append((fast, self._memo_ids([texts[i] for i in fast])))
        return parts

    def _encode_chunk(self, texts: list[str]) -> np.ndarray:
        cut = [t if len(t) <= MAX_CHARS else t[:MAX_CHARS] for t in texts]
        out = np.empty((len(cut), self.dim), dtype=np.float32)
        for idx, (flat, offsets) in self._split_ids(cut):
            out[idx] = self._pool(flat, offsets)
        return out

    def _pool(self, flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Mean (or, for normalising models, L2-normalised sum) of each string's token vectors."""
        import scipy.sparse as sp

        n = len(offsets) - 1
        keep = np.ones(flat.shape, dtype=np.float32) if self._unk is None else (flat != self._unk).astype(np.float32)
        data = keep if self._weights is None else keep * self._weights[flat]
        cols = flat if self._mapping is None else self._mapping[flat]
        pool = sp.csr_matrix((data, cols, offsets), shape=(n, self._table.shape[0]))
        summed = np.asarray(pool @ self._table, dtype=np.float32)
        if self._normalize:
            norm = np.sqrt(np.einsum("ij,ij->i", summed, summed))[:, None]
            summed /= np.maximum(norm, np.float32(1e-12))
            return summed
        rows = np.repeat(np.arange(n), np.diff(offsets))
        counts = np.bincount(rows, weights=keep, minlength=n).astype(np.float32)
        return summed / np.maximum(counts, np.float32(1.0))[:, None]


def _word_memo_ok(tokenizer) -> bool:
    """Whether tokenising a plain ASCII string word by word (split on spaces) gives the same ids as a whole: true
    for BERT-style WordPiece tokenizers (char-local normaliser, whitespace/punctuation pre-tokeniser, no added
    token containing a space); checked on probe strings as well."""
    import json

    cfg = json.loads(tokenizer.to_str())
    if ((cfg.get("normalizer") or {}).get("type") != "BertNormalizer"
            or (cfg.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer"
            or (cfg.get("model") or {}).get("type") != "WordPiece"
            or any(" " in tok.get("content", "") for tok in cfg.get("added_tokens") or [])):
        return False
    probes = ["carrier is UA", "  Hello,  World!! it's  a   [MASK] test-case ", "x" * 150 + " abc", "ATL->JFK (2013)"]
    for p in probes:
        whole = tokenizer.encode(p, add_special_tokens=False).ids
        parts = [i for w in p.split(" ") for i in tokenizer.encode(w, add_special_tokens=False).ids]
        if whole != parts:
            return False
    return True
