"""`BatchBuilder`: seeds of one task -> one `TrainingBatch`, the phases run by worker threads in nogil kernels.

Phase 1 (per sequence; worker threads take one chunk of the batch each, unless the build is `serial`): walk,
linearize, permutations, in one parallel section with no barrier in between. Phase 2 (once per batch): text
dedup + gather. Collation (allocating the zeroed outputs, `fk_adj` from the edge lists once R is known, the
bookkeeping vectors) is timed on its own.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from confluence.batch import TrainingBatch, seq_arrays
from confluence.errors import ConfluenceError
from confluence.sampler import groups as G
from confluence.sampler.config import SamplerConfig, bucket_size, label_match_for, labels_for, recent_for
from confluence.sampler.data import SamplerData, TaskData, readonly
from confluence.sampler.labels import LabelIndex, append_labels_chunk, choose_labels_chunk
from confluence.sampler.linearize import fill_adjacency, linearize_chunk
from confluence.sampler.perms import perms_chunk
from confluence.sampler.relabel import relabel, relabel_draw
from confluence.sampler.rng import hash_unit, sequence_states, stream_key
from confluence.sampler.textgather import dedup_text, gather_rows
from confluence.sampler.waits import sequence_waits
from confluence.sampler.walk import walk_chunk
from confluence.stypes import SemanticType

PHASES = ("walk", "linearize", "permutations", "text", "collation")
_PARALLEL_GATHER_MIN = 512  # distinct texts in a batch from which the gather is split over the workers


@dataclass
class BuildResult:
    """A batch plus what the walk saw (global rows per sequence) and the phase timings in seconds."""

    batch: TrainingBatch
    rows: np.ndarray  # i64[B, max_rows], global row of each sequence-local row
    hops: np.ndarray  # i32[B, max_rows]
    via: np.ndarray  # i8[B, max_rows]: 0 seed, 1 parent edge, 2 child edge
    src: np.ndarray  # i32[B, max_rows]: sequence-local row whose edge reached the row (-1 for the seed)
    nrows: np.ndarray  # i32[B] (labelled task rows included: via 3, after the walk's rows)
    n_real: np.ndarray  # i32[B], real cells per sequence
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per phase
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per phase, summed over worker threads
    labels: np.ndarray | None = None  # i64[B, k]: the task's seeds shown as labelled rows (-1: none); None if k = 0


class _Scratch:
    """Per-worker state: a stamped int32 mark array over all rows of one database (4 bytes per row)."""

    def __init__(self, num_rows: int):
        self.mark = np.zeros(max(num_rows, 1), dtype=np.int32)
        self.stamp = np.zeros(1, dtype=np.int64)


class BatchBuilder:
    """Builds batches for one database; thread-safe (scratch buffers are checked out per worker)."""

    def __init__(self, data: SamplerData, config: SamplerConfig, db_idx: int = 0, pool: ThreadPoolExecutor | None = None,
                 seed: int = 0):
        self.data = data
        self.config = config
        self.db_idx = db_idx
        self.seed = seed  # the sampling seed: the walk's random numbers derive from it
        self._pool = pool
        self._segs = data.child_segments(config.width_per_fk)  # built here, once, not in the worker threads
        self._counts = data.child_counts(config.child_counts != "none", tuple(config.child_count_windows),
                                         config.child_latest)
        # the count and mean cells read each (row, foreign key)'s time-sorted children (and so do the recency ranks
        # of rows reached as children: `linearize.recency_rank`); without any, nothing reads them: no copy is made
        self._means = data.child_means(config.child_means != "none")
        per_fk = config.child_counts != "none" or config.child_rank or self._means.num > 0
        self._cnt_segs = data.child_segments(True) if per_fk else self._segs
        self._cnt_shown: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}  # by the task's cut columns
        self._mean_shown: dict[bytes, np.ndarray] = {}
        # the kernels' argument groups that hold for every batch of this database (`confluence.sampler.groups`)
        self._graph = G.args(G.graph_of(data))
        self._seg_args = G.args(G.segments_of(self._segs))
        self._cnt_seg_args = G.args(G.segments_of(self._cnt_segs))
        self._scratch: queue.SimpleQueue[_Scratch] = queue.SimpleQueue()

    def _shown_counts(self, cut_cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bool[K]: which count cells a task shows, i32[T]: how many a row of each table gets). The one place
        of the rule: no count through the task's excluded / target columns. Cached per set of cut columns."""
        key = cut_cols.tobytes()
        if key not in self._cnt_shown:
            cnt = self._counts
            shown = ~np.isin(cnt.fk, cut_cols)
            n_tab = cnt.tab_ptr.shape[0] - 1
            table_of_count = np.repeat(np.arange(n_tab), np.diff(cnt.tab_ptr))
            per_table = np.bincount(table_of_count[shown], minlength=n_tab)
            self._cnt_shown[key] = (readonly(shown, np.bool_), readonly(per_table, np.int32))
        return self._cnt_shown[key]

    def _shown_means(self, cut_cols: np.ndarray) -> np.ndarray:
        """bool[K]: which mean cells a task shows. As for the counts: none through the task's excluded / target
        columns. Cached per set of cut columns."""
        key = cut_cols.tobytes()
        if key not in self._mean_shown:
            self._mean_shown[key] = readonly(~np.isin(self._means.fk, cut_cols), np.bool_)
        return self._mean_shown[key]

    # ---- helpers
    def _checkout(self) -> _Scratch:
        try:
            return self._scratch.get_nowait()
        except queue.Empty:
            return _Scratch(self.data.num_rows)

    def _parallel(self, n: int, fn: Callable[[int, int, _Scratch], None], serial: bool = False) -> None:
        """Run fn(lo, hi, scratch) over 0..n: in this thread (`serial`, one thread, or no pool), or by worker
        threads taking one chunk each (chunks are still handed out dynamically; measured: 4 chunks per worker
        scaled 1.36x on 2 cores, 1 chunk 1.74x, because every kernel call unboxes ~40 arrays while holding the
        GIL). A build running inside a pool worker must pass `serial`: waiting on the same pool could deadlock."""
        threads = 1 if serial else min(self.config.threads, n)
        if threads <= 1 or self._pool is None:
            s = self._checkout()
            try:
                fn(0, n, s)
            finally:
                self._scratch.put(s)
            return
        chunk = max(1, -(-n // threads))  # one chunk per worker: each call unboxes ~40 arrays under the GIL
        lock = threading.Lock()
        nxt = [0]

        def run() -> None:
            s = self._checkout()
            try:
                while True:
                    with lock:
                        lo = nxt[0]
                        nxt[0] = min(n, lo + chunk)
                    if lo >= n:
                        return
                    fn(lo, min(n, lo + chunk), s)
            finally:
                self._scratch.put(s)

        futs = [self._pool.submit(run) for _ in range(threads)]
        for f in futs:
            f.result()

    # ---- the build
    def build(self, task: TaskData, seed_ids: np.ndarray, epoch: int = 0, n_valid: int | None = None,
              serial: bool = False, labels: LabelIndex | None = None, own_seeds: bool = True,
              labels_off: float = 0.0, relabel_share: float = 0.0) -> BuildResult:
        """One batch of `batch_size` sequences for `seed_ids` (at most batch_size; the rest are filler).

        `serial`: build it entirely in the calling thread (how the batch stream builds whole batches in the pool's
        workers); otherwise the sequences are split over the pool. The result is the same either way.
        `labels`: the labels the contexts may show (`sampler.labels` of them per sequence, `confluence.sampler.
        labels`); `own_seeds`: `seed_ids` index the labels' task (False: an ad-hoc anchor task); `labels_off`: the
        share of these sequences shown no labels (drawn per seed and epoch; `sampler.labels_off`, training only);
        `relabel_share`: the share whose task answers are re-coded (`confluence.sampler.relabel`, training only)."""
        cfg, d = self.config, self.data
        seed_ids = np.asarray(seed_ids, dtype=np.int64)
        bsz = cfg.batch_size
        if seed_ids.shape[0] == 0 or seed_ids.shape[0] > bsz:
            raise ConfluenceError(f"task {task.name!r}: a batch needs 1..{bsz} seeds, got {seed_ids.shape[0]}")
        if seed_ids.min() < 0 or seed_ids.max() >= task.num_seeds:
            bad = int(seed_ids[(seed_ids < 0) | (seed_ids >= task.num_seeds)][0])
            raise ConfluenceError(f"task {task.name!r}: seed index {bad} out of range 0..{task.num_seeds - 1}")
        n_valid = seed_ids.shape[0] if n_valid is None else n_valid
        recent = recent_for(cfg, d.name, task.name)
        seq_valid = np.zeros(bsz, dtype=np.bool_)
        seq_valid[:n_valid] = True
        if seed_ids.shape[0] < bsz:
            seed_ids = np.concatenate([seed_ids, np.full(bsz - seed_ids.shape[0], seed_ids[0], dtype=np.int64)])
        timings = dict.fromkeys(PHASES, 0.0)
        cpu_parts = {k: np.zeros(bsz) for k in PHASES}
        c0 = time.thread_time()
        t0 = time.perf_counter()
        anchors = np.ascontiguousarray(task.anchor_row[seed_ids])
        obs = np.ascontiguousarray(task.obs_time[seed_ids])
        key = stream_key("sequence", self.seed, epoch, self.db_idx, task.index)
        states = sequence_states(key, seed_ids if task.seed_keys is None else task.seed_keys[seed_ids])
        max_rows = cfg.max_rows
        s_len = cfg.seq_len
        k_lab = labels_for(cfg, d.name, task.name) if labels is not None else 0
        m_lab = label_match_for(cfg, d.name, task.name) if k_lab > 0 else 0  # matches among them (at most k_lab)
        # the walk leaves room for the labelled rows: a row and 1-2 cells each
        s_walk = s_len - k_lab * (2 if task.obs_col >= 0 else 1)
        rows_walk = max_rows - k_lab
        lab_out = np.full((bsz, max(k_lab, 1)), -1, dtype=np.int64)
        no_labels = (hash_unit(stream_key("labels_off", self.seed, epoch, self.db_idx, task.index), seed_ids)
                     < labels_off) if k_lab > 0 and labels_off > 0 else None
        n_lab = np.zeros(bsz, dtype=np.int32)
        own = seed_ids if own_seeds else np.full(bsz, -1, dtype=np.int64)
        rows = np.zeros((bsz, max_rows), dtype=np.int64)
        hops = np.zeros((bsz, max_rows), dtype=np.int32)
        via = np.zeros((bsz, max_rows), dtype=np.int8)
        src = np.zeros((bsz, max_rows), dtype=np.int32)
        nrows = np.zeros(bsz, dtype=np.int32)
        out = seq_arrays(bsz, s_len)  # the kernels write every position of the permutations
        n_real = np.zeros(bsz, dtype=np.int32)
        edges = np.empty((bsz, max_rows * max(d.max_parents, 1)), dtype=np.int32)
        n_edges = np.zeros(bsz, dtype=np.int32)
        cnt = self._counts
        cnt_shown, tab_shown = self._shown_counts(task.cut_cols)
        # no row ages for a timestamp cell task: its observation time is the anchor's own time, which may be the
        # target itself (a row's age would then give the target away beside the row's visible time)
        ages_on = bool(task.is_derived or int(task.target_stype) != int(SemanticType.TIMESTAMP))
        anchor_extra = tab_shown[np.searchsorted(d.tab_row_off, anchors, side="right") - 1]
        # the walk budgets the other rows' count cells only when they get them
        tab_extra = tab_shown if cfg.child_counts == "all" else np.zeros(0, np.int32)
        # the kernels' argument groups of this batch (`confluence.sampler.groups`)
        sequences = G.args(G.Sequences(anchors, obs, seed_ids, own, states, anchor_extra))
        visits = G.args(G.Visits(rows, hops, via, src, nrows, n_real, edges, n_edges))
        cells = G.args(G.Cells(**out))
        target = G.args(G.target_of(task))
        counts = G.args(G.counts_of(cnt, cnt_shown, cfg.child_counts == "all", self._means,
                                    self._shown_means(task.cut_cols), cfg.child_mean_rows, cfg.child_mean_cells))
        limits = G.args(G.WalkLimits(s_walk, int(cfg.width), int(recent), rows_walk, tab_extra))
        lab_group = G.args(G.labels_of(labels)) if k_lab > 0 else None
        timings["collation"] += time.perf_counter() - t0
        cpu_parts["collation"][0] += time.thread_time() - c0

        def phase1(lo: int, hi: int, s: _Scratch) -> None:
            """Walk, linearize and permute sequences lo..hi-1 (all nogil kernels)."""
            c1 = time.thread_time()
            walk_chunk(lo, hi, sequences, self._graph, self._seg_args, target, limits, counts, self._cnt_seg_args,
                       s.mark, s.stamp, visits)
            c2 = time.thread_time()
            linearize_chunk(lo, hi, s_walk, sequences, visits, target, self._graph, counts, self._cnt_seg_args,
                            ages_on, cfg.child_rank, cells)
            if k_lab > 0:
                choose_labels_chunk(lo, hi, k_lab, m_lab, sequences, visits, lab_group, self._graph, target,
                                    self._seg_args, lab_out, n_lab)
                if no_labels is not None:  # this chunk's sequences drawn to be shown no labels (the walk unchanged)
                    off = np.flatnonzero(no_labels[lo:hi]) + lo
                    lab_out[off], n_lab[off] = -1, 0
                append_labels_chunk(lo, hi, s_len, sequences, ages_on, target, lab_group, self._graph, lab_out,
                                    n_lab, visits, cells)
            c3 = time.thread_time()
            perms_chunk(lo, hi, visits, d.col_stype.shape[0], cfg.perm_tile, cells)
            cpu_parts["walk"][lo] += c2 - c1
            cpu_parts["linearize"][lo] += c3 - c2
            cpu_parts["permutations"][lo] += time.thread_time() - c3

        t0 = time.perf_counter()
        self._parallel(bsz, phase1, serial)
        draw = relabel_draw(self.seed, epoch, self.db_idx, task, seed_ids, relabel_share)
        if draw.any():
            relabel(out, task, draw, self.seed, epoch, self.db_idx, seed_ids)
        wall = time.perf_counter() - t0
        # one fused section: its wall time is attributed to the phases by their CPU shares
        cpu1 = {k: cpu_parts[k].sum() for k in ("walk", "linearize", "permutations")}
        tot = sum(cpu1.values())
        for k, v in cpu1.items():
            timings[k] += wall * (v / tot if tot > 0 else 1 / 3)

        c0 = time.thread_time()
        t0 = time.perf_counter()
        r_pad = bucket_size(int(nrows.max()), cfg.row_buckets, cap=max_rows)
        fk_adj = np.zeros((bsz, r_pad, r_pad), np.bool_)
        fill_adjacency(edges, n_edges, fk_adj)
        timings["collation"] += time.perf_counter() - t0
        cpu_parts["collation"][0] += time.thread_time() - c0

        c0 = time.thread_time()
        t0 = time.perf_counter()
        uniq = dedup_text(out["semantic_types"], out["is_null"], out["text_embed_ids"])
        u_pad = bucket_size(uniq.shape[0], cfg.text_buckets)
        text = np.zeros((u_pad, d.d_t), dtype=np.float16)
        table16, text16 = d.text_embeddings.view(np.uint16), text.view(np.uint16)  # numba has no float16
        gather_cpu: list[float] = []
        # the gather is mostly page faults of the mmapped table: spread them over the workers
        if uniq.shape[0] >= _PARALLEL_GATHER_MIN and self.config.threads > 1 and not serial:

            def gather(lo: int, hi: int, _s: _Scratch) -> None:
                c1 = time.thread_time()
                gather_rows(table16, uniq[lo:hi], text16[lo:hi])
                gather_cpu.append(time.thread_time() - c1)

            self._parallel(uniq.shape[0], gather)
        else:
            gather_rows(table16, uniq, text16)
        timings["text"] += time.perf_counter() - t0
        cpu_parts["text"][0] = time.thread_time() - c0 + sum(gather_cpu)
        c0 = time.thread_time()

        t0 = time.perf_counter()
        wait_ref, wait_scale = sequence_waits(task, seed_ids)
        batch = TrainingBatch(
            **out,
            fk_adj=fk_adj,
            text_batch_embeddings=text,
            target_stype=task.target_stype,
            task_idx=task.index,
            db_idx=self.db_idx,
            cat_block_start=task.cat_block_start,
            cat_count=task.cat_count,
            seed_ids=seed_ids,
            anchor_rows=anchors,
            obs_times=obs,
            seq_valid=seq_valid,
            wait_ref=wait_ref,
            wait_scale=wait_scale,
        )
        timings["collation"] += time.perf_counter() - t0
        cpu_parts["collation"][0] += time.thread_time() - c0
        cpu = {k: float(v.sum()) for k, v in cpu_parts.items()}
        return BuildResult(batch, rows, hops, via, src, nrows, n_real, timings, cpu,
                           labels=lab_out if k_lab > 0 else None)
