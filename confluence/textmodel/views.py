"""Span-masked views (seed 003): BART-style span masking of global and local views, built on the host.

Every view of a sample masks a ratio drawn uniformly from its range (global 25-30 %, local 40-45 % by default) of
the sample's valid (non-pad; EOS is already padding) positions, in spans whose lengths are Poisson(λ) (at least 1).
Spans are placed with at least one visible token between two spans, so each masked run is exactly one sampled
span (when a sequence is too fragmented to place a span that way, the gap rule is relaxed and two spans may merge
into one run). At least one valid token stays visible. The sample view is the unmasked sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from confluence.errors import ConfigError, ConfluenceError


@dataclass(frozen=True)
class ViewConfig:
    """How many views of each kind and their mask-ratio ranges."""

    num_global: int = 2
    num_local: int = 6
    global_ratio: tuple[float, float] = (0.25, 0.30)
    local_ratio: tuple[float, float] = (0.40, 0.45)
    span_lambda: float = 3.0
    max_decoder_span: int = 16

    @property
    def num_views(self) -> int:
        return self.num_global + self.num_local

    def __post_init__(self) -> None:
        if self.num_global < 1:
            raise ConfigError("num_global", f"must be at least 1 (the global center), got {self.num_global}")
        if self.num_local < 0:
            raise ConfigError("num_local", f"must be >= 0, got {self.num_local}")
        for name, (lo, hi) in (("global_ratio", self.global_ratio), ("local_ratio", self.local_ratio)):
            if not 0.0 < lo <= hi < 1.0:
                raise ConfigError(name, f"must satisfy 0 < min <= max < 1, got ({lo}, {hi})")
        if self.span_lambda <= 0:
            raise ConfigError("span_lambda", f"must be positive, got {self.span_lambda}")
        if self.max_decoder_span < 1:
            raise ConfigError("max_decoder_span", f"must be >= 1, got {self.max_decoder_span}")


@dataclass(frozen=True)
class ViewBatch:
    """Host arrays describing the views of a batch of B samples of length L (V = global + local views).

    masked      bool  [B, V, L]  True = position masked in that view
    span_id     int32 [B, V, L]  index of the masked span a position belongs to (0.. in order), -1 if visible / pad
    num_spans   int32 [B, V]
    sel_span    int32 [B, V]     one randomly selected span per view (span SIGReg, decoder), -1 if the view has none
    dec_pos     int32 [B, V, T]  positions of the selected span's first T tokens (0 where beyond its length)
    dec_len     int32 [B, V]     min(len(selected span), T); 0 if none
    """

    masked: np.ndarray
    span_id: np.ndarray
    num_spans: np.ndarray
    sel_span: np.ndarray
    dec_pos: np.ndarray
    dec_len: np.ndarray


def max_spans(seq_len: int) -> int:
    """Upper bound on the number of masked runs in a sequence of `seq_len` positions."""
    return (seq_len + 1) // 2


@numba.njit(cache=True)
def _seed(seed: int) -> None:
    np.random.seed(seed)


@numba.njit(cache=True)
def _mask_one(n: int, target: int, lam: float, out: np.ndarray) -> None:
    """Mark exactly `target` of the first `n` positions of `out` (zeroed by the caller) in Poisson spans."""
    count = 0
    cand = np.empty(n, np.int64)
    while count < target:
        length = max(1, np.random.poisson(lam))
        length = min(length, target - count)
        chosen = -1
        relax = False
        while chosen < 0:
            c = 0
            for s in range(0, n - length + 1):
                ok = True
                for j in range(s, s + length):
                    if out[j]:
                        ok = False
                        break
                if ok and not relax:
                    if s > 0 and out[s - 1]:
                        ok = False
                    if s + length < n and out[s + length]:
                        ok = False
                if ok:
                    cand[c] = s
                    c += 1
            if c > 0:
                chosen = cand[np.random.randint(0, c)]
            elif length > 1:
                length -= 1
            else:
                relax = True
        for j in range(chosen, chosen + length):
            out[j] = True
        count += length


@numba.njit(cache=True)
def _make_views(
    valid_len: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    lam: float,
    max_dec: int,
    masked: np.ndarray,
    span_id: np.ndarray,
    num_spans: np.ndarray,
    sel_span: np.ndarray,
    dec_pos: np.ndarray,
    dec_len: np.ndarray,
) -> None:
    B, V, L = masked.shape
    starts = np.empty(L, np.int64)
    lens = np.empty(L, np.int64)
    for b in range(B):
        n = valid_len[b]
        for v in range(V):
            ratio = lo[v] + (hi[v] - lo[v]) * np.random.random()
            target = int(np.floor(ratio * n + 0.5))
            if target > n - 1:
                target = n - 1
            if target < 0:
                target = 0
            _mask_one(n, target, lam, masked[b, v])
            k = 0
            for i in range(n):
                if masked[b, v, i]:
                    if i == 0 or not masked[b, v, i - 1]:
                        starts[k] = i
                        lens[k] = 0
                        k += 1
                    lens[k - 1] += 1
                    span_id[b, v, i] = k - 1
            num_spans[b, v] = k
            if k > 0:
                s = np.random.randint(0, k)
                sel_span[b, v] = s
                m = min(lens[s], max_dec)
                dec_len[b, v] = m
                for t in range(m):
                    dec_pos[b, v, t] = starts[s] + t


def make_views(tokens: np.ndarray, pad_id: int, cfg: ViewConfig, seed: int) -> ViewBatch:
    """Sample the global and local views of `tokens` (int [B, L], EOS already replaced by padding).

    Valid positions are the non-pad positions; they must form a prefix of each row (as `prepare` writes them).
    Deterministic for a given `seed`.
    """
    tokens = np.asarray(tokens)
    B, L = tokens.shape
    valid = tokens != pad_id
    valid_len = valid.sum(axis=1).astype(np.int64)
    if np.any(valid[np.arange(L)[None, :] >= valid_len[:, None]]):
        bad = int(np.nonzero(np.any(valid & (np.arange(L)[None, :] >= valid_len[:, None]), axis=1))[0][0])
        raise ConfluenceError(f"views: row {bad} of the batch has padding before a token; tokens must be a prefix")
    V = cfg.num_views
    lo = np.array([cfg.global_ratio[0]] * cfg.num_global + [cfg.local_ratio[0]] * cfg.num_local, np.float64)
    hi = np.array([cfg.global_ratio[1]] * cfg.num_global + [cfg.local_ratio[1]] * cfg.num_local, np.float64)
    T = cfg.max_decoder_span
    masked = np.zeros((B, V, L), np.bool_)
    span_id = np.full((B, V, L), -1, np.int32)
    num_spans = np.zeros((B, V), np.int32)
    sel_span = np.full((B, V), -1, np.int32)
    dec_pos = np.zeros((B, V, T), np.int32)
    dec_len = np.zeros((B, V), np.int32)
    _seed(int(seed) % (2**32 - 1))
    _make_views(valid_len, lo, hi, float(cfg.span_lambda), T, masked, span_id, num_spans, sel_span, dec_pos, dec_len)
    return ViewBatch(masked, span_id, num_spans, sel_span, dec_pos, dec_len)


def view_seed(seed: int, step: int, micro: int = 0) -> int:
    """The view-sampling seed of one (micro-)batch: a function of the run seed and the global step only."""
    return int(np.random.SeedSequence([seed, step, micro]).generate_state(1)[0])
