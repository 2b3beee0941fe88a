"""`confluence bench serve`: latency and throughput of the prediction service under concurrent clients.

Starts `confluence serve` in a child process (the real server, as a user runs it), waits until it is ready,
then per client count fires `requests` real HTTP requests (`POST /predict`, each with `anchors_per_request`
anchors of the task's seeds and their observation times) from that many threads over keep-alive connections.
Reports requests/s, anchors/s, latency percentiles and the server's own batching counters (model calls, requests
per model call)."""

from __future__ import annotations

import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from confluence.errors import ConfluenceError
from confluence.evaluation.predict import anchor_keys
from confluence.store import Store
from confluence.store.format import NO_CUTOFF


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request_bodies(db: Path, task: str, n: int, per_request: int) -> list[dict[str, Any]]:
    """`n` request bodies, each with `per_request` anchors: the task's seeds spread evenly over its seed arrays
    (key and observation time; no time where the seed has no cut-off)."""
    store = Store.open(db)
    info = store.task(task)
    arrays = store.task_arrays(task)
    total = n * per_request
    ids = np.linspace(0, len(arrays.anchor_row) - 1, total).astype(np.int64)
    rows, obs = np.asarray(arrays.anchor_row)[ids], np.asarray(arrays.obs_time)[ids]
    keys = anchor_keys(store, info.anchor_table, rows).to_pylist()
    times = [None if t == NO_CUTOFF else np.datetime64(int(t), "us").astype(str) for t in obs.tolist()]
    anchors = [{"key": k} if t is None else {"key": k, "observation_time": t} for k, t in zip(keys, times, strict=True)]
    return [{"task": task, "anchors": anchors[i * per_request: (i + 1) * per_request]} for i in range(n)]


class _Conn:
    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        self.conn.request(method, path, body=data, headers={"content-type": "application/json"})
        r = self.conn.getresponse()
        return r.status, json.loads(r.read())


def _wait_ready(proc: subprocess.Popen, port: int, errlog: IO[str], timeout: float = 300.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            errlog.seek(0)
            raise ConfluenceError(f"the server exited with status {proc.returncode}: {errlog.read().strip()}")
        try:
            status, body = _Conn(port).call("GET", "/health")
            if status == 200:
                return body
        except (OSError, http.client.HTTPException, json.JSONDecodeError):
            pass
        time.sleep(0.2)
    raise ConfluenceError(f"the server was not ready after {timeout:.0f} s")


def _level(port: int, bodies: list[dict], clients: int) -> dict[str, Any]:
    """Send `bodies` from `clients` threads (one keep-alive connection each); wall time and every latency."""
    lat = np.zeros(len(bodies))
    status: list[int] = [0] * len(bodies)
    barrier = threading.Barrier(clients + 1)

    def client(t: int) -> None:
        conn = _Conn(port)
        barrier.wait()
        for i in range(t, len(bodies), clients):
            t0 = time.perf_counter()
            status[i], _ = conn.call("POST", "/predict", bodies[i])
            lat[i] = time.perf_counter() - t0

    threads = [threading.Thread(target=client, args=(t,)) for t in range(clients)]
    for th in threads:
        th.start()
    _, before = _Conn(port).call("GET", "/health")
    barrier.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    _, after = _Conn(port).call("GET", "/health")
    bad = [s for s in status if s != 200]
    if bad:
        raise ConfluenceError(f"{len(bad)} of {len(bodies)} requests failed (HTTP {sorted(set(bad))})")
    anchors = sum(len(b["anchors"]) for b in bodies)
    calls = after["stats"]["model_calls"] - before["stats"]["model_calls"]
    return {
        "clients": clients, "requests": len(bodies), "anchors": anchors, "seconds": wall,
        "requests_per_s": len(bodies) / wall, "anchors_per_s": anchors / wall,
        "latency_ms": {"p50": 1e3 * float(np.percentile(lat, 50)), "p90": 1e3 * float(np.percentile(lat, 90)),
                       "p99": 1e3 * float(np.percentile(lat, 99)), "mean": 1e3 * float(lat.mean()),
                       "max": 1e3 * float(lat.max())},
        "model_calls": calls, "requests_per_model_call": len(bodies) / max(calls, 1),
    }


def bench_serve(checkpoint: Path, db: Path, *, task: str | None = None, clients: tuple[int, ...] = (1, 8),
                requests: int = 200, anchors_per_request: int = 1, batch_size: int | None = None,
                max_wait_ms: float = 5.0, warmup: int = 10, draws: int | None = None,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Start the server, measure each client count in turn (after `warmup` requests), stop the server."""
    if requests < 1 or anchors_per_request < 1 or any(c < 1 for c in clients):
        raise ConfluenceError("requests, anchors per request and client counts must be 1 or more")
    load_start = os.getloadavg()[0]
    store = Store.open(db)
    task = task or store.tasks[0].name
    store.task(task)
    bodies = request_bodies(db, task, requests + warmup, anchors_per_request)
    port = _free_port()
    cmd = [sys.executable, "-m", "confluence.cli.main", "serve", "--checkpoint", str(checkpoint), "--db", str(db),
           "--port", str(port), "--max-wait-ms", str(max_wait_ms), "--log-level", "warning"]
    if batch_size is not None:
        cmd += ["--batch-size", str(batch_size)]
    if draws is not None:
        cmd += ["--draws", str(draws)]
    log(f"starting: {' '.join(cmd[2:])}")
    t0 = time.perf_counter()
    errlog = tempfile.TemporaryFile("w+")  # the server's stderr, read back if it fails (a pipe could fill up)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errlog, text=True)
    try:
        health = _wait_ready(proc, port, errlog)
        startup = time.perf_counter() - t0
        log(f"ready after {startup:.1f} s (batch size {health['batch_size']}, max wait {health['max_wait_ms']} ms, "
            f"{health['draws']} context draw(s) per anchor)")
        _level(port, bodies[:warmup], 1)  # compiles the shapes the measured requests need
        levels = []
        for c in clients:
            r = _level(port, bodies[warmup:], c)
            levels.append(r)
            log(f"{c} client(s): {r['requests_per_s']:.1f} requests/s, {r['anchors_per_s']:.1f} anchors/s, "
                f"latency p50 {r['latency_ms']['p50']:.1f} ms, p99 {r['latency_ms']['p99']:.1f} ms, "
                f"{r['requests_per_model_call']:.2f} requests per model call")
        _, card = _Conn(port).call("GET", "/model")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        errlog.close()
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "loadavg_1min": [load_start, os.getloadavg()[0]],  # other jobs on the machine, at start and end
        "task": task, "anchors_per_request": anchors_per_request, "batch_size": health["batch_size"],
        "max_wait_ms": max_wait_ms, "draws": health["draws"], "startup_s": startup, "checkpoint_step": card["step"],
        "parameters": card["parameters"], "store": card["store"]["name"], "levels": levels,
    }
