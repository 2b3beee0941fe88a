"""The sampler benchmark behind `confluence bench sampler`: sequences/s, cells/s, slots/s, per-phase times."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np

from confluence.sampler.builder import PHASES
from confluence.sampler.config import SamplerConfig
from confluence.sampler.data import SamplerData
from confluence.sampler.sampler import Sampler


def run_bench(data: SamplerData, config: SamplerConfig, batches: int = 50, warmup: int = 3) -> dict[str, Any]:
    """Time `batches` training batches of one training stream.

    With `threads` > 1 the stream builds whole batches concurrently (one per worker), so a phase's `seconds`
    are the sum of its wall time over the builds, which overlap: they add up to about `threads` x the elapsed
    time and `share` to about `threads`. `cpu_seconds` are CPU time either way.

    Untimed first: at least `warmup` batches and until every task was drawn once, so kernel compilation (or
    cache loading), the split hashing and the per-epoch seed shuffles (once per task and epoch in a real run)
    are not counted.
    """
    cfg = SamplerConfig(**{**config.__dict__, "batches_per_epoch": 10**9})
    with Sampler([data], cfg) as s:
        stream = s.batches("train", epoch=0)
        seen: set[tuple[int, int]] = set()
        want = {(e.db_idx, e.task.index) for e in s.entries if s.seed_ids("train", e.task.name, e.db_idx).size}
        for i, b in enumerate(stream):
            seen.add((b.db_idx, b.task_idx))
            if i + 1 >= warmup and (seen >= want or i >= 20 * max(warmup, 1)):
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
            b = next(stream)
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
        "config": {"batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "width": cfg.width,
                   "max_rows": cfg.max_rows, "threads": cfg.threads, "seed": cfg.seed,
                   "tasks": list(cfg.tasks) if cfg.tasks else None},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }
