"""Choose the frozen text encoder from a spec string (the `--text-encoder` option of preprocessing).

Specs: `None` or `"default"` (the shipped static model), `"model2vec:DIR"`, `"sentence-transformers:DIR"`,
`"lejepa:CHECKPOINT_DIR"` (a trained LeJEPA text model, `confluence.textmodel.encoder.load_lejepa_encoder`).
"""

from __future__ import annotations

import functools
from pathlib import Path

from confluence.errors import ConfluenceError
from confluence.textenc.base import TextEncoder

SPEC_FORMS = ("default", "model2vec:DIR", "sentence-transformers:DIR", "lejepa:CHECKPOINT_DIR")


def _bad(spec: str, why: str) -> ConfluenceError:
    return ConfluenceError(f"text encoder spec {spec!r}: {why}; valid forms: {', '.join(SPEC_FORMS)}")


@functools.lru_cache(maxsize=1)
def _default() -> TextEncoder:
    from confluence.textenc.default import StaticEncoder

    return StaticEncoder()


def load_encoder(spec: str | None = None) -> TextEncoder:
    """The text encoder named by `spec` (see the module doc). The default one is loaded once per process."""
    if spec is None or spec.strip() == "default":
        return _default()
    kind, sep, arg = spec.partition(":")
    kind = kind.strip()
    if not sep:
        raise _bad(spec, "unknown form")
    if not arg.strip():
        raise _bad(spec, f"'{kind}:' needs a directory after the colon")
    path = Path(arg.strip()).expanduser()
    if kind == "model2vec":
        from confluence.textenc.default import StaticEncoder

        return StaticEncoder(path)
    if kind == "sentence-transformers":
        from confluence.textenc.sentence_transformers import SentenceTransformerEncoder

        return SentenceTransformerEncoder(path)
    if kind == "lejepa":
        return _load_lejepa(spec, path)
    raise _bad(spec, f"unknown kind {kind!r}")


def encoder_metadata(encoder: TextEncoder) -> dict[str, str | int]:
    """What a processed store records about its text encoder (`metadata.json` `text_encoder`):
    `{"kind", "fingerprint", "dim"}`; `kind` is the fingerprint's prefix (model2vec, sentence-transformers, ...)."""
    fingerprint = str(encoder.fingerprint)
    return {"kind": fingerprint.split(":", 1)[0], "fingerprint": fingerprint, "dim": int(encoder.dim)}


def _load_lejepa(spec: str, path: Path) -> TextEncoder:
    """A trained LeJEPA text checkpoint (seed 003). The one arrow between the two packages points this way:
    `textenc` loads the text model's encoder; `textmodel` never imports `textenc`."""
    from confluence.textmodel.encoder import load_lejepa_encoder

    encoder = load_lejepa_encoder(path)
    if not isinstance(encoder, TextEncoder):
        raise ConfluenceError(f"text encoder spec {spec!r}: load_lejepa_encoder returned {type(encoder).__name__},"
                              " which does not implement TextEncoder (dim, fingerprint, encode)")
    return encoder
