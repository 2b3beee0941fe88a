"""The prediction service without HTTP: a checkpoint and a store loaded once, a `Batcher` owning the model, and
requests turned into the rows `confluence predict --anchors` writes (`confluence.evaluation.predict`'s own
functions: key lookup, observation times and their defaults, post-processing with the same train-target
clipping)."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np
import pyarrow as pa

from confluence.errors import ConfluenceError
from confluence.evaluation.link_predict import (
    LinkAnswerer,
    anchor_table_of,
    describe_link_task,
    is_link_task,
    link_json_rows,
    served_link_tasks,
    target_column,
)
from confluence.evaluation.predict import (
    KeyIndex,
    TaskBlend,
    fit_task_blend,
    prediction_table,
    resolve_anchors,
)
from confluence.evaluation.report import describe_task
from confluence.inference.draws import DEFAULT_DRAWS
from confluence.inference.predictor import HeadOutputs, LoadedModel, Predictor, load_model
from confluence.serving.batching import Batcher, Job, Stats, batch_shape, batch_shapes, reshaped
from confluence.store import Store
from confluence.stypes import SemanticType
from confluence.toolkit.checkpoint import read_checkpoint

log = logging.getLogger("confluence.serving")


class RequestError(ConfluenceError):
    """A request the service refuses: `status` is the HTTP status, the message names the field."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


# request bodies: room for the JSON around the anchors, and per anchor (a 40-character key with a time and
# offset takes about 110 bytes; 512 leaves room for longer keys and indentation)
BODY_BASE_BYTES = 64 * 1024
BODY_BYTES_PER_ANCHOR = 512


@dataclass(frozen=True)
class ServeSettings:
    """How the service batches and what it accepts. `batch_size`: sequences per forward pass (None: the run's);
    `max_wait_ms`: how long the worker waits for more requests after the first before a model call;
    `max_anchors`: anchors per request; `max_body_bytes`: bytes in a request body (None: `BODY_BASE_BYTES` +
    `BODY_BYTES_PER_ANCHOR` x `max_anchors`; more is refused unparsed); `top_k`: classes listed by default;
    `clip_numbers`: as in predict; `warm_up`: compile every batch shape before reporting ready (else each on first
    use); `draws`: contexts per anchor whose answers are combined, as in predict (`confluence.inference.draws`);
    `token`: the bearer token every endpoint but /health requires (None: none); `docs`: serve the Swagger page at
    /docs (its assets come from a CDN); `model_details`: /model shows absolute paths and the training machine's
    environment (else basenames only); `blend`: "gbdt" fits LightGBM and a blend weight per task at start-up
    (on at most `blend_max_val` validation seeds) and answers with LightGBM's and the blend's columns too, as
    `predict --blend gbdt --anchors`. `max_explain_anchors`: anchors per `POST /explain` request (each costs a
    model call per context row and cell)."""

    batch_size: int | None = None
    max_wait_ms: float = 5.0
    max_anchors: int = 1000
    top_k: int = 3
    clip_numbers: bool = True
    threads: int | None = None  # sampler threads (None: `inference.inference_threads`)
    warm_up: bool = True
    draws: int = DEFAULT_DRAWS
    max_body_bytes: int | None = None
    token: str | None = field(default=None, repr=False)  # never in a log line
    docs: bool = False
    model_details: bool = False
    blend: str | None = None
    blend_max_val: int = 5000
    max_explain_anchors: int = 16

    @property
    def body_limit(self) -> int:
        """Most bytes in a request body: `max_body_bytes`, or the default derived from `max_anchors`."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return BODY_BASE_BYTES + BODY_BYTES_PER_ANCHOR * self.max_anchors

    def check(self) -> None:
        for name, value, least in (("batch_size", self.batch_size, 1), ("max_wait_ms", self.max_wait_ms, 0),
                                   ("max_anchors", self.max_anchors, 1), ("top_k", self.top_k, 0),
                                   ("threads", self.threads, 1), ("draws", self.draws, 1),
                                   ("max_body_bytes", self.max_body_bytes, 1024),
                                   ("blend_max_val", self.blend_max_val, 1),
                                   ("max_explain_anchors", self.max_explain_anchors, 1)):
            if value is not None and value < least:
                raise ConfluenceError(f"{name} (--{name.replace('_', '-')}) must be {least} or more, not {value}")
        if self.token is not None and (not self.token or any(c.isspace() for c in self.token)):
            raise ConfluenceError("the bearer token is empty or holds whitespace")
        from confluence.evaluation.blend import check_blend

        check_blend(self.blend)


def checkpoint_sha256(path: Path) -> str:
    """sha256 over a checkpoint directory's files (each file's name, then its bytes, in name order)."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def model_card(loaded: LoadedModel, store: Store, details: bool = False) -> dict[str, Any]:
    """What a client needs to know about the model behind the answers: checkpoint (path, step, file hash, when
    saved, the code that trained it), parameter count, a summary of the training config, and the store served.
    Without `details`, paths are basenames and the code record has no `environment` (the training machine's
    libraries, device and CPU): a client need not learn the server's directories or hardware."""
    meta = read_checkpoint(loaded.path).meta
    cfg = loaded.config
    params = eqx.filter(loaded.model, eqx.is_inexact_array)
    saved = meta.get("saved_at")
    s = cfg.sampler
    code = meta.get("code")
    if isinstance(code, dict) and not details:
        code = {k: v for k, v in code.items() if k != "environment"}
    return {
        "checkpoint": str(loaded.path) if details else loaded.path.name,
        "checkpoint_sha256": checkpoint_sha256(loaded.path),
        "step": loaded.step,
        "saved_at": None if saved is None else dt.datetime.fromtimestamp(float(saved), dt.UTC).isoformat(),
        "parameters": int(sum(x.size for x in jax.tree_util.tree_leaves(params))),
        "trained_on": list(meta.get("databases", [])),
        "code": code,
        "config": {
            "model": asdict(cfg.model),
            "sampler": {"seq_len": s.seq_len, "batch_size": s.batch_size, "max_rows": s.max_rows, "width": s.width,
                        "recent": s.recent},
            "loss": {"numeric_loss": cfg.loss.numeric_loss, "max_k": cfg.loss.max_k},
            "max_steps": cfg.loop.max_steps,
            "seed": cfg.seed,
        },
        "store": {"name": store.name, "path": str(store.path) if details else Path(store.path).name,
                  "d_t": store.d_t, "tasks": len(store.tasks)},
    }


