"""How many threads native libraries may use: the CPUs the process is given, not the machine's (DuckDB's workers),
and of those the ones other work leaves free (LightGBM's OpenMP threads).

With more threads than free cores and OpenMP's default spin-waiting, each of LightGBM's many parallel regions per
round waits for a thread the scheduler has parked behind another process, spinning on the core that thread needs:
LightGBM's rounds that took 9 s on a quiet 2-core box took 71 s beside one busy process (docs/design/evaluation.md,
"LightGBM beside other work")."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (`taskset`, a container's cpuset), capped by a cgroup v2
    CPU quota (`cpu.max`, a container's `--cpus`) when one is set; at least 1. Not `os.cpu_count()`, which counts
    the machine's CPUs whatever the process is allowed."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            n = min(n, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, n)


def _busy_jiffies(cpus: set[int]) -> int:
    """Jiffies the CPUs in `cpus` spent working (not idle, not waiting for I/O) since boot (/proc/stat)."""
    total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *fields = line.split()
            if int(name[3:]) in cpus:
                v = [int(x) for x in fields[:8]]
                total += sum(v) - v[3] - v[4]  # all but idle and iowait
    return total


def _own_jiffies() -> int:
    """Jiffies this process has run (user + system, all its threads; /proc/self/stat)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def free_cpus(interval: float = 0.25) -> int:
    """The usable CPUs (`usable_cpus`) that other processes are not keeping busy right now, measured over
    `interval` seconds from the kernel's counters (this process's own work does not count); at least 1.

    Why: LightGBM's OpenMP threads meet at a barrier many times per round; with more threads than free cores one
    of them waits for a core another process holds while its partners spin, and a fit beside one busy process took
    4-8x its time alone (docs/design/evaluation.md, "LightGBM beside other work"). As many threads as free cores keeps the
    fit fast when the machine is quiet and steady when it is not. Not Linux: `usable_cpus()`."""
    usable = usable_cpus()
    try:
        cpus = set(os.sched_getaffinity(0))
        busy0, own0 = _busy_jiffies(cpus), _own_jiffies()
        time.sleep(interval)
        busy1, own1 = _busy_jiffies(cpus), _own_jiffies()
    except (AttributeError, OSError, ValueError, IndexError):
        return usable
    others = max(0, (busy1 - busy0) - (own1 - own0)) / (interval * os.sysconf("SC_CLK_TCK"))
    return max(1, min(usable, round(usable - others)))
