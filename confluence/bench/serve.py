"""`confluence bench serve`: latency and throughput of the prediction service under concurrent clients.

Starts `confluence serve` in a child process (the real server, as a user runs it; with `server_repo`, the
`confluence` package of another checkout, to compare two versions in one run), waits until it is ready,
then per client count fires `requests` real HTTP requests (`POST /predict`, each with `anchors_per_request`
anchors of the task's seeds and their observation times) from that many threads over keep-alive connections.
Reports requests/s, anchors/s, latency percentiles and the server's own batching counters (model calls, requests
per model call). `mixed`: one-anchor clients beside clients sending large requests back to back, reporting the
small requests' latency, errors, /health's latency and the server process's memory (VmRSS) before and after."""

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


def server_rss_mb(pid: int) -> dict[str, float | None]:
    """The process's resident memory now (VmRSS) and its peak (VmHWM), in MB, from /proc/PID/status (None where
    there is no /proc)."""
    out: dict[str, float | None] = {"rss_mb": None, "peak_rss_mb": None}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out["rss_mb" if name == "VmRSS" else "peak_rss_mb"] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def _code_of(repo: Path | None) -> str:
    """The checkout whose code the server runs: its path and commit (this package's own checkout by default)."""
    root = Path(repo) if repo is not None else Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "confluence"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return str(root)
    return f"{root} @ {commit or '?'}{' (modified)' if dirty else ''}"