def _key_type(store: Store, table: str) -> str | None:
    keys = store.keys(table)
    return None if keys is None else ("integer" if pa.types.is_integer(keys.type) else "string")


def task_infos(store: Store, link_tasks: list[str] = ()) -> list[dict[str, Any]]:
    """Per task of the store (kind "cell"), then per link task of `link_tasks` (kind "link"): name, anchor table,
    its key column and key type, target type, how the observation time defaults, and what the task asks; a link
    task also its target table, that table's key column as the answer names it, and its k."""
    out = []
    for t in store.tasks:
        table = store.table(t.anchor_table)
        out.append({
            "name": t.name,
            "kind": "cell",
            "anchor_table": t.anchor_table,
            "key_column": table.primary_key,
            "key_type": _key_type(store, table.name),
            "target_type": SemanticType(int(t.target_stype)).label,
            "observation_time": t.observation_time,
            "description": describe_task(store, t.name),
        })
    for name in link_tasks:
        info = store.link_task(name)
        out.append({
            "name": name,
            "kind": "link",
            "anchor_table": info.anchor_table,
            "key_column": store.table(info.anchor_table).primary_key,
            "key_type": _key_type(store, info.anchor_table),
            "target_type": "link",
            "observation_time": "observation_time_column",
            "description": describe_link_task(store, name),
            "target_table": info.target_table,
            "target_key_column": target_column(store, name),
            "k": info.k,
        })
    return out


