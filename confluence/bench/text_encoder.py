"""Text-embedding throughput benchmark (`confluence bench text-encoder`).

Measures strings/s of the shipped static encoder on short category-like strings ("<column> is <value>", 3-8
words, all distinct) with 1 and 2 threads, model2vec's own `StaticModel.encode` for comparison, and
`encode_cached` cold (everything misses: embed + append to a fresh cache) and warm (everything hits, through a
freshly opened cache, so loading and verifying the file is included).
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np

GOAL_STRINGS_PER_S = 50_000

_COLUMNS = ["carrier", "origin", "dest", "status", "country", "color", "category", "tail number", "plan type",
            "payment method", "device", "weather", "manufacturer", "engine", "customer segment", "region"]


def short_strings(n: int, seed: int = 0) -> list[str]:
    """`n` distinct deterministic strings of 3-8 words: "<column> is <value words>" over real English words
    (whole-word tokens of the shipped tokenizer's vocabulary)."""
    from tokenizers import Tokenizer

    from confluence.textenc.default import default_model_dir

    vocab = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json")).get_vocab()
    words = sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) >= 3)
    rng = np.random.default_rng(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        col = _COLUMNS[int(rng.integers(len(_COLUMNS)))]
        n_words = int(rng.integers(3, 9)) - 1 - len(col.split())  # total 3..8 words
        value = " ".join(words[int(i)] for i in rng.integers(0, len(words), max(1, n_words)))
        s = f"{col} is {value}"
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def _rate(fn: Callable[[], object], n: int, repeats: int) -> dict[str, float]:
    """Strings/s over wall-clock time (best and median of `repeats`), and per CPU-second of this process (all
    threads; the figure that a machine shared with other jobs distorts least)."""
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"best": n / min(times), "median": n / statistics.median(times), "per_cpu_s": n / min(cpu)}


def bench_text_encoder(n: int = 200_000, repeats: int = 3, threads: tuple[int, ...] = (1, 2),
        log: Callable[[str], None] | None = None) -> dict:
    """Run the benchmark and return its figures (strings/s) as a JSON-able dict."""
    from model2vec import StaticModel

    from confluence.textenc.cache import EmbeddingCache, encode_cached
    from confluence.textenc.default import StaticEncoder, default_model_dir

    say = log or (lambda _msg: None)
    texts = short_strings(n)
    words = [len(t.split()) for t in texts]
    result: dict = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
                   f"{platform.python_version()}",
        "n_strings": n, "repeats": repeats, "words_min": min(words), "words_max": max(words),
        "mean_chars": float(np.mean([len(t) for t in texts])), "goal_strings_per_s": GOAL_STRINGS_PER_S,
        "loadavg_1min_start": os.getloadavg()[0],
    }
    t0 = time.perf_counter()
    encoders = {k: StaticEncoder(num_threads=k) for k in threads}
    result["load_s"] = (time.perf_counter() - t0) / len(threads)
    for k, enc in encoders.items():
        enc.encode(texts[:2000])  # warm-up
        result[f"static_{k}_threads"] = _rate(lambda enc=enc: enc.encode(texts), n, repeats)
        say(f"StaticEncoder, {k} thread(s): {result[f'static_{k}_threads']['best']:,.0f} strings/s")
    ref = StaticModel.from_pretrained(default_model_dir())
    result["model2vec_encode_1_thread"] = _rate(
        lambda: ref.encode(texts, use_multiprocessing=False, batch_size=4096), n, repeats)
    say(f"model2vec StaticModel.encode: {result['model2vec_encode_1_thread']['best']:,.0f} strings/s")
    enc = encoders[max(threads)]
    with tempfile.TemporaryDirectory(prefix="confluence-bench-cache-") as tmp:
        result["cached_cold"] = _rate(lambda: encode_cached(enc, texts, EmbeddingCache(tmp), progress=False), n, 1)
        say(f"encode_cached cold (embed + write): {result['cached_cold']['best']:,.0f} strings/s")
        result["cached_warm"] = _rate(lambda: encode_cached(enc, texts, EmbeddingCache(tmp), progress=False),
                                      n, repeats)
        say(f"encode_cached warm (open + all hits): {result['cached_warm']['best']:,.0f} strings/s")
        result["cache_file_bytes"] = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
    result["threads_used_for_cache"] = max(threads)
    result["loadavg_1min_end"] = os.getloadavg()[0]
    result["meets_goal"] = result[f"static_{max(threads)}_threads"]["best"] >= GOAL_STRINGS_PER_S
    return result
