"""Batching on the device: several requests' anchors in one model call, each request's answer unchanged.

A request's sequences are built exactly as `Predictor.anchor_outputs` builds them (anchor `i` of the request is
seed `i` of its own ad-hoc task, so the sampler's random walk for it is the one `confluence predict --anchors`
takes for the same file; a labelled context shows every label known by the anchor's time). Only then are the valid sequences of several requests packed into one batch of the
predictor's batch size (`merge_sequences`) for a single forward pass, and the outputs split back per request. So a
request's predictions do not depend on what else was in the batch (up to float rounding, since shapes differ).

`Batcher` is the one thread that owns the `Predictor` (JAX calls never run concurrently on it): it waits for a
request, gathers whatever else arrives within `max_wait_s` (or until a batch is full), and answers them all.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from confluence.batch import TrainingBatch
from confluence.inference.draws import combine_draws
from confluence.inference.predictor import HeadOutputs, Predictor
from confluence.sampler.config import bucket_size
from confluence.stypes import SemanticType

log = logging.getLogger("confluence.serving")

_TEXT = int(SemanticType.TEXT)
# the labelled context of new anchors, as `Predictor.anchor_outputs` builds it: every label known by their time
ANCHOR_CONTEXT = "all"
_SPECIAL = {"fk_adj", "text_batch_embeddings", "text_embed_ids", "seq_valid"}


def merge_sequences(parts: list[tuple[TrainingBatch, int, int]], batch_size: int,
                    text_buckets: tuple[int, ...]) -> TrainingBatch:
    """One batch of `batch_size` sequences from sequences `a:b` of each part (valid ones, same task): per-sequence
    arrays concatenated, row adjacency padded to the largest row bucket, the parts' text tables joined (ids
    re-based) and padded to a text bucket; filler sequences (copies of the first, `seq_valid` False) after them."""
    first = parts[0][0]
    n = sum(b - a for _, a, b in parts)
    if not 0 < n <= batch_size:
        raise ValueError(f"cannot merge {n} sequences into a batch of {batch_size}")
    fill = batch_size - n

    def seq(x: list[np.ndarray]) -> np.ndarray:
        x = np.concatenate(x, axis=0)
        return np.concatenate([x, np.repeat(x[:1], fill, axis=0)], axis=0) if fill else x

    values: dict[str, Any] = {}
    for f in dataclasses.fields(TrainingBatch):
        v = getattr(first, f.name)
        if f.name in _SPECIAL:
            continue
        if isinstance(v, np.ndarray):
            if any(getattr(p, f.name).shape[0] != p.batch_size for p, _, _ in parts):
                raise ValueError(f"batch field {f.name!r} is not per sequence; merge_sequences does not know it")
            values[f.name] = seq([getattr(p, f.name)[a:b] for p, a, b in parts])
        elif any(getattr(p, f.name) != v for p, _, _ in parts):
            raise ValueError(f"batches of different {f.name} cannot be merged")
        else:
            values[f.name] = v
    r_pad = max(p.fk_adj.shape[1] for p, _, _ in parts)
    adj = []
    for p, a, b in parts:
        x = np.zeros((b - a, r_pad, r_pad), np.bool_)
        r = p.fk_adj.shape[1]
        x[:, :r, :r] = p.fk_adj[a:b]
        adj.append(x)
    values["fk_adj"] = seq(adj)
    ids_out, tables, used_total = [], [], 0
    for p, a, b in parts:
        ids = np.array(p.text_embed_ids[a:b], copy=True)
        text = (p.semantic_types[a:b] == _TEXT) & ~p.is_null[a:b]
        used = np.unique(ids[text])
        ids[text] = (used_total + np.searchsorted(used, ids[text])).astype(ids.dtype)
        ids_out.append(ids)
        tables.append(p.text_batch_embeddings[used])
        used_total += len(used)
    values["text_embed_ids"] = seq(ids_out)
    text_table = np.zeros((bucket_size(used_total, text_buckets), first.text_batch_embeddings.shape[1]),
                          first.text_batch_embeddings.dtype)
    text_table[:used_total] = np.concatenate(tables, axis=0)
    values["text_batch_embeddings"] = text_table
    values["seq_valid"] = np.arange(batch_size) < n
    return TrainingBatch(**values)


def batch_shapes(predictor: Predictor) -> list[tuple[int, int]]:
    """Every (rows R, text rows U) a batch of this predictor can have: the row buckets up to `max_rows` and the
    text buckets up to one text per cell or every text of the store. Each is a separate compilation."""
    cfg = predictor.stream.config
    rows = sorted({bucket_size(n, cfg.row_buckets, cap=cfg.max_rows) for n in range(1, cfg.max_rows + 1)})
    texts = int(predictor.store.text_embeddings.shape[0])
    most = bucket_size(min(cfg.batch_size * cfg.seq_len, texts), cfg.text_buckets)
    texts = sorted({b for b in cfg.text_buckets if b < most} | {most})
    return [(r, u) for r in rows for u in texts]


def batch_shape(batch: TrainingBatch) -> tuple[int, int]:
    """(rows R, text rows U) of a built batch."""
    return int(batch.fk_adj.shape[1]), int(batch.text_batch_embeddings.shape[0])


def reshaped(batch: TrainingBatch, rows: int, texts: int) -> TrainingBatch:
    """`batch` with its row adjacency and text table cut or zero-padded to R = `rows`, U = `texts`: a batch of
    that shape to compile the model for (its outputs mean nothing once cut)."""
    adj = np.zeros((batch.batch_size, rows, rows), np.bool_)
    r = min(rows, batch.fk_adj.shape[1])
    adj[:, :r, :r] = batch.fk_adj[:, :r, :r]
    text = np.zeros((texts, batch.text_batch_embeddings.shape[1]), batch.text_batch_embeddings.dtype)
    u = min(texts, batch.text_batch_embeddings.shape[0])
    text[:u] = batch.text_batch_embeddings[:u]
    return dataclasses.replace(batch, fk_adj=adj, text_batch_embeddings=text)


def _concat(parts: list[HeadOutputs]) -> HeadOutputs:
    return HeadOutputs(*(np.concatenate([getattr(p, f.name) for p in parts], axis=0)
                         for f in dataclasses.fields(HeadOutputs)))


@dataclass
class Stats:
    """What the batcher did: requests and anchors answered, model calls (forward passes), rounds (times the worker
    took queued requests), model calls that held more than one request's anchors, the most requests taken in one
    round, requests that failed on the server's side."""

    requests: int = 0
    anchors: int = 0
    model_calls: int = 0
    rounds: int = 0
    merged_calls: int = 0
    max_requests_per_round: int = 0
    errors: int = 0


