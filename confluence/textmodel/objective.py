"""The training objective: views -> encoder / predictor / decoder -> the LeJEPA loss terms of seed 003."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from confluence.textmodel import losses as L
from confluence.textmodel.config import TextRunConfig
from confluence.textmodel.model import TextTransformer
from confluence.textmodel.views import ViewBatch, max_spans

BATCH_KEYS = ("tokens", "masked", "span_id", "sel_span", "dec_pos", "dec_len")


def host_batch(tokens: np.ndarray, views: ViewBatch) -> dict[str, np.ndarray]:
    """The arrays one (micro-)batch feeds to `compute_losses` (tokens already EOS-stripped)."""
    return {
        "tokens": tokens.astype(np.int32),
        "masked": views.masked,
        "span_id": views.span_id,
        "sel_span": views.sel_span,
        "dec_pos": views.dec_pos,
        "dec_len": views.dec_len,
    }


def compute_losses(model: TextTransformer, batch: dict[str, jax.Array], cfg: TextRunConfig, *, pad_id: int,
                   mask_id: int, bos_id: int, eos_id: int, sigreg_key: jax.Array, key: jax.Array | None,
                   axis_name: str | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total loss and every term (float32) of one batch. `model` may hold reduced-precision parameters."""
    mcfg = cfg.model
    tokens = batch["tokens"]
    masked = batch["masked"]
    B, V, Lq = masked.shape
    G = cfg.views.num_global
    valid = tokens != pad_id
    tok_v = jnp.broadcast_to(tokens[:, None], (B, V, Lq))
    valid_v = jnp.broadcast_to(valid[:, None], (B, V, Lq))
    if mcfg.mask_token_input:
        enc_tok = jnp.where(masked, mask_id, tok_v)
        vis = valid_v
    else:
        enc_tok = tok_v
        vis = valid_v & ~masked
    all_tok = jnp.concatenate([enc_tok.reshape(B * V, Lq), tokens], axis=0)
    all_vis = jnp.concatenate([vis.reshape(B * V, Lq), valid], axis=0)
    keys = jax.random.split(key, 3) if key is not None else [None] * 3
    enc = model.encode(all_tok, all_vis, keys[0])
    D = mcfg.d_model
    fr = cfg.weights.fractions()
    parts: dict[str, jax.Array] = {}
    metrics: dict[str, jax.Array] = {}

    if "seq" in fr:
        pooled_pre = enc["pooled_pre"][: B * V].reshape(B, V, D).astype(jnp.float32)
        pooled = enc["pooled"][: B * V].reshape(B, V, D).astype(jnp.float32)
        rec = L.seq_rec_loss(pooled_pre, G, model.final_norm, cfg.pred_loss)
        reg = L.seq_sigreg_loss(pooled, sigreg_key, num_slices=cfg.sigreg_slices, axis_name=axis_name)
        parts["seq"] = L.lejepa_mix(rec, reg, cfg.sigreg_weight)
        metrics |= {"seq_rec": rec, "seq_sigreg": reg}

    pred_pre = None
    if "span" in fr or "decoder" in fr:
        pmask = jnp.zeros_like(masked) if mcfg.mask_token_input else masked
        pred_pre = model.predict(enc["out"][: B * V], pmask.reshape(B * V, Lq), valid_v.reshape(B * V, Lq), keys[1])

    if "span" in fr:
        S = max_spans(Lq)
        sample_pre = enc["pre"][B * V :].astype(jnp.float32)
        target_pre = jnp.broadcast_to(sample_pre[:, None], (B, V, Lq, D)).reshape(B * V, Lq, D)
        span_id = batch["span_id"].reshape(B * V, Lq)
        pnorm = model.predictor_norm
        rec = L.span_rec_loss(target_pre, pred_pre.astype(jnp.float32), span_id, model.final_norm, pnorm, S,
                              cfg.pred_loss, cfg.span_tokenwise)
        tmeans, _ = L.span_means(target_pre, span_id, S)  # [B*V, S, D]
        sel = batch["sel_span"].reshape(B * V)
        sel_t = jnp.take_along_axis(tmeans, jnp.maximum(sel, 0)[:, None, None], axis=1)[:, 0]
        span_targets = model.final_norm(sel_t).astype(jnp.float32).reshape(B, V, D)
        reg = L.span_sigreg_loss(span_targets, batch["sel_span"] >= 0, jax.random.fold_in(sigreg_key, 1),
                                 num_slices=cfg.sigreg_slices, axis_name=axis_name)
        parts["span"] = L.lejepa_mix(rec, reg, cfg.sigreg_weight)
        metrics |= {"span_rec": rec, "span_sigreg": reg}

    if "decoder" in fr:
        T = batch["dec_pos"].shape[-1]
        dec_pos = batch["dec_pos"].reshape(B * V, T)
        dec_len = batch["dec_len"].reshape(B * V)
        ar = jnp.arange(T)[None, :]
        in_span = ar < dec_len[:, None]
        memory = jnp.take_along_axis(pred_pre, dec_pos[..., None], axis=1)
        span_tok = jnp.take_along_axis(jnp.repeat(tokens, V, axis=0), dec_pos, axis=1)
        span_tok = jnp.where(in_span, span_tok, pad_id)
        dec_in = jnp.concatenate([jnp.full((B * V, 1), bos_id, span_tok.dtype), span_tok], axis=1)
        ar1 = jnp.arange(T + 1)[None, :]
        dec_valid = (ar1 <= dec_len[:, None]) & (dec_len[:, None] > 0)
        targets = jnp.concatenate([span_tok, jnp.full((B * V, 1), pad_id, span_tok.dtype)], axis=1)
        targets = jnp.where(ar1 == dec_len[:, None], eos_id, targets)
        logits = model.decode(dec_in, dec_valid, memory, in_span, keys[2])
        parts["decoder"] = L.decoder_loss(logits, targets, dec_valid)
        metrics["decoder"] = parts["decoder"]

    if "mlm" in fr:
        logits = model.embed.unembed(enc["post"][: B * V])
        m = L.encoder_mlm_loss(logits, tok_v.reshape(B * V, Lq), masked.reshape(B * V, Lq))
        parts["mlm"] = m["loss"]
        metrics |= {"mlm": m["loss"], "mlm_top1": m["top1"], "mlm_top5": m["top5"]}

    metrics |= {k + "_lejepa" if k in ("seq", "span") else k: v for k, v in parts.items()}
    total = L.total_loss(parts, cfg.weights)
    metrics["total"] = total
    return total, metrics


def metric_names(cfg: TextRunConfig) -> list[str]:
    """The metric columns a run logs, in a stable order."""
    fr = cfg.weights.fractions()
    out = ["total"]
    if "seq" in fr:
        out += ["seq_lejepa", "seq_rec", "seq_sigreg"]
    if "span" in fr:
        out += ["span_lejepa", "span_rec", "span_sigreg"]
    if "decoder" in fr:
        out += ["decoder"]
    if "mlm" in fr:
        out += ["mlm", "mlm_top1", "mlm_top5"]
    return out


def num_params(model: Any) -> int:
    """Number of parameters of a model."""
    import equinox as eqx

    return int(sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array))))
