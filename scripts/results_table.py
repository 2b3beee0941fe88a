"""Print the markdown table of a `confluence evaluate --json` / demo metrics.json file (for docs/RESULTS.md).

Columns: the headline metric of the model, the best trivial baseline and the GBDT, and (when present) the model
minus the GBDT with its paired-bootstrap 95% interval; "not worse (95%)" says whether that interval reaches the
side where the model is at least as good as the GBDT.
"""

from __future__ import annotations

import json
import sys

from confluence.evaluation.metrics import HEADLINE
from confluence.stypes import SemanticType


def fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g}"


def better(a: float | None, b: float | None, higher: bool, strict: bool) -> bool:
    if a is None or b is None:
        return False
    if strict:
        return a > b if higher else a < b
    return a >= b if higher else a <= b


def main(path: str) -> None:
    res = json.load(open(path))
    print("| task | type | n | metric | model | best trivial | GBDT | model − GBDT [95% CI] | beats trivial | ≥ GBDT |"
          " not worse than GBDT (95%) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for task, r in res.items():
        if "model" not in r:
            continue
        st = SemanticType.parse(r["info"]["stype"])
        m, higher = HEADLINE[st]
        mv, bv, gv = r["model"].get(m), r["baseline"].get(m), r.get("gbdt", {}).get(m)
        c = r.get("model_vs_gbdt")
        ci = f"{c['diff']:+.3g} [{c['ci_low']:+.3g}, {c['ci_high']:+.3g}]" if c and c.get("ci_low") is not None else "–"
        nw = "–" if not c or c.get("a_not_worse") is None else ("yes" if c["a_not_worse"] == 1.0 else "no")
        print(f"| {task} | {st.label} | {r['info']['n_eval']} | {m} {'↑' if higher else '↓'} | {fmt(mv)} | "
              f"{fmt(bv)} ({r['baseline'].get('name')}) | {fmt(gv)} | {ci} | "
              f"{'yes' if better(mv, bv, higher, True) else 'no'} | {'yes' if better(mv, gv, higher, False) else 'no'} "
              f"| {nw} |")


if __name__ == "__main__":
    main(sys.argv[1])
