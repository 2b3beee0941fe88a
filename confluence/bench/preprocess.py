"""`confluence bench preprocess`: wall time, CPU time and peak memory of preprocessing nycflights13 and TPC-H.

Each preprocessing run is a child process (`confluence preprocess ... --quiet`) whose peak RSS comes from
`os.wait4`, so the figures are those of one run and include DuckDB, Arrow and the memory-mapped pages it wrote.
TPC-H Parquet is generated offline with `tpchgen-cli` (the `bench` extra) when its directory does not exist yet.
Text-embedding throughput has its own benchmark (`confluence bench text-encoder`).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from confluence.errors import ConfluenceError
from confluence.synth.tpch import ensure_tpch, tpch_metadata_path


def run_child(cmd: list[str]) -> dict[str, float]:
    """Run `cmd`, return wall seconds, peak RSS (MiB) and CPU seconds of that process alone."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise ConfluenceError(f"command failed ({code}): {' '.join(cmd)}\n{out[-2000:]}")
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}


def preprocess_bench(name: str, source: Path, metadata: Path, out: Path, memory_limit_mb: int,
                     threads: int | None) -> dict:
    """Preprocess one database in a child process; its figures plus the store's size."""
    from confluence.store import Store

    cmd = [sys.executable, "-m", "confluence.cli.main", "preprocess", str(source), "--metadata", str(metadata),
           "--out", str(out), "--quiet", "--memory-limit-mb", str(memory_limit_mb)]
    if threads:
        cmd += ["--threads", str(threads)]
    fig: dict = run_child(cmd)
    store = Store.open(out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    fig.update({"dataset": name, "rows": store.num_rows, "columns": store.num_columns,
                "edges": store.meta["graph"]["num_parent_edges"], "texts": store.meta["num_texts"],
                "tasks": len(store.tasks), "store_mib": round(size / 2**20, 1),
                "rows_per_s": round(store.num_rows / fig["wall_s"])})
    return fig


def bench_preprocess(work: Path, *, tpch_dir: Path | None = None, tpch_scale: float = 1.0, skip_tpch: bool = False,
        memory_limit_mb: int = 2048, threads: int | None = None,
        log: Callable[[dict], None] = lambda _row: None) -> dict:
    """Preprocess nycflights13 (and TPC-H at `tpch_scale` unless `skip_tpch`) under `work`; the figures as a dict."""
    from confluence.demo import demo_metadata_path, demo_source_dir

    work.mkdir(parents=True, exist_ok=True)
    results = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": platform.node(),
               "cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
               "memory_limit_mb": memory_limit_mb, "runs": []}
    flights = demo_source_dir(work / "data")
    results["runs"].append(preprocess_bench("nycflights13", flights, demo_metadata_path(), work / "store_nycflights13",
                                            memory_limit_mb, threads))
    log(results["runs"][-1])
    if not skip_tpch:
        tpch = ensure_tpch(tpch_dir or work / f"tpch-sf{tpch_scale:g}", tpch_scale)
        results["runs"].append(preprocess_bench(f"tpch-sf{tpch_scale:g}", tpch, tpch_metadata_path(),
                                                work / "store_tpch", memory_limit_mb, threads))
        log(results["runs"][-1])
    results["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results
