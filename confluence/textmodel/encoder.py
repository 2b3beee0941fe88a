"""A trained LeJEPA text checkpoint as the frozen `TextEncoder` of preprocessing.

`load_lejepa_encoder(path)` accepts a run directory (its newest checkpoint is used) or one checkpoint directory
inside it. Texts are tokenized with the run's tokenizer, truncated to max_seq_len - 1 tokens (EOS is padding
during training, so none is appended), padded to a bucketed length (powers of two up to max_seq_len, one jit
compilation per bucket) and embedded as the post-final-norm representation at the last valid position: the pooled
embedding the LeJEPA losses train, so D_t = d_model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from confluence.errors import ConfluenceError
from confluence.textmodel.data import TOKENIZER_FILE, load_tokenizer, special_ids
from confluence.textmodel.model import TextTransformer
from confluence.textmodel.train import load_params, load_run_config
from confluence.toolkit.checkpoint import META_FILE, STATE_FILE, latest_checkpoint


def _resolve(path: str | Path) -> Path:
    """The checkpoint directory of a run (its newest) or a checkpoint path."""
    p = Path(path)
    if (p / STATE_FILE).is_file() and (p / META_FILE).is_file():
        return p
    if (p / "config.json").is_file():
        ckpt = latest_checkpoint(p)
        if ckpt is None:
            raise ConfluenceError(f"text model run {p}: has no checkpoint yet")
        return ckpt
    raise ConfluenceError(f"{p}: neither a text-model run directory (config.json) nor a checkpoint ({STATE_FILE})")


class LejepaTextEncoder:
    """Frozen text encoder backed by a trained `TextTransformer` (implements confluence.textenc.TextEncoder)."""

    def __init__(self, path: str | Path, untrained: bool = False):
        """`untrained` keeps the run's architecture and tokenizer but a fresh random initialization (a baseline)."""
        ckpt = _resolve(path)
        self.checkpoint = ckpt  # self-contained: its meta.json holds the configuration, beside the tokenizer
        self.cfg = load_run_config(ckpt)
        self._tok = load_tokenizer(ckpt / TOKENIZER_FILE)
        self._ids = special_ids(self._tok)
        if untrained:
            template = TextTransformer(self.cfg.model, jax.random.PRNGKey(self.cfg.seed))
            params, static = eqx.partition(template, eqx.is_array)
        else:
            params, static = load_params(ckpt, self.cfg)
        self._params = params
        self._static = static
        h = hashlib.sha256()
        h.update((ckpt / STATE_FILE).read_bytes())
        h.update((ckpt / TOKENIZER_FILE).read_bytes())
        self._fingerprint = f"lejepa{'-untrained' if untrained else ''}:{h.hexdigest()[:16]}"
        self._fns: dict[int, Any] = {}

    @property
    def dim(self) -> int:
        return self.cfg.model.d_model

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def max_seq_len(self) -> int:
        return self.cfg.model.max_seq_len

    def _fn(self, length: int) -> Any:
        if length not in self._fns:
            static = self._static

            @jax.jit
            def f(params: Any, tokens: jax.Array) -> jax.Array:
                model = eqx.combine(params, static)
                visible = tokens != self._ids["pad"]
                return model.encode(tokens, visible, None)["pooled"].astype(jnp.float32)

            self._fns[length] = f
        return self._fns[length]

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, truncated to max_seq_len - 1; an empty text becomes one [UNK] token."""
        body = self.max_seq_len - 1
        out = []
        for enc in self._tok.encode_batch(list(texts), add_special_tokens=False):
            ids = enc.ids[:body]
            out.append(ids if ids else [self._ids["unk"]])
        return out

    def _bucket(self, n: int) -> int:
        b = 8
        while b < n:
            b *= 2
        return min(b, self.max_seq_len)

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """float32 [len(texts), dim]: pooled post-final-norm embeddings. Deterministic."""
        if isinstance(texts, str):
            raise ConfluenceError("encode expects a sequence of strings, got a single string")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ConfluenceError(f"encode: item {i} is {type(t).__name__}, expected str")
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        toks = self.tokenize(texts)
        lengths = np.array([len(t) for t in toks])
        order = np.argsort(lengths, kind="stable")  # similar lengths together -> fewer padded positions
        pad = self._ids["pad"]
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            bucket = self._bucket(int(lengths[idx].max()))
            n_rows = batch_size if len(order) > batch_size else len(idx)
            arr = np.full((n_rows, bucket), pad, np.int32)
            for r, i in enumerate(idx):
                arr[r, : lengths[i]] = toks[i]
            arr[len(idx) :, 0] = self._ids["unk"]  # filler rows of a short last batch
            emb = np.asarray(self._fn(bucket)(self._params, jnp.asarray(arr)))
            out[idx] = emb[: len(idx)]
        return out


def load_lejepa_encoder(path: str | Path) -> LejepaTextEncoder:
    """Load a trained LeJEPA text checkpoint (run or checkpoint directory) as a frozen `TextEncoder`."""
    return LejepaTextEncoder(path)
