"""The LeJEPA losses of seed 003, each a pure function on float32 arrays.

Where a loss is computed on one device of a data-parallel step, pass `axis_name` so batch statistics (SIGReg's
empirical characteristic function) are averaged across the data axis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from confluence.errors import ConfigError, ConfluenceError


def sigreg_directions(key: jax.Array, dim: int, num_slices: int) -> jax.Array:
    """[dim, num_slices] standard-normal directions normalized to unit length."""
    a = jax.random.normal(key, (dim, num_slices), jnp.float32)
    return a / jnp.linalg.norm(a, axis=0, keepdims=True)


def sigreg_key(seed: int, step: jax.Array | int) -> jax.Array:
    """The SIGReg key of a global step: the same on every device, different every step."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), step)


def sigreg(
    z: jax.Array,
    key: jax.Array,
    *,
    num_slices: int = 256,
    num_knots: int = 17,
    t_max: float = 3.0,
    weights: jax.Array | None = None,
    axis_name: str | None = None,
) -> jax.Array:
    """Sketched Isotropic Gaussian Regularization (Epps-Pulley test statistic) of z [N, K] or [N, V, K].

    Projects onto `num_slices` random unit directions, compares the empirical characteristic function at knots
    t in [0, t_max] (the integrand is even, so [0, t_max] with doubled trapezoid weights covers [-t_max, t_max])
    with the standard normal's exp(-t^2/2), weighted by exp(-t^2/2); multiplies by the global batch size N and
    averages over directions and views. With `axis_name`, the characteristic function and N are summed over that
    mapped axis (every device must use the same `key`). `weights` [N] (0/1) drops rows (e.g. views without spans).
    For N standard-normal samples its expectation is about 1.06 whatever N; it grows like N when z collapses or
    is scaled.
    """
    z = z.astype(jnp.float32)
    if z.ndim == 2:
        z = z[:, None, :]
    if z.ndim != 3:
        raise ConfluenceError(f"sigreg expects [N, K] or [N, V, K] embeddings, got shape {z.shape}")
    n, _, k = z.shape
    w = jnp.ones((n,), jnp.float32) if weights is None else weights.astype(jnp.float32)
    if w.ndim == 1:
        w = jnp.broadcast_to(w[:, None], z.shape[:2])
    a = sigreg_directions(key, k, num_slices)
    x = jnp.einsum("nvk,km->nvm", z, a)  # [N, V, M]
    t = jnp.linspace(0.0, t_max, num_knots)
    tx = x[..., None] * t  # [N, V, M, T]
    wsum = jnp.sum(w, axis=0)  # [V]
    cos_s = jnp.einsum("nv,nvmt->vmt", w, jnp.cos(tx))
    sin_s = jnp.einsum("nv,nvmt->vmt", w, jnp.sin(tx))
    if axis_name is not None:
        cos_s, sin_s, wsum = jax.lax.psum((cos_s, sin_s, wsum), axis_name)
    denom = jnp.maximum(wsum, 1.0)[:, None, None]
    re, im = cos_s / denom, sin_s / denom
    gauss = jnp.exp(-0.5 * t * t)
    err = (re - gauss) ** 2 + im**2
    dt = t_max / (num_knots - 1)
    trap = jnp.full((num_knots,), 2.0 * dt).at[0].set(dt).at[-1].set(dt)  # doubled trapezoid weights
    stat = jnp.sum(err * gauss * trap, axis=-1) * wsum[:, None]  # [V, M]
    return jnp.mean(stat)


