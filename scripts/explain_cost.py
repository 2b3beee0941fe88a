"""Time and check explanations on a trained run: seconds per explanation (`Explainer.seeds`, after a warm-up) and
the faithfulness check, for tasks of its store, on the first test seeds.

    python scripts/explain_cost.py RUN STORE TASK [TASK ...] [--seeds 32] [--draws 4]
"""

from __future__ import annotations

import argparse
import time

from confluence.inference.explain import Explainer
from confluence.inference.predictor import Predictor, load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("store")
    ap.add_argument("tasks", nargs="+")
    ap.add_argument("--seeds", type=int, default=32)
    ap.add_argument("--draws", type=int, default=4)
    args = ap.parse_args()
    p = Predictor(load_model(args.run), args.store, draws=args.draws)
    for task in args.tasks:
        ids = p.seed_ids("test", task)[:args.seeds]
        ex = Explainer(p, task)
        ex.seeds(ids[:2])  # compiles, builds the replacement values
        t0 = time.perf_counter()
        out = ex.seeds(ids)
        dt = time.perf_counter() - t0
        print(f"{task}: {dt / len(out):.3f} s per explanation ({len(out)} seeds, draws {args.draws}); "
              f"faithfulness (k=2): {ex.faithfulness(ids, k=2)}")
        print(out[0].text())
    p.close()


if __name__ == "__main__":
    main()
