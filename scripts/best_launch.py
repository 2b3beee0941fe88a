"""Print `H W` of the fastest kernel launch in a `bench attention --launch ...` report (scripts/gpu_measure.sh).

Fastest = the least forward + backward time summed over the report's rows, among the launches measured in every
row; the totals go to stderr. The default launch ("kernel") is the model's (`confluence.model.config`).
"""

from __future__ import annotations

import json
import re
import sys

from confluence.model.config import KERNEL_HEADS, KERNEL_WARPS


def best_launch(report: dict) -> tuple[int, int]:
    rows = report["rows"]
    total: dict[str, float] = {}
    for row in rows:
        for name, ms in row["fwd_bwd_ms"].items():
            total[name] = total.get(name, 0.0) + ms
    complete = {n: t for n, t in total.items() if n.startswith("kernel") and all(n in r["fwd_bwd_ms"] for r in rows)}
    print({n: round(t, 3) for n, t in sorted(complete.items(), key=lambda kv: kv[1])}, file=sys.stderr)
    if not complete:
        return KERNEL_HEADS, KERNEL_WARPS
    m = re.fullmatch(r"kernel\[h=(\d+),w=(\d+)\]", min(complete, key=complete.get))
    return (int(m[1]), int(m[2])) if m else (KERNEL_HEADS, KERNEL_WARPS)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(*best_launch(json.load(f)))
