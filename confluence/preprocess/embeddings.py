"""The three embedding tables: column names, categories (one sorted block per column / target), text cells.

Every string goes through the frozen text encoder once; with a cache (`confluence.textenc.cache`) strings
embedded by an earlier run are not embedded again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from confluence.textenc.base import TextEncoder
from confluence.textenc.cache import encode_cached

EMBED_BATCH = 8192


class TextInterner:
    """Assigns each distinct string a dense index in first-seen order (deterministic for a fixed row order)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.texts: list[str] = []

    def __len__(self) -> int:
        return len(self.texts)

    def intern(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Global text indices (u32, 0 where null) and validity of one batch of a text column."""
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            arr = pc.cast(arr, pa.string())
        enc = arr.dictionary_encode()  # batch-local uniques in first-seen order
        uniques = enc.dictionary.to_pylist()
        mapping = np.empty(len(uniques), dtype=np.uint32)
        index, texts = self.index, self.texts
        for j, s in enumerate(uniques):
            i = index.get(s)
            if i is None:
                i = index[s] = len(texts)
                texts.append(s)
            mapping[j] = i
        valid = np.asarray(enc.indices.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        local = np.asarray(enc.indices.fill_null(0).to_numpy(), dtype=np.int64)
        out = mapping[local] if len(mapping) else np.zeros(len(arr), dtype=np.uint32)
        return np.where(valid, out, 0).astype(np.uint32), valid


def embed_into(
    encoder: TextEncoder,
    texts: Sequence[str],
    out: np.ndarray,
    *,
    cache: Any = None,
    on_progress: Callable[[int], None] | None = None,
) -> None:
    """Embed `texts` in large batches into the f16 array `out` ([len(texts), dim])."""
    if len(texts) != len(out):
        raise ValueError(f"{len(texts)} texts for an output of {len(out)} rows")
    encode = _encode_fn(encoder, cache)
    for start in range(0, len(texts), EMBED_BATCH):
        chunk = list(texts[start:start + EMBED_BATCH])
        vecs = np.asarray(encode(chunk), dtype=np.float32)
        if vecs.shape != (len(chunk), encoder.dim):
            raise ValueError(f"text encoder returned shape {vecs.shape}, expected {(len(chunk), encoder.dim)}")
        out[start:start + len(chunk)] = vecs.astype(np.float16)
        if on_progress is not None:
            on_progress(len(chunk))


def _encode_fn(encoder: TextEncoder, cache: Any) -> Callable[[list[str]], np.ndarray]:
    if cache is None:
        return lambda chunk: encoder.encode(chunk)
    return lambda chunk: encode_cached(encoder, chunk, cache, progress=False)


def column_text(column: str, table: str, description: str | None) -> str:
    """Column-name text: "<column> of <table>" plus ": <description>"."""
    base = f"{column} of {table}"
    return f"{base}: {description}" if description else base


def category_text(column: str, value: str) -> str:
    """Category text: "<column> is <value>"."""
    return f"{column} is {value}"


def encoder_info(encoder: TextEncoder) -> dict[str, Any]:
    """What the store records about the encoder."""
    fingerprint = str(encoder.fingerprint)
    kind = getattr(encoder, "kind", None) or (fingerprint.split(":", 1)[0] if ":" in fingerprint else None)
    kind = kind or type(encoder).__name__
    return {"kind": str(kind), "fingerprint": fingerprint, "dim": int(encoder.dim)}
