"""The embedding cache: hits and misses, persistence across runs, crash safety, concurrency of two handles."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.textenc.cache import EmbeddingCache, encode_cached
from tests.fixtures.bookstore import HashEncoder


def CountingEncoder(dim: int = 8, fingerprint: str = "fake:v1") -> HashEncoder:
    """The tests' hashing encoder under this file's defaults (8 dims, fingerprint "fake:v1")."""
    return HashEncoder(dim, fingerprint)


def _expected(enc: HashEncoder, texts, dtype=np.float16) -> np.ndarray:
    return CountingEncoder(enc.dim).encode(texts).astype(dtype).astype(np.float32)


def test_misses_embedded_once_and_order_kept(tmp_path):
    enc, cache = CountingEncoder(), EmbeddingCache(tmp_path)
    texts = ["b", "a", "b", "c", "a", ""]
    out = encode_cached(enc, texts, cache)
    assert out.dtype == np.float32 and out.shape == (6, 8)
    assert sorted(enc.seen) == ["", "a", "b", "c"]  # each distinct string once
    np.testing.assert_array_equal(out, _expected(enc, texts))
    out2 = encode_cached(enc, ["c", "d", "a"], cache)
    assert enc.seen[4:] == ["d"]
    np.testing.assert_array_equal(out2, _expected(enc, ["c", "d", "a"]))


def test_next_run_embeds_nothing_unchanged(tmp_path):
    texts = [f"carrier is {i}" for i in range(3000)]
    first = encode_cached(CountingEncoder(), texts, EmbeddingCache(tmp_path), chunk_size=1000)
    enc2 = CountingEncoder()
    second = encode_cached(enc2, texts + ["new one"], EmbeddingCache(tmp_path))
    assert enc2.seen == ["new one"]
    np.testing.assert_array_equal(second[:-1], first)


def test_hit_equals_miss_result(tmp_path):
    texts = ["x", "y", "z"]
    cold = encode_cached(CountingEncoder(), texts, EmbeddingCache(tmp_path))
    warm = encode_cached(CountingEncoder(), texts, EmbeddingCache(tmp_path))
    assert np.array_equal(cold, warm)


def test_keyed_by_fingerprint_and_exact_string(tmp_path):
    cache = EmbeddingCache(tmp_path)
    encode_cached(CountingEncoder(fingerprint="fake:v1"), ["Dog", "dog"], cache)
    other = CountingEncoder(fingerprint="fake:v2")
    encode_cached(other, ["dog", "dog "], cache)
    assert other.seen == ["dog", "dog "]
    assert len(list(tmp_path.glob("*.emb"))) == 2
    with pytest.raises(ConfluenceError, match="dim"):
        encode_cached(CountingEncoder(dim=4, fingerprint="fake:v1"), ["dog"], cache)


def test_float32_cache_is_exact(tmp_path):
    enc = CountingEncoder()
    out = encode_cached(enc, ["a", "b"], EmbeddingCache(tmp_path, dtype="float32"))
    np.testing.assert_array_equal(out, CountingEncoder().encode(["a", "b"]))
    again = encode_cached(CountingEncoder(), ["a", "b"], EmbeddingCache(tmp_path, dtype="float32"))
    np.testing.assert_array_equal(again, out)


def _cache_file(tmp_path):
    (path,) = tmp_path.glob("*.emb")
    return path


def test_truncated_last_segment_is_ignored_and_repaired(tmp_path):
    encode_cached(CountingEncoder(), ["a", "b"], EmbeddingCache(tmp_path))
    encode_cached(CountingEncoder(), ["c", "d"], EmbeddingCache(tmp_path))
    path = _cache_file(tmp_path)
    size = path.stat().st_size
    for cut in (1, 17, 40):  # torn trailer, torn payload, torn segment header
        with path.open("r+b") as f:
            f.truncate(size - cut)
        enc = CountingEncoder()
        out = encode_cached(enc, ["a", "b", "c", "d"], EmbeddingCache(tmp_path))
        assert enc.seen == ["c", "d"], f"cut {cut}: the torn segment must be ignored, the first kept"
        np.testing.assert_array_equal(out, _expected(enc, ["a", "b", "c", "d"]))
        assert path.stat().st_size == size, "the torn tail is cut off before the re-embedded segment is appended"
    enc = CountingEncoder()
    encode_cached(enc, ["a", "b", "c", "d"], EmbeddingCache(tmp_path))
    assert enc.seen == []


def test_corrupt_payload_segment_is_skipped(tmp_path):
    encode_cached(CountingEncoder(), ["a", "b"], EmbeddingCache(tmp_path))
    path = _cache_file(tmp_path)
    first_end = path.stat().st_size
    encode_cached(CountingEncoder(), ["c"], EmbeddingCache(tmp_path))
    data = bytearray(path.read_bytes())
    data[first_end - 20] ^= 0xFF  # a vector byte of the first segment
    path.write_bytes(bytes(data))
    enc = CountingEncoder()
    out = encode_cached(enc, ["a", "b", "c"], EmbeddingCache(tmp_path))
    assert enc.seen == ["a", "b"], "the corrupt segment is skipped, the later good one still used"
    np.testing.assert_array_equal(out, _expected(enc, ["a", "b", "c"]))


def test_bad_header_discards_file(tmp_path):
    encode_cached(CountingEncoder(), ["a"], EmbeddingCache(tmp_path))
    path = _cache_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[3] ^= 0x01
    path.write_bytes(bytes(data))
    enc = CountingEncoder()
    out = encode_cached(enc, ["a"], EmbeddingCache(tmp_path))
    assert enc.seen == ["a"]
    np.testing.assert_array_equal(out, _expected(enc, ["a"]))
    enc = CountingEncoder()
    encode_cached(enc, ["a"], EmbeddingCache(tmp_path))
    assert enc.seen == []


def test_two_handles_see_each_others_appends(tmp_path):
    c1, c2 = EmbeddingCache(tmp_path), EmbeddingCache(tmp_path)
    encode_cached(CountingEncoder(), ["a"], c1)
    encode_cached(CountingEncoder(), ["b"], c2)  # c2 opened before "a" was written
    enc = CountingEncoder()
    encode_cached(enc, ["a", "b"], c1)
    assert enc.seen == []
    enc = CountingEncoder()
    encode_cached(enc, ["a", "b"], c2)
    assert enc.seen == []


def test_progress_hook_and_no_cache(tmp_path):
    calls = []
    enc = CountingEncoder()
    texts = [str(i) for i in range(250)] * 2
    out = encode_cached(enc, texts, None, progress=lambda d, t: calls.append((d, t)), chunk_size=100)
    assert calls == [(100, 250), (200, 250), (250, 250)]
    assert len(enc.seen) == 250
    np.testing.assert_array_equal(out, CountingEncoder().encode(texts))


def test_bad_inputs(tmp_path):
    with pytest.raises(ConfluenceError, match=r"text #2"):
        encode_cached(CountingEncoder(), ["a", "b", 3], EmbeddingCache(tmp_path))
    with pytest.raises(ConfluenceError, match="dtype"):
        EmbeddingCache(tmp_path, dtype="int8")


def test_with_real_encoder_and_unicode(tmp_path):
    from confluence.textenc.default import StaticEncoder

    enc = StaticEncoder()
    texts = ["dog", "東京 tower", "emoji 🙂", "surrogate \ud800 escaped", "dog"]
    cold = encode_cached(enc, texts, EmbeddingCache(tmp_path))
    warm = encode_cached(enc, texts, EmbeddingCache(tmp_path))
    assert np.array_equal(cold, warm)
    np.testing.assert_allclose(cold, enc.encode(texts), atol=1e-3)


def test_rich_progress_bar_runs(tmp_path, capsys):
    out = encode_cached(CountingEncoder(), [str(i) for i in range(300)], EmbeddingCache(tmp_path), progress=True,
                        chunk_size=100)
    assert out.shape == (300, 8)
