"""Text-embedding throughput of the default frozen text encoder (goal: >= 50,000 short strings/s on 2 cores).

    PYTHONPATH=$PWD python benchmarks/bench_text_encoder.py [--n 200000] [--repeats 3] [--json FILE]

Same as `confluence bench text-encoder`; the measurement itself lives in `confluence.textenc.bench`.
"""

from __future__ import annotations

import argparse
import json
import sys

from confluence.textenc.bench import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200_000, help="number of distinct short strings")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    args = parser.parse_args()
    res = run(n=args.n, repeats=args.repeats, log=lambda m: print(m, file=sys.stderr))
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
