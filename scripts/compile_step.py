"""Where a recipe's training step spends its compile time, on this machine (docs/design/training_speed.md, "Current figures").

    python scripts/compile_step.py RECIPE [--set KEY=VALUE ...] [--cuda [--both-word-loops]]

Lowers and compiles each jitted part of the train step (forward + loss, forward + backward, optimizer update, the
fused step) on one synthetic batch of the recipe's shapes, without running any, and prints seconds per part as JSON.
`--cuda` instead lowers the fused step with the block-sparse kernel for CUDA on this machine (no GPU needed) and
counts what XLA will compile there: Triton kernels, sorts, dot products, characters of StableHLO.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluence.bench.train import StepBench  # noqa: E402
from confluence.toolkit.config import parse_sets  # noqa: E402
from confluence.training.config import load_config  # noqa: E402


def _timed(fn, *args) -> list[float]:
    t0 = time.perf_counter()
    lowered = fn.lower(*args)
    t1 = time.perf_counter()
    lowered.compile()
    return [round(t1 - t0, 2), round(time.perf_counter() - t1, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--both-word-loops", action="store_true",
                    help="with --cuda: the kernel as before 2026-11-25 (both word-loop variants and a lax.cond)")
    args = ap.parse_args()
    overrides = parse_sets(args.set)
    if args.cuda:
        from confluence.model.attention import register_attention
        from confluence.model.kernels import block_sparse

        # the model's kernel (structures prepared once per batch), compiled as on a GPU
        register_attention("block_sparse_compiled",
                           block_sparse(interpret=False, contiguous_rows=not args.both_word_loops))
        overrides.setdefault("model", {})["attention_impl"] = "block_sparse_compiled"
    b = StepBench(load_config(args.recipe, overrides))
    tr = b.trainer
    out: dict = {"recipe": args.recipe, "set": args.set}
    if args.cuda:
        from confluence.bench.cuda_lowering import cuda_lowering

        host = jax.tree.map(np.asarray, (b.state, b.inputs[0], b.tabs))  # not the CPU mesh's arrays
        t0 = time.perf_counter()
        with cuda_lowering():
            text = tr._step.trace(*host[0], host[1], *host[2]).lower(lowering_platforms=("cuda",)).as_text()
        out.update(lower_s=round(time.perf_counter() - t0, 2), triton_kernels=text.count("xla.gpu.triton"),
                   sorts=text.count("stablehlo.sort"), dots=text.count("stablehlo.dot_general"),
                   stablehlo_chars=len(text))
    else:
        grads = jax.eval_shape(tr._grad, b.state[0], b.inputs[0], *b.tabs)[0]
        out["lower_compile_s"] = {
            "forward_loss": _timed(tr._eval, b.state[0], b.inputs[0], *b.tabs),
            "forward_backward": _timed(tr._grad, b.state[0], b.inputs[0], *b.tabs),
            "update": _timed(tr._apply, *b.state, grads),
            "step": _timed(tr._step, *b.state, b.inputs[0], *b.tabs),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
