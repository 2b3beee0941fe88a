"""A sentence-transformers model directory as the frozen text encoder (optional; needs torch).

`sentence_transformers` is imported only when such an encoder is created, and only local directories are
accepted (the HF hub is forced offline and `local_files_only` is set), so nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from confluence.errors import ConfluenceError
from confluence.textenc.default import MAX_CHARS, check_texts

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "tokenizer.json", "config.json", "modules.json")


def _fingerprint_hash(path: Path) -> str:
    h = hashlib.sha256()
    for name in _WEIGHT_FILES:
        f = path / name
        if f.is_file():
            h.update(name.encode() + b"\0")
            with f.open("rb") as fh:
                for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


class SentenceTransformerEncoder:
    """Wraps `sentence_transformers.SentenceTransformer(model_dir)` (CPU unless `device` is given).

    Implements `confluence.textenc.TextEncoder`. The fingerprint hashes the directory's weights, tokenizer and
    configs; strings are cut to MAX_CHARS characters, then to the model's own `max_seq_length` tokens.
    """

    def __init__(self, model_dir: str | os.PathLike[str], *, device: str = "cpu"):
        path = Path(model_dir)
        if not path.is_dir():
            raise ConfluenceError(f"sentence-transformers model directory {str(path)!r} does not exist (only "
                                  "local directories are accepted; nothing is downloaded)")
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise ConfluenceError(f"{str(path)!r} is not a sentence-transformers model directory "
                                  "(no modules.json or config.json)")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ConfluenceError(
                "the text encoder 'sentence-transformers:DIR' needs the sentence-transformers package (and torch),"
                " which is not installed; install the optional extra: pip install 'confluence[distill]'"
            ) from exc
        try:
            self._model = SentenceTransformer(str(path), device=device, local_files_only=True)
        except Exception as exc:  # foreign or corrupt files: name the directory
            raise ConfluenceError(f"cannot load sentence-transformers model from {str(path)!r}: {exc}") from exc
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        dim = get_dim()
        if not dim:
            raise ConfluenceError(f"sentence-transformers model {str(path)!r} does not report its output size")
        self._dim = int(dim)
        self._path = path
        self._fingerprint = f"sentence-transformers:{path.resolve().name}:{_fingerprint_hash(path)}"

    @property
    def dim(self) -> int:
        """Output size of the model."""
        return self._dim

    @property
    def fingerprint(self) -> str:
        """`sentence-transformers:<directory name>:<sha256 of weights, tokenizer and configs>`."""
        return self._fingerprint

    def encode(self, texts: Sequence[str], batch_size: int = 4096) -> np.ndarray:
        """Embed `texts` into float32 [len(texts), dim] (the model's own pooling / normalisation)."""
        items = [t[:MAX_CHARS] for t in check_texts(texts)]
        if not items:
            return np.zeros((0, self._dim), np.float32)
        out = self._model.encode(items, batch_size=min(int(batch_size), 256), convert_to_numpy=True,
                                 show_progress_bar=False)
        return np.ascontiguousarray(out, dtype=np.float32)
