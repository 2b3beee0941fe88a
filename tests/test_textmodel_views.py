"""Span-masked views: ratios, Poisson span lengths, at least one visible token, never pad, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.textmodel.views import ViewConfig, make_views, max_spans, view_seed

PAD = 0


def _tokens(lengths: list[int], L: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.full((len(lengths), L), PAD, np.int32)
    for i, n in enumerate(lengths):
        t[i, :n] = rng.integers(5, 100, n)
    return t


def _runs(row: np.ndarray) -> list[int]:
    lens, cur = [], 0
    for x in row:
        if x:
            cur += 1
        elif cur:
            lens.append(cur)
            cur = 0
    if cur:
        lens.append(cur)
    return lens


def test_ratios_within_range_and_never_pad() -> None:
    cfg = ViewConfig(num_global=2, num_local=3)
    lengths = [64, 40, 17, 5, 2, 1, 64, 33]
    tok = _tokens(lengths, 64)
    vb = make_views(tok, PAD, cfg, seed=3)
    for b, n in enumerate(lengths):
        for v in range(cfg.num_views):
            lo, hi = cfg.global_ratio if v < cfg.num_global else cfg.local_ratio
            k = int(vb.masked[b, v].sum())
            assert not vb.masked[b, v, n:].any(), "a pad position was masked"
            if n >= 2:
                assert np.floor(lo * n + 0.5) <= k <= min(np.floor(hi * n + 0.5), n - 1)
            assert k <= max(n - 1, 0), "no visible token left"
            assert (~vb.masked[b, v, :n]).sum() >= min(n, 1)


def test_span_ids_match_runs_and_selected_span() -> None:
    cfg = ViewConfig(num_global=1, num_local=1, max_decoder_span=4)
    tok = _tokens([64] * 16, 64, seed=1)
    vb = make_views(tok, PAD, cfg, seed=11)
    for b in range(16):
        for v in range(2):
            runs = _runs(vb.masked[b, v])
            assert vb.num_spans[b, v] == len(runs) <= max_spans(64)
            ids = vb.span_id[b, v]
            assert (ids[~vb.masked[b, v]] == -1).all()
            for s, length in enumerate(runs):
                assert (ids == s).sum() == length
            s = vb.sel_span[b, v]
            assert 0 <= s < len(runs)
            pos = np.nonzero(ids == s)[0]
            assert vb.dec_len[b, v] == min(len(pos), 4)
            assert (vb.dec_pos[b, v, : vb.dec_len[b, v]] == pos[: vb.dec_len[b, v]]).all()


def test_span_lengths_are_poisson_like() -> None:
    """Long sequences, low ratio: spans rarely hit the remaining budget, so lengths follow max(1, Poisson(3))."""
    cfg = ViewConfig(num_global=1, num_local=0, global_ratio=(0.25, 0.3))
    tok = _tokens([512] * 64, 512, seed=2)
    vb = make_views(tok, PAD, cfg, seed=5)
    lens = np.concatenate([_runs(vb.masked[b, 0]) for b in range(64)])
    rng = np.random.default_rng(0)
    ref = np.maximum(rng.poisson(3.0, 200_000), 1)
    assert abs(lens.mean() - ref.mean()) < 0.25, lens.mean()
    assert abs(np.mean(lens == 1) - np.mean(ref == 1)) < 0.05


def test_deterministic_and_seed_dependent() -> None:
    cfg = ViewConfig()
    tok = _tokens([50, 60, 64], 64)
    a = make_views(tok, PAD, cfg, seed=view_seed(0, 7))
    b = make_views(tok, PAD, cfg, seed=view_seed(0, 7))
    c = make_views(tok, PAD, cfg, seed=view_seed(0, 8))
    assert (a.masked == b.masked).all() and (a.span_id == b.span_id).all()
    assert not (a.masked == c.masked).all()


def test_padding_inside_row_is_rejected() -> None:
    tok = _tokens([10], 16)
    tok[0, 3] = PAD
    with pytest.raises(ConfluenceError, match="row 0"):
        make_views(tok, PAD, ViewConfig(), seed=0)


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ConfluenceError, match="'global_ratio': must satisfy"):
        ViewConfig(global_ratio=(0.5, 0.3))