def _mixed(port: int, small: list[dict], large: dict, clients: int, large_clients: int, large_requests: int,
           pid: int) -> dict[str, Any]:
    """`large_clients` threads each send `large` `large_requests` times back to back; meanwhile `clients` threads
    send one-anchor requests (cycling through `small`) back to back and one thread polls /health, until the large
    ones are answered: the latencies, errors, and the server's memory before and after."""
    lat_small: list[float] = []
    lat_large: list[float] = []
    lat_health: list[float] = []
    errors: dict[str, dict[str, int]] = {"small": {}, "large": {}}
    done = threading.Event()
    lock = threading.Lock()

    def send(conn: _Conn, kind: str, body: dict, out: list[float]) -> _Conn:
        t0 = time.perf_counter()
        try:
            status, _ = conn.call("POST", "/predict", body)
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
            status, conn = type(exc).__name__, _Conn(port)
        with lock:
            if status == 200:
                out.append(time.perf_counter() - t0)
            else:
                what = f"HTTP {status}" if isinstance(status, int) else status
                errors[kind][what] = errors[kind].get(what, 0) + 1
        return conn

    def small_client(t: int) -> None:
        conn, i = _Conn(port), t
        while not done.is_set():
            conn = send(conn, "small", small[i % len(small)], lat_small)
            i += clients

    def large_client() -> None:
        conn = _Conn(port)
        for _ in range(large_requests):
            conn = send(conn, "large", large, lat_large)

    def health() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            try:
                _Conn(port).call("GET", "/health")
                lat_health.append(time.perf_counter() - t0)
            except (OSError, http.client.HTTPException, json.JSONDecodeError):
                pass
            time.sleep(0.05)

    memory_before = server_rss_mb(pid)
    t0 = time.perf_counter()
    larges = [threading.Thread(target=large_client) for _ in range(large_clients)]
    for th in larges:
        th.start()
    time.sleep(0.5)  # the large requests are under way before the small ones come
    others = [threading.Thread(target=small_client, args=(t,)) for t in range(clients)]
    others.append(threading.Thread(target=health))
    for th in others:
        th.start()
    for th in larges:
        th.join()
    done.set()
    for th in others:
        th.join()
    wall = time.perf_counter() - t0
    memory_after = server_rss_mb(pid)

    def ms(x: list[float]) -> dict[str, float | None]:
        if not x:
            return {"p50": None, "p99": None, "max": None}
        a = np.asarray(x)
        return {"p50": 1e3 * float(np.percentile(a, 50)), "p99": 1e3 * float(np.percentile(a, 99)),
                "max": 1e3 * float(a.max())}

    return {"clients": clients, "large_clients": large_clients, "large_anchors": len(large["anchors"]),
            "seconds": wall, "small_answered": len(lat_small), "small_requests_per_s": len(lat_small) / wall,
            "small_latency_ms": ms(lat_small), "large_answered": len(lat_large), "large_latency_ms": ms(lat_large),
            "health_latency_ms": ms(lat_health), "health_polls": len(lat_health), "errors": errors,
            "memory_before": memory_before, "memory_after": memory_after}


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
                max_wait_ms: float = 5.0, warmup: int = 10, draws: int | None = None, mixed: bool = False,
                large_anchors: int = 1000, large_clients: int = 1, large_requests: int = 2,
                server_repo: Path | None = None,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Start the server, measure each client count in turn (after `warmup` requests), stop the server. `mixed`:
    each client count sends one-anchor requests (cycling through `requests` of them) while `large_clients`
    clients send `large_requests` requests of `large_anchors` anchors each (`_mixed`). `server_repo`: run the server from that checkout's `confluence` package."""
    if requests < 1 or anchors_per_request < 1 or large_anchors < 1 or large_clients < 1 or large_requests < 1 or \
            any(c < 1 for c in clients):
        raise ConfluenceError("requests, anchors per request and client counts must be 1 or more")
    if server_repo is not None and not (Path(server_repo) / "confluence" / "__init__.py").is_file():
        raise ConfluenceError(f"--server-repo {server_repo}: not a checkout holding the confluence package")
    load_start = os.getloadavg()[0]
    store = Store.open(db)
    task = task or store.tasks[0].name
    store.task(task)
    per_request = 1 if mixed else anchors_per_request
    bodies = request_bodies(db, task, requests + warmup, per_request)
    large = request_bodies(db, task, 1, large_anchors)[0] if mixed else {}
    port = _free_port()
    # -P: the working directory is not put first on the path, so PYTHONPATH=server_repo decides the package
    python = [sys.executable, "-m"] if server_repo is None else [sys.executable, "-P", "-m"]
    cmd = [*python, "confluence.cli.main", "serve", "--checkpoint", str(checkpoint), "--db", str(db),
           "--port", str(port), "--max-wait-ms", str(max_wait_ms), "--log-level", "warning"]
    if mixed:
        cmd += ["--max-anchors", str(max(large_anchors, 1000))]
    if batch_size is not None:
        cmd += ["--batch-size", str(batch_size)]
    if draws is not None:
        cmd += ["--draws", str(draws)]
    env = {k: v for k, v in os.environ.items() if k != "CONFLUENCE_SERVE_TOKEN"}  # a server of its own: no token
    if server_repo is not None:  # its package first on the path (before this one's installed copy)
        env["PYTHONPATH"] = os.pathsep.join([str(Path(server_repo).resolve()), *filter(None, [
            env.get("PYTHONPATH")])])
    code = _code_of(server_repo)
    log(f"starting: {' '.join(cmd[len(python):])} (code: {code})")
    t0 = time.perf_counter()
    errlog = tempfile.TemporaryFile("w+")  # the server's stderr, read back if it fails (a pipe could fill up)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errlog, text=True, env=env)
    try:
        health = _wait_ready(proc, port, errlog)
        startup = time.perf_counter() - t0
        version = _Conn(port).call("GET", "/openapi.json")[1]["info"]["version"]  # which package answers
        log(f"ready after {startup:.1f} s (confluence {version}, batch size {health['batch_size']}, max wait "
            f"{health['max_wait_ms']} ms, {health['draws']} context draw(s) per anchor)")
        _level(port, bodies[:warmup], 1)  # compiles the shapes the measured requests need
        levels = []
        if mixed:
            _level(port, [large], 1)  # and those of a large request
        for c in clients:
            if mixed:
                r = _mixed(port, bodies[warmup:], large, c, large_clients, large_requests, proc.pid)
                lat, hl = r["small_latency_ms"], r["health_latency_ms"]
                log(f"{c} one-anchor client(s) beside {large_clients} sending {large_anchors} anchors: "
                    f"{r['small_answered']} small answered in {r['seconds']:.1f} s, p50 {lat['p50'] or 0:.1f} ms, "
                    f"p99 {lat['p99'] or 0:.1f} ms, max {lat['max'] or 0:.1f} ms; {r['large_answered']} large "
                    f"answered; /health max {hl['max'] or 0:.1f} ms; errors "
                    f"{r['errors']}; RSS {r['memory_before']['rss_mb'] or 0:.0f} -> "
                    f"{r['memory_after']['rss_mb'] or 0:.0f} MB")
            else:
                r = _level(port, bodies[warmup:], c)
                log(f"{c} client(s): {r['requests_per_s']:.1f} requests/s, {r['anchors_per_s']:.1f} anchors/s, "
                    f"latency p50 {r['latency_ms']['p50']:.1f} ms, p99 {r['latency_ms']['p99']:.1f} ms, "
                    f"{r['requests_per_model_call']:.2f} requests per model call")
            levels.append(r)
        _, card = _Conn(port).call("GET", "/model")
    finally:
        proc.send_signal(signal.SIGTERM)
        t_stop = time.perf_counter()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stop_s = time.perf_counter() - t_stop
        errlog.close()
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "loadavg_1min": [load_start, os.getloadavg()[0]],  # other jobs on the machine, at start and end
        "server_code": code, "server_version": version, "mixed": mixed,
        "task": task, "anchors_per_request": per_request, "batch_size": health["batch_size"],
        "max_wait_ms": max_wait_ms, "draws": health["draws"], "startup_s": startup, "stop_s": stop_s,
        "checkpoint_step": card["step"], "parameters": card["parameters"], "store": card["store"]["name"],
        "levels": levels,
    }
