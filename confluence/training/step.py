"""The jitted train / eval steps of the relational transformer and the placement of its batches on the mesh.

Parameters (float32 master weights) and optimizer state are replicated over a 1-D mesh with axis "data"; batch
tensors are sharded along their leading (batch) axis. The loss is a mean over the global batch, so XLA inserts the
gradient all-reduce. The per-database embedding tables are step INPUTS (replicated), so one compiled step serves
every database and task whose padded shapes agree.
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from confluence.model.config import LossConfig
from confluence.model.inputs import BATCH_AXIS_FIELDS
from confluence.model.loss import target_loss
from confluence.model.transformer import RelationalTransformer
from confluence.toolkit.memory import StepMemory, check_fits
from confluence.toolkit.mesh import DATA_AXIS
from confluence.toolkit.optim import (
    ADAMW_DECAY,
    ADAMW_NO_DECAY,
    MUON,
    OptimConfig,
    label_by_path,
    make_optimizer,
)

# Leaf names of the 2-D core matrices (attention projections, SDPA gates, SwiGLU) inside `blocks`: Muon.
CORE_MATRICES = frozenset({"w_q", "w_k", "w_v", "w_o", "w_gate", "w_up", "w_down"})
# AdamW leaves that get weight decay: weights of encoders / heads and the learned embeddings.
DECAYED = frozenset({"weight", "boolean_encoder", "identifier_emb", "null_emb", "mask_emb", "child_rank_emb",
                     "arrival_weight", "arrival_emb"})


def param_labels(params) -> object:
    """The optimizer split of seed 000: Muon for the core matrices of the blocks, AdamW with weight decay for the
    encoder / head weights and learned embeddings, AdamW without decay for biases, norm scales, temperatures."""

    def rule(names: list[str], leaf) -> str:
        if "blocks" in names and leaf.ndim == 2 and any(n in CORE_MATRICES for n in names):
            return MUON
        return ADAMW_DECAY if names and names[-1] in DECAYED else ADAMW_NO_DECAY

    return label_by_path(params, rule)


def shard_inputs(inputs: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Shard the batch-axis tensors over "data" and replicate the rest. With several processes each process
    passes its local part of the batch (global batch = concatenation over processes)."""
    n = mesh.devices.size
    local_n = n // jax.process_count()
    if jax.process_count() > 1:
        inputs = _globalize_text(inputs, local_n)
    out = {}
    for name, x in inputs.items():
        if name in BATCH_AXIS_FIELDS or (name == "text_batch_embeddings" and jax.process_count() > 1):
            if x.shape[0] % local_n:
                raise ValueError(
                    f"batch field {name!r}: local batch size {x.shape[0]} is not divisible by the {local_n} local "
                    "devices of the data-parallel mesh; choose batch_size as a multiple of the device count"
                )
            spec = PartitionSpec(DATA_AXIS)
        else:
            spec = PartitionSpec()
        sharding = NamedSharding(mesh, spec)
        if jax.process_count() > 1 and spec != PartitionSpec():
            out[name] = jax.make_array_from_process_local_data(sharding, x)
        else:
            out[name] = jax.device_put(x, sharding)
    return out