def _dist(a: jax.Array, b: jax.Array, kind: str) -> jax.Array:
    """Per-vector distance over the last axis: mean squared error or 1 - cosine similarity."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    if kind == "mse":
        return jnp.mean((a - b) ** 2, axis=-1)
    if kind == "cosine":
        num = jnp.sum(a * b, axis=-1)
        den = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
        return 1.0 - num / jnp.maximum(den, 1e-6)
    raise ConfluenceError(f"prediction loss must be 'mse' or 'cosine', got {kind!r}")


def seq_rec_loss(pooled_pre: jax.Array, num_global: int, final_norm: Callable[[jax.Array], jax.Array],
                 kind: str = "mse") -> jax.Array:
    """Distance of every view's post-final-norm pooled embedding to the sample's global center.

    pooled_pre [B, V, D]: pre-final-norm pooled views, the first `num_global` global. The center is
    final_norm(mean of the global views' pooled_pre); the loss averages over samples and views.
    """
    pooled_pre = pooled_pre.astype(jnp.float32)
    center = final_norm(jnp.mean(pooled_pre[:, :num_global], axis=1)).astype(jnp.float32)
    post = final_norm(pooled_pre).astype(jnp.float32)
    return jnp.mean(_dist(post, center[:, None, :], kind))


def seq_sigreg_loss(pooled: jax.Array, key: jax.Array, *, num_slices: int = 256,
                    axis_name: str | None = None) -> jax.Array:
    """SIGReg of the post-final-norm pooled view embeddings [B, V, D], averaged over views."""
    return sigreg(pooled, key, num_slices=num_slices, axis_name=axis_name)


def lejepa_mix(rec: jax.Array, reg: jax.Array, sigreg_weight: float) -> jax.Array:
    """(1 - sigreg_weight) * rec + sigreg_weight * reg (`seq_lejepa_loss` / `span_lejepa_loss`)."""
    return (1.0 - sigreg_weight) * rec + sigreg_weight * reg


def span_means(x: jax.Array, span_id: jax.Array, num_spans_cap: int) -> tuple[jax.Array, jax.Array]:
    """Means of x [N, L, D] over each span of span_id [N, L] (-1 = none): ([N, S, D], count [N, S])."""
    n, length, d = x.shape
    seg = jnp.where(span_id >= 0, jnp.arange(n)[:, None] * num_spans_cap + span_id, n * num_spans_cap)
    xs = jax.ops.segment_sum(x.reshape(n * length, d).astype(jnp.float32), seg.reshape(-1),
                             num_segments=n * num_spans_cap + 1)[:-1]
    cnt = jax.ops.segment_sum(jnp.ones((n * length,), jnp.float32), seg.reshape(-1),
                              num_segments=n * num_spans_cap + 1)[:-1]
    xs = xs.reshape(n, num_spans_cap, d)
    cnt = cnt.reshape(n, num_spans_cap)
    return xs / jnp.maximum(cnt, 1.0)[..., None], cnt


def span_rec_loss(target_pre: jax.Array, pred_pre: jax.Array, span_id: jax.Array,
                  target_norm: Callable[[jax.Array], jax.Array], pred_norm: Callable[[jax.Array], jax.Array],
                  num_spans_cap: int, kind: str = "mse", tokenwise: bool = False) -> jax.Array:
    """Span reconstruction: predictor vs sample-view representation over each masked span.

    target_pre [N, L, D]: pre-final-norm sample-view tokens (repeated per view), pred_pre [N, L, D]: predictor
    outputs before its final norm, span_id [N, L] (N = B * V). Default: mean over the span, then each side's final
    norm, then the distance; `tokenwise`: final norms per token, distance per token, averaged over each span's
    tokens. Averaged over the spans of a view, then over views that have spans.
    """
    if tokenwise:
        d = _dist(pred_norm(pred_pre).astype(jnp.float32), target_norm(target_pre).astype(jnp.float32), kind)
        per_span, cnt = span_means(d[..., None], span_id, num_spans_cap)
        per_span = per_span[..., 0]
    else:
        t, cnt = span_means(target_pre, span_id, num_spans_cap)
        p, _ = span_means(pred_pre, span_id, num_spans_cap)
        per_span = _dist(pred_norm(p), target_norm(t), kind)
    has = (cnt > 0).astype(jnp.float32)
    n_spans = jnp.sum(has, axis=1)
    per_view = jnp.sum(per_span * has, axis=1) / jnp.maximum(n_spans, 1.0)
    view_ok = (n_spans > 0).astype(jnp.float32)
    return jnp.sum(per_view * view_ok) / jnp.maximum(jnp.sum(view_ok), 1.0)


def span_sigreg_loss(span_targets: jax.Array, present: jax.Array, key: jax.Array, *, num_slices: int = 256,
                     axis_name: str | None = None) -> jax.Array:
    """SIGReg of one selected span target per sample and view: span_targets [B, V, D], present [B, V] bool."""
    return sigreg(span_targets, key, num_slices=num_slices, weights=present, axis_name=axis_name)


def cross_entropy(logits: jax.Array, targets: jax.Array, weight: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Weighted-mean cross entropy of logits [..., V] vs targets [...]; returns (loss, per-position nll)."""
    logits = logits.astype(jnp.float32)
    nll = jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    w = weight.astype(jnp.float32)
    return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0), nll


def decoder_loss(logits: jax.Array, targets: jax.Array, valid: jax.Array) -> jax.Array:
    """Cross entropy of decoder logits [N, T, vocab] against targets [N, T] on valid (non-pad) positions."""
    return cross_entropy(logits, targets, valid)[0]


def encoder_mlm_loss(logits: jax.Array, targets: jax.Array, masked: jax.Array) -> dict[str, jax.Array]:
    """Masked-token cross entropy with top-1 / top-5 accuracy over masked positions (logits [..., vocab])."""
    loss, _ = cross_entropy(logits, targets, masked)
    w = masked.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(w), 1.0)
    k = min(5, logits.shape[-1])
    _, top = jax.lax.top_k(logits.astype(jnp.float32), k)
    hit1 = (top[..., 0] == targets).astype(jnp.float32)
    hit5 = jnp.any(top == targets[..., None], axis=-1).astype(jnp.float32)
    return {"loss": loss, "top1": jnp.sum(hit1 * w) / n, "top5": jnp.sum(hit5 * w) / n}


@dataclass(frozen=True)
class LossWeights:
    """Raw weights of the four terms of `total_loss`; normalized to sum to one, a zero weight skips the term."""

    seq: float = 1.0
    span: float = 1.0
    decoder: float = 1.0
    mlm: float = 0.0

    def __post_init__(self) -> None:
        for name in ("seq", "span", "decoder", "mlm"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if self.seq + self.span + self.decoder + self.mlm <= 0:
            raise ConfigError("seq", "at least one of the seq / span / decoder / mlm loss weights must be positive")

    def fractions(self) -> dict[str, float]:
        raw = {"seq": self.seq, "span": self.span, "decoder": self.decoder, "mlm": self.mlm}
        s = sum(raw.values())
        return {k: v / s for k, v in raw.items() if v > 0}


def total_loss(parts: dict[str, jax.Array], weights: LossWeights) -> jax.Array:
    """sum_k frac_k * parts[k] over the terms with a positive weight (parts: seq, span, decoder, mlm)."""
    fr = weights.fractions()
    missing = [k for k in fr if k not in parts]
    if missing:
        raise ConfluenceError(f"total_loss: weighted terms {missing} were not computed")
    return sum(fr[k] * parts[k].astype(jnp.float32) for k in fr)