def json_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Table rows as JSON-safe dicts: timestamps as ISO 8601 (UTC, no offset, as the store keeps them), NaN and
    infinities as null."""
    def safe(v: Any) -> Any:
        if isinstance(v, dt.datetime | dt.date):
            return v.isoformat()
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    return [{k: safe(v) for k, v in row.items()} for row in table.to_pylist()]


class PredictionService:
    """A checkpoint and a store, loaded once; `start()` runs the batching worker (which compiles the model on a
    first anchor before reporting ready), `stop()` ends it. Errors in the paths raise ConfluenceError here, so a
    server can refuse to start before it binds."""

    def __init__(self, checkpoint: str | Path, db: str | Path, settings: ServeSettings | None = None):
        self.settings = settings or ServeSettings()
        self.settings.check()
        self.store = Store.open(db)
        self.loaded = load_model(checkpoint)
        # link tasks: the link head's ranker of each task it answers, calibrated once now (`_calibrate_links`)
        self.links: dict[str, LinkAnswerer] = {}
        self._link_refused: dict[str, str] = {}  # link task -> why it is not served
        self._calibrate_links()
        if not self.store.tasks and not self.links:
            raise ConfluenceError(f"store {db} has no tasks to serve")
        self.predictor = Predictor(self.loaded, self.store, batch_size=self.settings.batch_size,
                                   threads=self.settings.threads, draws=self.settings.draws)
        self.card = model_card(self.loaded, self.store, self.settings.model_details)
        self.card["link_tasks"] = list(self.links)
        self.tasks = task_infos(self.store, list(self.links))
        # each anchor table's keys sorted once (not hashed again on every request)
        self._indexes = {}
        for table in [t.anchor_table for t in self.store.tasks] + [a.info.anchor_table for a in self.links.values()]:
            keys = self.store.keys(table)
            if keys is not None and table not in self._indexes:
                self._indexes[table] = KeyIndex(keys)
        # the train seeds that bound each task's numerical predictions, as predict uses them (None: no clipping)
        self._train_ids = {t.name: self.predictor.seed_ids("train", t.name) if self.settings.clip_numbers else None
                           for t in self.store.tasks}
        # `--blend gbdt`: LightGBM and a blend weight per task, fitted now; one DuckDB connection builds the
        # features of every request's anchors, one request at a time
        self.blends: dict[str, TaskBlend] = {}
        self._builder: Any = None
        self._builder_lock = threading.Lock()
        if self.settings.blend:
            self._fit_blends()
        self._explain_lock = threading.Lock()  # one explanation at a time (`explain`)
        self._stats_lock = threading.Lock()  # link requests count into the batcher's stats
        self._explainers: dict[str, Any] = {}
        self.compiled = (0, 0)  # batch shapes compiled, of those to compile before ready
        self.batcher = Batcher(self.predictor, max_wait_s=self.settings.max_wait_ms / 1000.0,
                               warm_up=self._warm_up)

    def _calibrate_links(self) -> None:
        """A calibrated `LinkAnswerer` per link task the checkpoint answers (`served_link_tasks`), a log line each;
        a task that cannot be calibrated is not served (a request for it is told why)."""
        if getattr(self.loaded.model, "link", None) is None:
            for t in self.store.link_tasks:
                self._link_refused[t.name] = (f"checkpoint {self.loaded.path.name} has no link head: train it on a "
                                              "link task first (confluence train-links)")
            return
        for name in served_link_tasks(self.loaded, self.store):
            t0 = time.perf_counter()
            try:
                self.links[name] = LinkAnswerer(self.loaded, self.store, name)
            except ConfluenceError as exc:
                self._link_refused[name] = str(exc)
                log.warning("link task %s is not served: %s", name, exc)
            else:
                log.info("link task %s: ranker calibrated in %.1f s", name, time.perf_counter() - t0)
        for t in self.store.link_tasks:
            if t.name not in self.links and t.name not in self._link_refused:
                self._link_refused[t.name] = "the checkpoint's link head was trained on other link tasks " \
                                             f"({', '.join(served_link_tasks(self.loaded, self.store))})"

    def _fit_blends(self) -> None:
        """Fit each task's blend (`predict.fit_task_blend`), a log line per task; a task without labelled train
        seeds is served without one (its line says so)."""
        from confluence.evaluation.blend import guard_words
        from confluence.evaluation.gbdt import FeatureBuilder
        from confluence.targets import decode_targets

        tasks = self.store.tasks
        log.info("blend: fitting LightGBM on the train seeds and a blend weight on up to %d validation seeds, "
                 "for each of %d task(s)", self.settings.blend_max_val, len(tasks))
        t0 = time.perf_counter()
        self._builder = FeatureBuilder(self.store)
        for i, t in enumerate(tasks):
            t1 = time.perf_counter()
            train = self.predictor.seed_ids("train", t.name)
            if not (~decode_targets(self.store, t.name, train).is_null).any():
                log.info("blend %d/%d %s: no labelled train seeds, served without a blend", i + 1, len(tasks), t.name)
                continue
            tb = fit_task_blend(self.predictor, t.name, self._builder, max_val=self.settings.blend_max_val,
                                clip_numbers=self.settings.clip_numbers)
            self.blends[t.name] = tb
            guard = guard_words(tb.fit.summary())
            log.info("blend %d/%d %s: weight %.2f (model share) on %d validation rows, ship %s%s (%.1f s)", i + 1,
                     len(tasks), t.name, tb.fit.weight, tb.fit.n_val, tb.fit.ship,
                     f" (best weight {tb.fit.best_weight:.2f}, {guard})" if guard else "", time.perf_counter() - t1)
        log.info("blend: %d of %d task(s) fitted in %.1f s", len(self.blends), len(tasks), time.perf_counter() - t0)
        for info in self.tasks:
            tb = self.blends.get(info["name"])
            info["blend"] = None if tb is None else tb.fit.summary() | {"ship": tb.fit.ship}

    # ---- lifecycle
    def start(self) -> None:
        self.batcher.start()

    def stop(self) -> None:
        self.batcher.stop()
        self.predictor.close()
        for answerer in self.links.values():
            answerer.close()

    def stop_after(self, seconds: float) -> None:
        """Begin shutting down: requests in progress get `seconds` more, then the rest get HTTP 503 (the CLI
        server calls it when SIGTERM / SIGINT arrives, so a large request cannot hold the exit up)."""
        self.batcher.stop_after(seconds)

    @property
    def ready(self) -> bool:
        return self.batcher.ready.is_set() and self.batcher.failed is None

    @property
    def stats(self) -> Stats:
        return self.batcher.stats

    def _warm_up(self) -> None:
        """Compile the model for every batch shape it can meet (`batch_shapes`), on the worker's thread before
        `ready`, so no request waits for a compilation; with `warm_up` off, only for one anchor's batch."""
        task = next((t for t in self.store.tasks if t.num_seeds), None)
        if task is None:
            return
        arrays = self.store.task_arrays(task.name)
        custom = self.predictor.stream.sampler.anchor_task(task.name, np.asarray(arrays.anchor_row[:1]),
                                                           np.asarray(arrays.obs_time[:1]))
        batch = list(self.predictor.stream.ordered(custom, np.zeros(1, np.int64)))[0]
        shapes = batch_shapes(self.predictor) if self.settings.warm_up else [batch_shape(batch)]
        self.compiled = (0, len(shapes))
        log.info("compiling the model for %d batch shape(s) (rows, texts): %s (from the compilation cache when "
                 "an earlier start compiled them)", len(shapes), shapes)
        t0 = time.perf_counter()
        done = threading.Event()

        def tick() -> None:  # never silent for more than 10 s while a shape compiles
            while not done.wait(10.0):
                log.info("still compiling: %d of %d shape(s) done, %.0f s so far", self.compiled[0], len(shapes),
                         time.perf_counter() - t0)

        ticker = threading.Thread(target=tick, name="warm-up-ticker", daemon=True)
        ticker.start()
        try:
            for i, (r, u) in enumerate(shapes):
                if self.batcher.stopping.is_set():  # shut down while compiling: stop soon, not after every shape
                    return
                t1 = time.perf_counter()
                self.predictor.forward(reshaped(batch, r, u))
                self.compiled = (i + 1, len(shapes))
                log.info("shape %d of %d (rows %d, texts %d) ready in %.1f s", i + 1, len(shapes), r, u,
                         time.perf_counter() - t1)
        finally:
            done.set()
        log.info("compiled in %.1f s", time.perf_counter() - t0)

    # ---- requests
    def job(self, task: str, keys: list[Any], times: list[str | None] | None, top_k: int | None,
            context_labels: str = "all") -> Job:
        """A request checked and resolved (RequestError naming the field otherwise), ready for the batcher;
        `context_labels`: whose labels its contexts may show (`predict --context-labels`)."""
        self._check(task, keys, self.settings.max_anchors, "--max-anchors")
        if task in self.links:
            raise RequestError(f"task: {task!r} is a link task (PredictionService.link_rows answers it)")
        k = self.settings.top_k if top_k is None else top_k
        rows, obs, cast_keys = self._anchors(task, keys, times)
        train_ids = self._train_ids[task]
        blend = self.blends.get(task)
        gbdt_pred = None
        if blend is not None:  # LightGBM's features here, on the request's thread, not on the model's worker
            with self._builder_lock:
                gbdt_pred = blend.gbdt_predictions(self._builder, (rows, obs))

        def finish(head: HeadOutputs) -> pa.Table:
            table = prediction_table(self.store, task, cast_keys, obs, head, train_ids=train_ids, top_k=k)
            if blend is not None:
                for name, col in blend.columns(self.predictor, head, gbdt_pred, (rows, obs)).items():
                    table = table.append_column(name, col)
            return table

        return Job(task, rows, obs, finish, context=context_labels)

    def is_link(self, task: str) -> bool:
        """Whether `task` is a link task this service answers (`link_rows`)."""
        return task in self.links

    def link_rows(self, task: str, keys: list[Any], times: list[str | None] | None,
                  top_k: int | None) -> list[dict[str, Any]]:
        """`POST /predict` on a link task: per anchor its key, observation time, the `top_k` (default the task's
        k) likeliest target keys and their scores (`link_predict.link_json_rows`), ranked on the request's thread
        by the task's calibrated ranker (one request at a time per task; the batcher's passes go on)."""
        self._check(task, keys, self.settings.max_anchors, "--max-anchors")
        if top_k == 0:
            raise RequestError("top_k: a link task ranks at least 1 target row")
        if self.batcher.stopping.is_set():
            raise RequestError("the prediction service is shutting down; try again later", status=503)
        rows, obs, cast_keys = self._anchors(task, keys, times)
        answerer = self.links[task]
        ranked, chances = answerer.rank(rows, obs, top_k)
        out = link_json_rows(self.store, task, cast_keys, obs, ranked, chances, answerer)
        with self._stats_lock:
            self.stats.requests += 1
            self.stats.anchors += len(out)
        return out

    def target_key_column(self, task: str) -> str | None:
        """A link task's target-key field in its answer rows (None for a cell task)."""
        return target_column(self.store, task) if is_link_task(self.store, task) else None

    def _check(self, task: str, keys: list[Any], most: int, option: str) -> None:
        if task in self._link_refused:
            raise RequestError(f"task: link task {task!r} is not served: {self._link_refused[task]}")
        if task not in self._train_ids and task not in self.links:
            links = f"; link tasks: {', '.join(self.links)}" if self.links else ""
            raise RequestError(f"task: no task {task!r} in store '{self.store.name}'; tasks: "
                               f"{', '.join(t.name for t in self.store.tasks)}{links} (GET /tasks)")
        if not keys:
            raise RequestError("anchors: give at least one anchor")
        if len(keys) > most:
            raise RequestError(f"anchors: {len(keys)} anchors, at most {most} per request (the server's {option})",
                               status=413)

    def _anchors(self, task: str, keys: list[Any], times: list[str | None] | None
                 ) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """A request's anchors resolved: (global rows, observation times, keys cast to the key column's type);
        RequestError naming the anchor otherwise."""
        for i, key in enumerate(keys):
            if isinstance(key, int) and not -(2**63) <= key < 2**63:
                raise RequestError(f"anchors[{i}]: key {key} is out of the 64-bit integer range")
        try:
            key_arr = pa.array(keys) if all(isinstance(x, int) for x in keys) else pa.array([str(x) for x in keys])
            time_arr = None if times is None else pa.array(times, pa.string())
            rows, obs, cast_keys = resolve_anchors(self.store, task, key_arr, time_arr, lambda i: f"anchors[{i}]",
                                                   null_time_default=True,
                                                   index=self._indexes.get(anchor_table_of(self.store, task)))
        except ConfluenceError as exc:
            raise RequestError(str(exc)) from None
        return rows, obs, cast_keys

    def explain(self, task: str, keys: list[Any], times: list[str | None] | None, rows: int,
                context_labels: str = "all") -> list[dict[str, Any]]:
        """`POST /explain`: why the model answers these anchors as it does (`inference.explain`), one explanation
        at a time (each costs a model call per context row, on the request's thread: /predict keeps answering)."""
        from confluence.inference.explain import Explainer

        self._check(task, keys, self.settings.max_explain_anchors, "--max-explain-anchors")
        if task in self.links:
            raise RequestError(f"task: {task!r} is a link task; /explain answers cell tasks")
        grows, obs, _ = self._anchors(task, keys, times)
        with self._explain_lock:
            if task not in self._explainers or self._explainers[task].top != rows:
                self._explainers[task] = Explainer(self.predictor, task, top=rows)
            out = self._explainers[task].anchors(grows, obs, context_labels)
        return [e.to_dict() for e in out]

    def key_column(self, task: str) -> str:
        return self.store.table(anchor_table_of(self.store, task)).primary_key or "anchor"