def is_param(x: object) -> bool:
    """Float array leaves, also as abstract `ShapeDtypeStruct`s (a skeleton from `eqx.filter_eval_shape`)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jnp.issubdtype(x.dtype, jnp.inexact)
    return eqx.is_inexact_array(x)


def _globalize_text(inputs: dict[str, np.ndarray], local_n: int) -> dict[str, np.ndarray]:
    """Several processes: each has its own batch-local text table. Pad every process's table to the largest U (a
    multiple of the local device count), offset the local text ids by process_index * U, and let the caller shard
    the tables along the data axis, so the global table is their concatenation."""
    from jax.experimental import multihost_utils

    text = inputs["text_batch_embeddings"]
    u = -(-text.shape[0] // local_n) * local_n
    u = int(np.max(multihost_utils.process_allgather(np.array([u], np.int64))))
    padded = np.zeros((u, text.shape[1]), text.dtype)
    padded[: text.shape[0]] = text
    ids = inputs["text_embed_ids"].astype(np.uint32) + np.uint32(jax.process_index() * u)
    return {**inputs, "text_batch_embeddings": padded, "text_embed_ids": ids}


class StepMetrics(NamedTuple):
    loss: jax.Array
    null_loss: jax.Array
    type_loss: jax.Array
    grad_norm: jax.Array
    lr_scale: jax.Array  # warmup * decay multiplier of the update just applied


class Trainer:
    """Holds the model skeleton, the optimizer and the compiled steps; the state (params, opt_state) is explicit.
    `optim` is resolved for the run's length (`OptimConfig.for_run`)."""

    def __init__(self, model: RelationalTransformer, optim: OptimConfig, loss: LossConfig):
        params, self.static = eqx.partition(model, is_param)
        self.optim_cfg, self.loss_cfg = optim, loss
        self.optimizer = make_optimizer(param_labels(params), optim)
        self._step = jax.jit(self._train_step, donate_argnums=(0, 1))
        self._grad = jax.jit(self._grads)
        self._apply = jax.jit(self._apply_grads, donate_argnums=(0, 1))
        self._eval = jax.jit(self._eval_loss)

    # -- pure functions --------------------------------------------------------------------------------------------
    def _loss(self, params, inputs, col_tab, cat_tab):
        model = eqx.combine(params, self.static)
        out = model.at_targets(inputs, col_tab, cat_tab)  # the heads at the target cells only
        parts = target_loss(out, inputs, model.encoder, cat_tab, self.loss_cfg)
        return parts.loss, parts

    def _grads(self, params, inputs, col_tab, cat_tab):
        (_, parts), grads = jax.value_and_grad(self._loss, has_aux=True)(params, inputs, col_tab, cat_tab)
        return grads, parts

    def _apply_grads(self, params, opt_state, grads):
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, grad_norm

    def _train_step(self, params, opt_state, inputs, col_tab, cat_tab):
        grads, parts = self._grads(params, inputs, col_tab, cat_tab)
        params, opt_state, grad_norm = self._apply_grads(params, opt_state, grads)
        return params, opt_state, (parts.loss, parts.null_loss, parts.type_loss, grad_norm)

    def _eval_loss(self, params, inputs, col_tab, cat_tab):
        _, parts = self._loss(params, inputs, col_tab, cat_tab)
        return parts.loss, jnp.sum(parts.weight)

    # -- public API ------------------------------------------------------------------------------------------------
    def init_state(self, model: RelationalTransformer) -> tuple[Any, Any]:
        params = eqx.filter(model, eqx.is_inexact_array)
        return params, self.optimizer.init(params)

    def model(self, params) -> RelationalTransformer:
        return eqx.combine(params, self.static)

    def step(self, params, opt_state, micro: list[tuple[dict, jax.Array, jax.Array]], step_index: int):
        """One optimizer update from one or more micro-batches `(inputs, column_table, category_table)`.
        Gradients of several micro-batches are averaged in FP32 before clipping and the update."""
        if len(micro) == 1:
            params, opt_state, (loss, nl, tl, gn) = self._step(params, opt_state, *micro[0])
        else:
            acc, losses = None, []
            for inputs, col_tab, cat_tab in micro:
                g, parts = self._grad(params, inputs, col_tab, cat_tab)
                acc = g if acc is None else jax.tree.map(jnp.add, acc, g)
                losses.append(parts)
            acc = jax.tree.map(lambda g: g / len(micro), acc)
            params, opt_state, gn = self._apply(params, opt_state, acc)
            loss = sum(p.loss for p in losses) / len(micro)
            nl = sum(p.null_loss for p in losses) / len(micro)
            tl = sum(p.type_loss for p in losses) / len(micro)
        lr = self.optim_cfg.multiplier(step_index + 1)
        return params, opt_state, StepMetrics(loss, nl, tl, gn, lr)

    def check_memory(self, params, opt_state, micro: list[tuple[dict, jax.Array, jax.Array]]) -> StepMemory | None:
        """Compile the step `step` would run for these micro-batches and raise a ConfluenceError naming the
        settings to change if it needs more memory than the device holds (toolkit/memory.py); returns what it needs
        (None where unknown). The compiled step lands in jit's cache, so the first step does not compile again."""
        inputs, col_tab, cat_tab = micro[0]
        if len(micro) == 1:
            compiled = self._step.lower(params, opt_state, inputs, col_tab, cat_tab).compile()
        else:
            compiled = self._grad.lower(params, inputs, col_tab, cat_tab).compile()
        b, s = inputs["is_padding"].shape[:2]
        return check_fits(compiled, f"a training step of {b} sequences of {s} cells",
                          "lower sampler.batch_size and raise loop.grad_accum by the same factor (--set "
                          "sampler.batch_size=... --set loop.grad_accum=...: the same sequences per update), or "
                          "lower sampler.seq_len")

    def time_steps(self, params, opt_state, micro: list[tuple[dict, jax.Array, jax.Array]], n: int = 5) -> float:
        """Seconds one optimizer update takes on these micro-batches (after one warm-up update), measured on copies
        of the state: the run's own state is not touched (a time budget's step count comes from this)."""
        p, o = jax.tree.map(jnp.copy, (params, opt_state))
        p, o, m = self.step(p, o, micro, 0)
        jax.block_until_ready(m.loss)
        t0 = time.perf_counter()
        for i in range(n):
            p, o, m = self.step(p, o, micro, i + 1)
        jax.block_until_ready(m.loss)
        return (time.perf_counter() - t0) / n

    def eval_loss(self, params, inputs, col_tab, cat_tab) -> tuple[jax.Array, jax.Array]:
        """(mean loss, number of counted sequences) of one batch, no update."""
        return self._eval(params, inputs, col_tab, cat_tab)


@functools.lru_cache(maxsize=8)
def get_trainer(model_cfg, optim: OptimConfig, loss: LossConfig) -> Trainer:
    """A Trainer per configuration, shared within the process so repeated runs reuse the compiled steps."""
    skeleton = eqx.filter_eval_shape(RelationalTransformer, model_cfg, key=jax.random.key(0))
    return Trainer(skeleton, optim, loss)
