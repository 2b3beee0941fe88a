"""Several contexts per prediction: the sampler draws each seed's context at random (which labelled rows, which
children when a row has more than the walk takes), so `n` draws of the same seed are `n` views of it; their head
outputs combined are a better answer than one (measured in docs/design/decisions.md, "Context draws"). Draw `e` is the
sampler's epoch `e`, so draw 0 is exactly the one context of a single draw, and the draws are deterministic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np

H = TypeVar("H")  # `confluence.inference.predictor.HeadOutputs`

# context draws per prediction (`Predictor(draws=...)`, `--draws`): chosen on validation splits (docs/design/decisions.md,
# "Context draws"); 1 is a single context per seed, exactly the answer of one draw
DEFAULT_DRAWS = 4


def _log_mean_exp(x: np.ndarray) -> np.ndarray:
    """log(mean(exp(x))) over axis 0, in float64 without overflow."""
    return np.logaddexp.reduce(x, axis=0) - np.log(x.shape[0])


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def combine_draws(draws: Sequence[H]) -> H:
    """One answer from several context draws of the same seeds (rows aligned): the null, boolean and categorical
    heads' probabilities averaged (returned as logits / log-probabilities, so every consumer reads them as it reads
    one draw's), numbers and the timestamp's value by the median over draws (the answers are scored by absolute
    error), the timestamp's cyclic (cos, sin) pairs averaged. One draw is returned as it is."""
    if len(draws) == 1:
        return draws[0]
    if not draws:
        raise ValueError("combine_draws needs at least one draw")
    def stack(name: str) -> np.ndarray:  # [draws, ...] in float64
        return np.stack([np.asarray(getattr(d, name), dtype=np.float64) for d in draws])

    def binary(name: str) -> np.ndarray:  # logit of the mean probability: log p - log(1 - p), each a log-mean-exp
        x = stack(name)
        return _log_mean_exp(_log_sigmoid(x)) - _log_mean_exp(_log_sigmoid(-x))

    cat = stack("cat_logits")
    if cat.shape[-1]:  # log of the mean class probabilities
        cat = _log_mean_exp(cat - np.logaddexp.reduce(cat, axis=-1, keepdims=True))
    else:
        cat = cat[0]
    ts = stack("ts_pred")
    ts_out = ts.mean(axis=0)
    ts_out[:, -1] = np.median(ts[:, :, -1], axis=0)
    f32 = np.float32
    return replace(draws[0], null_logit=binary("null_logit").astype(f32),
                   num_pred=np.median(stack("num_pred"), axis=0).astype(f32),
                   bool_logit=binary("bool_logit").astype(f32), ts_pred=ts_out.astype(f32), cat_logits=cat.astype(f32))
