"""Print the markdown table of a `confluence evaluate --json` / demo metrics.json file (for docs/RESULTS.md)."""

from __future__ import annotations

import json
import sys

from confluence.evaluation.metrics import HEADLINE
from confluence.stypes import SemanticType


def fmt(v):
    return "–" if v is None else f"{v:.4g}"


def main(path: str) -> None:
    res = json.load(open(path))
    print("| task | type | n | metric | model | best trivial | GBDT | model beats trivial | model ≥ GBDT |")
    print("|---|---|---|---|---|---|---|---|---|")
    for task, r in res.items():
        if "model" not in r:
            continue
        st = SemanticType.parse(r["info"]["stype"])
        m, higher = HEADLINE[st]
        mv, bv, gv = r["model"].get(m), r["baseline"].get(m), r.get("gbdt", {}).get(m)
        better = (lambda a, b: a is not None and b is not None and (a > b if higher else a < b))
        geq = (lambda a, b: a is not None and b is not None and (a >= b if higher else a <= b))
        print(f"| {task} | {st.label} | {r['info']['n_eval']} | {m} {'↑' if higher else '↓'} | {fmt(mv)} | "
              f"{fmt(bv)} ({r['baseline'].get('name')}) | {fmt(gv)} | {'yes' if better(mv, bv) else 'no'} | "
              f"{'yes' if geq(mv, gv) else 'no'} |")


if __name__ == "__main__":
    main(sys.argv[1])