class Unavailable(RuntimeError):
    """The service is shutting down (or its worker is not running): the request was not answered (HTTP 503)."""


class _Run:
    """One request's sequences in progress: `draws` passes over its anchors (anchor `i` is seed `i` of its own
    ad-hoc task, draw `e` the sampler's epoch `e`), built one sampler batch at a time as the worker takes them,
    and the head outputs gathered back in order."""

    def __init__(self, predictor: Predictor, task: str, rows: np.ndarray, obs: np.ndarray,
                 context: str = ANCHOR_CONTEXT):
        self.task = task
        self.context = context
        self._predictor = predictor
        self._custom = predictor.stream.sampler.anchor_task(task, rows, obs)
        self._ids = np.arange(len(rows), dtype=np.int64)
        self.left = len(rows) * predictor.draws  # sequences not yet taken into a pass
        self.since = time.monotonic()
        self._pieces: list[list[HeadOutputs]] = [[] for _ in range(predictor.draws)]
        self._epoch, self._gen = -1, None
        self._batch: TrainingBatch | None = None
        self._at = self._valid = 0

    def take(self, n: int) -> list[tuple[_Run, int, TrainingBatch, int, int]]:
        """The next `n` sequences: (this run, draw, built batch, first, end) per piece of a built batch."""
        out = []
        while n > 0:
            if self._at == self._valid:
                self._next_batch()
            k = min(n, self._valid - self._at)
            out.append((self, self._epoch, self._batch, self._at, self._at + k))
            self._at += k
            n -= k
            self.left -= k
        return out

    def _next_batch(self) -> None:
        while True:
            if self._gen is None:
                self._epoch += 1
                self._gen = self._predictor.stream.ordered(self._custom, self._ids, epoch=self._epoch,
                                                           context=self.context)
            batch = next(self._gen, None)
            if batch is not None:
                self._batch, self._at, self._valid = batch, 0, int(batch.seq_valid.sum())
                return
            self._gen = None

    def put(self, draw: int, out: HeadOutputs) -> None:
        self._pieces[draw].append(out)

    def outputs(self) -> HeadOutputs:
        """Its head outputs, the draws combined (once every sequence is answered)."""
        return combine_draws([_concat(p) for p in self._pieces])

    def close(self) -> None:
        """Stop its batch stream (a run abandoned half way leaves no producer behind)."""
        if self._gen is not None:
            self._gen.close()
            self._gen = None


