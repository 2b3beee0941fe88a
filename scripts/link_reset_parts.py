"""`confluence train-links --init-from CHECKPOINT ...` with some of the checkpoint's parts left at this run's fresh
initialisation: which pretrained parts keep a fine-tuned link head from learning.

    python scripts/link_reset_parts.py PARTS -- train-links --db STORE --task TASK --out RUN --init-from CKPT ...

PARTS: comma-separated top-level fields of the model (`encoder`, `h0_norm`, `blocks`, `final_norm`, ...) or one
block (`blocks.1`); everything after `--` is the `confluence` command line.
"""

from __future__ import annotations

import sys

import equinox as eqx

import confluence.training.links as links
from confluence.cli.main import main


def _with_fresh(parts: list[str]):
    load = links.start_params

    def init_params(cfg, init_from, like):
        params = load(cfg, init_from, like)
        for part in parts:
            if part.startswith("blocks."):
                i = int(part.split(".", 1)[1])
                params = eqx.tree_at(lambda m, i=i: m.blocks[i], params, like.blocks[i])
            else:
                params = eqx.tree_at(lambda m, p=part: getattr(m, p), params, getattr(like, part))
        return params

    return init_params


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit(__doc__)
    links.start_params = _with_fresh([p for p in sys.argv[1].split(",") if p])
    sys.argv = ["confluence", *sys.argv[3:]]
    main()
