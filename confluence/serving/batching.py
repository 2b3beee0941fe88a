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
from confluence.evaluation.draws import combine_draws
from confluence.evaluation.inference import HeadOutputs, Predictor
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
    """What the batcher did: requests and anchors answered, model calls (forward passes), rounds (queue drains),
    model calls that held more than one request's anchors, the most requests in one round."""

    requests: int = 0
    anchors: int = 0
    model_calls: int = 0
    rounds: int = 0
    merged_calls: int = 0
    max_requests_per_round: int = 0
    errors: int = 0


def head_outputs(predictor: Predictor, task: str, anchors: list[tuple[np.ndarray, np.ndarray]],
                 stats: Stats | None = None) -> list[HeadOutputs]:
    """Head outputs for several requests of one task, [(anchor rows, observation times)] each, in shared forward
    passes; each equals `predictor.anchor_outputs(task, rows, obs)` (up to float rounding where merged), its
    `predictor.draws` contexts per anchor combined the same way."""
    bsz = predictor.batch_size
    sampler, stream = predictor.stream.sampler, predictor.stream
    draws = predictor.draws
    pieces: list[list[HeadOutputs]] = [[] for _ in range(len(anchors) * draws)]  # request j, draw e: j * draws + e
    pending: list[tuple[int, TrainingBatch, int, int]] = []
    filled = 0

    def flush() -> None:
        nonlocal filled
        whole = len(pending) == 1 and pending[0][2] == 0 and pending[0][3] == int(pending[0][1].seq_valid.sum())
        batch = pending[0][1] if whole else merge_sequences([(b, lo, hi) for _, b, lo, hi in pending], bsz,
                                                            tuple(stream.config.text_buckets))
        out = predictor.forward(batch)
        lo = 0
        for j, _, a, b in pending:
            pieces[j].append(HeadOutputs(*(getattr(out, f.name)[lo: lo + b - a]
                                           for f in dataclasses.fields(HeadOutputs))))
            lo += b - a
        if stats is not None:
            stats.model_calls += 1
            stats.merged_calls += len({j // draws for j, *_ in pending}) > 1
        pending.clear()
        filled = 0

    for j, (rows, obs) in enumerate(anchors):
        custom = sampler.anchor_task(task, rows, obs)
        for epoch in range(draws):
            for batch in stream.ordered(custom, np.arange(len(rows), dtype=np.int64), epoch=epoch,
                                        context=ANCHOR_CONTEXT):
                m, a = int(batch.seq_valid.sum()), 0
                while a < m:
                    take = min(m - a, bsz - filled)
                    pending.append((j * draws + epoch, batch, a, a + take))
                    filled += take
                    a += take
                    if filled == bsz:
                        flush()
    if pending:
        flush()
    return [combine_draws([_concat(p) for p in pieces[j * draws: (j + 1) * draws]]) for j in range(len(anchors))]


@dataclass
class Job:
    """One request's anchors, handed to the batcher; `finish(outputs)` turns the head outputs into the answer
    (run on the batcher's thread), whose result or error lands in `future`."""

    task: str
    rows: np.ndarray
    obs: np.ndarray
    finish: Callable[[HeadOutputs], Any]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


_STOP = object()


class Batcher:
    """The thread that owns a `Predictor`: drains queued jobs (up to `batch_size` anchors or `max_wait_s` after the
    first), runs them in shared forward passes per task, and resolves each job's future."""

    def __init__(self, predictor: Predictor, *, max_wait_s: float = 0.005,
                 warm_up: Callable[[], None] | None = None):
        self.predictor = predictor
        self.max_wait_s = max_wait_s
        self.stats = Stats()
        self.ready = threading.Event()
        self.stopping = threading.Event()  # set by stop(); a long warm-up checks it between compilations
        self._warm_up = warm_up
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="confluence-batcher", daemon=True)
        self.failed: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> concurrent.futures.Future:
        if not self._thread.is_alive():
            job.future.set_running_or_notify_cancel()
            job.future.set_exception(RuntimeError("the prediction worker is not running"))
        else:
            self._queue.put(job)
        return job.future

    def stop(self, timeout: float = 30.0) -> None:
        """Answer what is queued, then end the thread."""
        self.stopping.set()
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
        while True:  # anything that slipped in after the stop is refused, not left waiting
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP and item.future.set_running_or_notify_cancel():
                item.future.set_exception(RuntimeError("the prediction service is shutting down"))

    def pending(self) -> int:
        return self._queue.qsize()

    def _loop(self) -> None:
        try:
            if self._warm_up is not None:
                self._warm_up()
        except BaseException as exc:  # noqa: BLE001 - reported by /health; requests still get an error each
            log.exception("warm-up failed")
            self.failed = exc
        self.ready.set()
        stopping = False
        while not stopping:
            item = self._queue.get()
            if item is _STOP:
                break
            jobs, n = [item], len(item.rows)
            deadline = time.monotonic() + self.max_wait_s
            while n < self.predictor.batch_size:
                try:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                jobs.append(item)
                n += len(item.rows)
            self._round(jobs)

    def _round(self, jobs: list[Job]) -> None:
        jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]  # a gone client's job is skipped
        if not jobs:
            return
        st = self.stats
        st.rounds += 1
        st.max_requests_per_round = max(st.max_requests_per_round, len(jobs))
        by_task: dict[str, list[Job]] = {}
        for job in jobs:
            by_task.setdefault(job.task, []).append(job)
        for task, group in by_task.items():
            try:
                outs = head_outputs(self.predictor, task, [(j.rows, j.obs) for j in group], st)
            except Exception as exc:  # noqa: BLE001 - every waiting request gets the error
                log.exception("model call failed for task %s", task)
                st.errors += len(group)
                for job in group:
                    job.future.set_exception(exc)
                continue
            for job, out in zip(group, outs, strict=True):
                try:
                    job.future.set_result(job.finish(out))
                except Exception as exc:  # noqa: BLE001
                    log.exception("post-processing failed for task %s", task)
                    st.errors += 1
                    job.future.set_exception(exc)
                else:
                    st.requests += 1
                    st.anchors += len(job.rows)