def pass_shares(left: list[int], slots: int) -> list[int]:
    """Sequences each request gets in one forward pass of `slots`, `left` its sequences still to run, oldest
    first: the oldest gets at least a quarter of the pass (so a large request keeps going under a stream of small
    ones), the rest go smallest-remaining-first (so a one-anchor request beside a 1,000-anchor one is answered in
    the next pass)."""
    share = [0] * len(left)
    if not left:
        return share
    share[0] = min(left[0], max(slots // 4, 1))
    free = slots - share[0]
    for i in sorted(range(len(left)), key=lambda i: (left[i], i)):
        give = min(left[i] - share[i], free)
        share[i] += give
        free -= give
    return share


def _one_pass(predictor: Predictor, runs: list[_Run], stats: Stats | None) -> None:
    """One forward pass over runs of one task (oldest first), filled by `pass_shares`; outputs put back per run."""
    parts = [p for run, n in zip(runs, pass_shares([r.left for r in runs], predictor.batch_size), strict=True)
             if n for p in run.take(n)]
    _, _, first, a, b = parts[0]
    if len(parts) == 1 and a == 0 and b == int(first.seq_valid.sum()):
        batch = first
    else:
        batch = merge_sequences([(bt, lo, hi) for _, _, bt, lo, hi in parts], predictor.batch_size,
                                tuple(predictor.stream.config.text_buckets))
    out = predictor.forward(batch)
    lo = 0
    for run, draw, _, a, b in parts:
        run.put(draw, HeadOutputs(*(getattr(out, f.name)[lo: lo + b - a] for f in dataclasses.fields(HeadOutputs))))
        lo += b - a
    if stats is not None:
        stats.model_calls += 1
        stats.merged_calls += len({id(p[0]) for p in parts}) > 1


def head_outputs(predictor: Predictor, task: str, anchors: list[tuple[np.ndarray, np.ndarray]],
                 stats: Stats | None = None, context: str = ANCHOR_CONTEXT) -> list[HeadOutputs]:
    """Head outputs for several requests of one task, [(anchor rows, observation times)] each, in shared forward
    passes (scheduled as the worker schedules them); each equals `predictor.anchor_outputs(task, rows, obs,
    context=context)` (up to float rounding where merged), its `predictor.draws` contexts per anchor combined the
    same way."""
    runs = [_Run(predictor, task, rows, obs, context) for rows, obs in anchors]
    try:
        while any(r.left for r in runs):
            _one_pass(predictor, [r for r in runs if r.left], stats)
    finally:
        for r in runs:
            r.close()
    return [r.outputs() for r in runs]


@dataclass(eq=False)
class Job:
    """One request's anchors, handed to the batcher; `finish(outputs)` turns the head outputs into the answer
    (run on the batcher's thread), whose result or error lands in `future`."""

    task: str
    rows: np.ndarray
    obs: np.ndarray
    finish: Callable[[HeadOutputs], Any]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    context: str = ANCHOR_CONTEXT  # the labels its contexts may read (`confluence.sampler.labels.CONTEXT_SPLITS`)


_STOP = object()


class Batcher:
    """The thread that owns a `Predictor`. It takes queued jobs (after the first, up to `max_wait_s` for more to
    fill a batch) and runs the jobs in progress one forward pass at a time: each pass holds one task's sequences
    of several jobs (`pass_shares`: smallest-remaining-first, the oldest at least a quarter; tasks in turn), and
    new jobs join between passes, so a small request is not stuck behind a large one. `stop()` / `stop_after()`
    end it between passes; jobs not answered by then get `Unavailable`."""

    def __init__(self, predictor: Predictor, *, max_wait_s: float = 0.005,
                 warm_up: Callable[[], None] | None = None):
        self.predictor = predictor
        self.max_wait_s = max_wait_s
        self.stats = Stats()
        self.ready = threading.Event()
        self.stopping = threading.Event()  # shutdown has begun; a long warm-up checks it between compilations
        self._stop_at = float("inf")  # monotonic time after which the worker answers nothing more
        self._warm_up = warm_up
        self._queue: queue.Queue = queue.Queue()
        self._active: list[tuple[Job, _Run]] = []  # jobs in progress, oldest first
        self._turn = 0  # which task's jobs the next pass serves (tasks in turn)
        self._task = ""
        self._taken = 0
        self._thread = threading.Thread(target=self._loop, name="confluence-batcher", daemon=True)
        self.failed: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> concurrent.futures.Future:
        if not self._thread.is_alive() or time.monotonic() >= self._stop_at:
            job.future.set_running_or_notify_cancel()
            job.future.set_exception(Unavailable("the prediction service is shutting down"
                                                 if self.stopping.is_set() else
                                                 "the prediction worker is not running"))
        else:
            self._queue.put(job)
        return job.future

    def stop_after(self, seconds: float) -> None:
        """Begin shutting down: jobs in progress or queued get `seconds` more to be answered; then the worker stops
        between passes and every job left gets `Unavailable`. Safe from a signal handler (it only sets flags)."""
        self._stop_at = min(self._stop_at, time.monotonic() + max(seconds, 0.0))
        self.stopping.set()
        self._queue.put(_STOP)  # wakes an idle worker

    def stop(self, timeout: float = 30.0) -> None:
        """Stop now: the worker ends after its current forward pass; jobs not answered get `Unavailable`."""
        self.stop_after(0.0)
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._refuse_queued()

    def pending(self) -> int:
        """Requests queued or in progress."""
        return self._queue.qsize() + len(self._active)

    def _loop(self) -> None:
        try:
            if self._warm_up is not None:
                self._warm_up()
        except BaseException as exc:  # noqa: BLE001 - reported by /health; requests still get an error each
            log.exception("warm-up failed")
            self.failed = exc
        self.ready.set()
        try:
            while self._take(block=not self._active):
                if time.monotonic() >= self._stop_at:
                    break
                if self._active and self._gather():
                    self._pass()
        finally:
            for job, run in self._active:
                run.close()
                if not job.future.done():
                    job.future.set_exception(Unavailable("the prediction service is shutting down"))
            self._active.clear()
            self._refuse_queued()

    def _admit(self, item: Any) -> bool:
        """A queued item into progress (a gone client's job is skipped); False for the stop sentinel once the
        stop time has come."""
        if item is _STOP:
            return time.monotonic() < self._stop_at
        if item.future.set_running_or_notify_cancel():
            try:
                self._active.append((item, _Run(self.predictor, item.task, item.rows, item.obs, item.context)))
            except Exception as exc:  # noqa: BLE001 - that request gets the error
                self._fail([item], exc)
            self._taken += 1
        return True

    def _take(self, block: bool) -> bool:
        """Whatever is queued into progress (when `block`, after waiting for one item). False once told to stop."""
        self._taken = 0
        try:
            if block and not self._admit(self._queue.get()):
                return False
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    return True
                if not self._admit(item):
                    return False
        finally:
            self._count_round()

    def _count_round(self) -> None:
        if self._taken:
            self.stats.rounds += 1
            self.stats.max_requests_per_round = max(self.stats.max_requests_per_round, self._taken)

    def _gather(self) -> bool:
        """Choose the next pass's task (tasks in turn) and, while its requests hold less than a pass and the oldest
        of them has waited less than `max_wait_s`, wait for more to join. False once told to stop."""
        tasks = list(dict.fromkeys(job.task for job, _ in self._active))
        self._task = tasks[self._turn % len(tasks)]
        self._turn += 1
        deadline = min(run.since for job, run in self._active if job.task == self._task) + self.max_wait_s
        self._taken = 0
        try:
            while sum(run.left for job, run in self._active if job.task == self._task) < self.predictor.batch_size:
                try:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
                if not self._admit(item):
                    return False
            return True
        finally:
            self._count_round()

    def _pass(self) -> None:
        """One forward pass for the requests in progress of the chosen task; finished requests are answered."""
        task = self._task
        group = [(job, run) for job, run in self._active if job.task == task]
        if not group:
            return
        try:
            _one_pass(self.predictor, [run for _, run in group], self.stats)
        except Exception as exc:  # noqa: BLE001 - every request in the pass's task gets the error
            log.exception("model call failed for task %s", task)
            self._fail([job for job, _ in group], exc)
            return
        for job, run in group:
            if run.left == 0:
                self._active = [p for p in self._active if p[1] is not run]
                run.close()
                try:
                    job.future.set_result(job.finish(run.outputs()))
                except Exception as exc:  # noqa: BLE001
                    log.exception("post-processing failed for task %s", task)
                    self.stats.errors += 1
                    job.future.set_exception(exc)
                else:
                    self.stats.requests += 1
                    self.stats.anchors += len(job.rows)

    def _fail(self, jobs: list[Job], exc: BaseException) -> None:
        for job in jobs:
            for _, run in [p for p in self._active if p[0] is job]:
                run.close()
            self._active = [p for p in self._active if p[0] is not job]
            self.stats.errors += 1
            job.future.set_exception(exc)

    def _refuse_queued(self) -> None:
        while True:  # anything that slipped in after the stop is refused, not left waiting
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP and item.future.set_running_or_notify_cancel():
                item.future.set_exception(Unavailable("the prediction service is shutting down"))
