"""Frozen text encoders used by preprocessing (column names, category strings, text cells).

`load_encoder(spec)` picks one (default: the static model2vec model shipped in `confluence/data/text_encoder/`);
`encode_cached(encoder, texts, EmbeddingCache(dir))` embeds only the strings not embedded on an earlier run.
"""

from confluence.textenc.base import TextEncoder
from confluence.textenc.cache import EmbeddingCache, encode_cached
from confluence.textenc.default import StaticEncoder
from confluence.textenc.registry import encoder_metadata, load_encoder

__all__ = ["EmbeddingCache", "StaticEncoder", "TextEncoder", "encode_cached", "encoder_metadata", "load_encoder"]
