"""GPU readiness without a GPU: the whole fused train step (BF16 compute, block-sparse kernel in every sublayer,
Muon + AdamW update) lowers for CUDA on this CPU machine."""

import dataclasses
import functools

from confluence.model.attention import register_attention
from confluence.model.config import ModelConfig
from confluence.model.inputs import DbTables, batch_to_inputs
from confluence.model.kernels import block_sparse, block_sparse_attention
from confluence.training.step import Trainer
from tests.fixtures.gpu import cuda_lowering
from tests.fixtures.model import MAX_K, TINY, tiny_batch, tiny_db, tiny_model, tiny_run_config


def _lowered_step(model_cfg: ModelConfig) -> str:
    """The StableHLO text of the tiny model's fused train step lowered for CUDA."""
    cfg = tiny_run_config()
    db = tiny_db()
    tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, MAX_K)
    tr = Trainer(tiny_model(model_cfg), cfg.optim.for_run(cfg.loop.max_steps), cfg.loss)
    params, opt = tr.init_state(tiny_model(model_cfg))
    inputs = batch_to_inputs(tiny_batch(db, task=3))
    with cuda_lowering():
        lowered = tr._step.trace(params, opt, inputs, tb.column_embeddings, tb.categorical_embeddings).lower(
            lowering_platforms=("cuda",))
    return lowered.as_text()


def test_train_step_with_the_kernel_lowers_for_cuda():
    register_attention("block_sparse_compiled", functools.partial(block_sparse_attention, interpret=False))
    text = _lowered_step(dataclasses.replace(TINY, attention_impl="block_sparse_compiled", compute_dtype="bfloat16"))
    # 3 sublayers x (forward, dQ, dK/dV) Triton kernels in the one layer of the tiny model; the outbound and
    # inbound sublayers also carry the kernel's second variant (a dynamic bit-word loop behind a lax.cond).
    n = text.count("custom_call @__gpu$xla.gpu.triton")
    assert n >= 9 and n % 3 == 0, n
    assert "bf16" in text


def test_train_step_with_attention_sinks_lowers_for_cuda():
    """The sinks are composed outside the Triton kernels: the step with sinks in every sublayer lowers for CUDA with
    the same kernels as without."""
    register_attention("block_sparse_compiled_sinks", block_sparse(block=16, interpret=False))
    counts = []
    for sink in ((), ("outbound", "inbound", "column")):
        text = _lowered_step(dataclasses.replace(TINY, attention_impl="block_sparse_compiled_sinks",
                                                 compute_dtype="bfloat16", attention_sink=sink))
        counts.append(text.count("custom_call @__gpu$xla.gpu.triton"))
    assert counts[0] == counts[1] >= 9, counts
