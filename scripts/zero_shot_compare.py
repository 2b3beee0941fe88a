"""Compare pretrained models zero-shot on a set of validation stores, task by task (the pretraining studies' rule).

    python scripts/zero_shot_compare.py dump CHECKPOINT OUT STORE:MAX_SEEDS ...
    python scripts/zero_shot_compare.py compare DIR_A DIR_B [--real NAME,...] [--all]

`dump` evaluates CHECKPOINT as it is (no training) on each store's validation split and writes `OUT/<name>.json`
(`confluence evaluate --json`'s layout; a store already dumped is skipped, so two halves of a set can run side by
side). `compare` counts, over the tasks both scored, those above the best trivial baseline for A and B, the tasks
B is better / worse on (headline metric), and the geometric mean of B's error over A's on the number and time tasks;
the `--real` databases also apart. Tasks whose verdict against trivial differs are listed (`--all`: every task).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path


def dump(checkpoint: str, out: Path, specs: list[str]) -> None:
    """Evaluate `checkpoint` zero-shot on each `STORE:MAX_SEEDS` into `out/<store name>.json`."""
    from confluence.evaluation.evaluate import evaluate, write_json
    from confluence.inference.predictor import load_model

    out.mkdir(parents=True, exist_ok=True)
    model = load_model(checkpoint)
    for spec in specs:
        store, n = spec.rsplit(":", 1)
        path = Path(store)
        name = path.parent.name if path.name == "store" else path.name
        target = out / f"{name}.json"
        if target.exists():
            continue
        start = time.time()
        results = evaluate(model, store, split="val", max_seeds=int(n))
        write_json(results, target)  # atomic: a killed dump never leaves a file the next call skips as done
        print(f"{name}: {len(results)} tasks in {time.time() - start:.0f} s", flush=True)


def compare(a: Path, b: Path, real: set[str], show_all: bool) -> dict[str, float]:
    """Print and return the tallies of B against A over the tasks both scored."""
    from confluence.evaluation.metrics import HEADLINE
    from confluence.evaluation.report import verdict
    from confluence.stypes import SemanticType

    t = {"tasks": 0, "a": 0, "b": 0, "better": 0, "worse": 0, "real": 0, "real_a": 0, "real_b": 0}
    logs: list[float] = []
    real_logs: list[float] = []
    for fa in sorted(a.glob("*.json")):
        fb = b / fa.name
        if not fb.exists():
            continue
        ra_all, rb_all = json.loads(fa.read_text()), json.loads(fb.read_text())
        for task, ra in ra_all.items():
            rb = rb_all.get(task) or {}
            if "model" not in ra or "model" not in rb:
                continue
            stype = SemanticType.parse(ra["info"]["stype"])
            metric, higher = HEADLINE[stype]
            va, vb = ra["model"].get(metric), rb["model"].get(metric)
            if va is None or vb is None or not (math.isfinite(va) and math.isfinite(vb)):
                continue
            above_a = any(text == "beats trivial" for text, _ in verdict(ra, stype))
            above_b = any(text == "beats trivial" for text, _ in verdict(rb, stype))
            is_real = fa.stem in real
            t["tasks"] += 1
            t["a"] += above_a
            t["b"] += above_b
            t["real"] += is_real
            t["real_a"] += above_a and is_real
            t["real_b"] += above_b and is_real
            if vb != va:
                t["better" if (vb > va) == higher else "worse"] += 1
            if not higher and va > 0 and vb > 0:
                logs.append(math.log(vb / va))
                if is_real:
                    real_logs.append(math.log(vb / va))
            if show_all or above_a != above_b:
                trivial = (ra.get("baseline") or {}).get(metric, float("nan"))
                print(f"  {fa.stem:<14} {task:<40} {metric} {va:.4g} -> {vb:.4g}  trivial {trivial:.4g}  "
                      f"above: {above_a} -> {above_b}")

    def ratio(xs: list[float]) -> float:
        return math.exp(sum(xs) / len(xs)) if xs else float("nan")

    t["error_ratio"], t["real_error_ratio"] = ratio(logs), ratio(real_logs)
    print(f"{t['tasks']} tasks: above trivial A {t['a']}, B {t['b']}; B better on {t['better']}, worse on "
          f"{t['worse']}; error ratio B/A {t['error_ratio']:.4f} ({len(logs)} number and time tasks)")
    print(f"real databases ({t['real']} tasks): above trivial A {t['real_a']}, B {t['real_b']}; error ratio "
          f"{t['real_error_ratio']:.4f}")
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="evaluate a checkpoint zero-shot on validation stores")
    d.add_argument("checkpoint")
    d.add_argument("out", type=Path)
    d.add_argument("stores", nargs="+", metavar="STORE:MAX_SEEDS")
    c = sub.add_parser("compare", help="tally B against A")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--real", default="demo,sakila,f1db", help="databases counted apart (comma-separated)")
    c.add_argument("--all", action="store_true", help="list every task")
    args = parser.parse_args()
    if args.command == "dump":
        dump(args.checkpoint, args.out, args.stores)
    else:
        compare(args.a, args.b, set(args.real.split(",")), args.all)


if __name__ == "__main__":
    main()
