"""`confluence bench train` under several XLA:CPU flag sets, alternated in one run (the machines here are noisy).

    python scripts/xla_flags_sweep.py [--rounds 4] [--config small] [--only base,vec512,...]

Each round runs every variant once, each a fresh process with `XLA_FLAGS` set to the variant's flags (the base
variant: none), and the script prints steps/s per round and each variant's median. The flags are XLA's own
(jaxlib 0.10.2 knows all of them); what they do: the XLA sources' `debug_options_flags.cc`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

VARIANTS = {
    "base": "",
    "vec512": "--xla_cpu_prefer_vector_width=512",  # 512-bit vectors in XLA's own loops (default 256)
    "onednn": "--xla_cpu_use_onednn=true",  # oneDNN for the operations it supports
    "conc_sched": "--xla_cpu_enable_concurrency_optimized_scheduler=true",  # order ops so more run side by side
    "ynn_all": "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce,individual_dot",  # YNNPACK fusions
    "ynn_off": "--xla_cpu_experimental_ynn_fusion_type=",  # no YNNPACK: Eigen's dots
    "eigen_1thread": "--xla_cpu_multi_thread_eigen=false",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--config", default="small")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variant names")
    args = ap.parse_args()
    names = args.only.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    res: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for n in names:
                out = Path(tmp) / f"{n}{r}.json"
                cmd = [sys.executable, "-m", "confluence.cli.main", "bench", "train", "--config", args.config,
                       "--steps", str(args.steps), "--windows", "3", "--json", str(out)]
                subprocess.run(cmd, env=dict(os.environ, XLA_FLAGS=VARIANTS[n]), cwd=ROOT, check=True,
                               capture_output=True)
                d = json.loads(out.read_text())
                res[n].append(d["steps_per_s"])
                print(f"round {r} {n}: {d['steps_per_s']:.2f} steps/s (compile {d['compile_s']:.1f} s)", flush=True)
    base = statistics.median(res["base"]) if "base" in res else None
    for n in names:
        med = statistics.median(res[n])
        rel = f", {med / base:.2f}x base" if base else ""
        print(f"{n}: {[round(x, 2) for x in res[n]]} median {med:.2f}{rel}")


if __name__ == "__main__":
    main()
