"""A/B of `confluence bench train` between two commits, interleaved in one run (the machines here are noisy).

    python scripts/ab_bench_train.py OLD_REF [NEW_REF] [--config small] [--rounds 5] [--steps 30] [--set K=V ...]

Each ref is checked out into a temporary git worktree (NEW_REF defaults to the working tree itself); the rounds
alternate old, new, old, new, ... each a fresh `python -m confluence.cli.main bench train` process run with this
interpreter (so both sides use the same installed packages), and the script prints steps/s of every round, the
median of each side and the ratio new / old. `--json FILE` writes the same.
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


def _worktree(ref: str, tmp: Path) -> Path:
    path = tmp / ref.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), ref], check=True,
                   capture_output=True)
    return path


def _bench(src: Path, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "confluence.cli.main", "bench", "train", "--config", args.config,
           "--steps", str(args.steps), "--json", str(out)]
    if args.windows > 1:
        cmd += ["--windows", str(args.windows)]
    for s in args.set:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=str(src))
    subprocess.run(cmd, cwd=src, env=env, check=True, capture_output=True)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new", nargs="?", default=None, help="a git ref; default: the working tree")
    ap.add_argument("--config", default="small")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--windows", type=int, default=1, help="timed windows per run (needs a `bench train` that has "
                    "--windows on both sides)")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        trees = {"old": _worktree(args.old, tmp), "new": ROOT if args.new is None else _worktree(args.new, tmp)}
        try:
            rounds: dict[str, list[dict]] = {"old": [], "new": []}
            for r in range(args.rounds):
                for side in ("old", "new"):
                    res = _bench(trees[side], args, tmp / f"{side}{r}.json")
                    rounds[side].append(res)
                    print(f"round {r} {side}: {res['steps_per_s']:.3f} steps/s (step {res['step_s'] * 1e3:.1f} ms, "
                          f"compile {res['compile_s']:.1f} s)", flush=True)
        finally:
            for path in trees.values():
                if path != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                                   capture_output=True)
    med = {side: statistics.median(x["steps_per_s"] for x in v) for side, v in rounds.items()}
    # each round's old and new ran next to each other: the median of their ratios is the least noisy figure
    paired = statistics.median(n["steps_per_s"] / o["steps_per_s"] for o, n in zip(rounds["old"], rounds["new"], strict=True))
    comp = {side: statistics.median(x["compile_s"] for x in v) for side, v in rounds.items()}
    summary = {"old": args.old, "new": args.new or "working tree", "config": args.config, "steps": args.steps,
               "median_steps_per_s": med, "median_compile_s": comp, "ratio": med["new"] / med["old"], "paired_ratio": paired,
               "device": rounds["new"][0]["device"], "rounds": rounds}
    print(f"median steps/s: old {med['old']:.3f}, new {med['new']:.3f}; ratio new/old {summary['ratio']:.2f}x (median of "
          f"the rounds' ratios {paired:.2f}x); "
          f"compile old {comp['old']:.1f} s, new {comp['new']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
