"""The HTTP JSON API of the prediction service (FastAPI): `POST /predict`, `GET /health`, `GET /tasks`,
`GET /model`, and the OpenAPI page at `/docs` (schema at `/openapi.json`). docs/serving.md describes it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator
from pydantic_core import PydanticCustomError
from starlette.concurrency import run_in_threadpool

import confluence
from confluence.evaluation.draws import DEFAULT_DRAWS
from confluence.serving.service import PredictionService, RequestError, ServeSettings, json_rows

log = logging.getLogger("confluence.serving")

MAX_TOP_K = 100


class Anchor(BaseModel):
    """One anchor row to predict for, named by its primary key."""

    model_config = ConfigDict(extra="forbid")
    key: int | str = Field(description="Primary-key value of the anchor row (`GET /tasks` gives the key column "
                                       "and its type).", examples=[1545])
    observation_time: StrictStr | None = Field(
        None, description="Predict as of this time (ISO 8601, e.g. 2013-06-01T12:00:00; an offset such as Z or "
                          "+02:00 is converted to UTC): no row created later is seen. Omitted or null: the "
                          "anchor row's own time, or no cut-off for a table without time.",
        examples=["2013-06-01T12:00:00"])


    @field_validator("key", mode="before")
    @classmethod
    def _key_type(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise PydanticCustomError("key_type", "a key is an integer or a string, not {value}", {"value": repr(v)})
        return v


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: StrictStr = Field(description="A task of the store (`GET /tasks`).", examples=["flights.dep_delay"])
    anchors: list[Anchor] = Field(min_length=1, description="The anchors, answered in this order.")
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K, description="Categorical tasks: classes listed "
                                                                     "(class_1, prob_1, ...); default: the "
                                                                     "server's --top-k.")


class PredictResponse(BaseModel):
    task: str
    key_column: str = Field(description="The anchor table's primary-key column, the first field of each row.")
    rows: list[dict[str, Any]] = Field(description="One row per anchor, in request order, with the columns of "
                                                   "`confluence predict` (docs/evaluation.md): the key, "
                                                   "observation_time, prediction, the target type's columns, "
                                                   "p_null. Timestamps are ISO 8601 (UTC); NaN is null.")


class Error(BaseModel):
    detail: str = Field(description="What is wrong, naming the field (e.g. `anchors[2]: key 999 is not a "
                                    "'flights' row`).")


class StatsBody(BaseModel):
    requests: int = Field(description="Requests answered.")
    anchors: int = Field(description="Anchors answered.")
    model_calls: int = Field(description="Forward passes of the model.")
    merged_calls: int = Field(description="Forward passes that held more than one request's anchors.")
    rounds: int = Field(description="Times the worker drained the queue.")
    max_requests_per_round: int
    errors: int = Field(description="Requests that failed on the server's side.")
    queued: int = Field(description="Requests waiting now.")


class Health(BaseModel):
    status: Literal["ready", "starting", "failed"]
    store: str
    step: int
    batch_size: int
    max_wait_ms: float
    max_anchors: int
    draws: int = Field(description="Contexts each anchor is answered from (the server's --draws).")
    compiled_shapes: int = Field(description="Batch shapes the model is compiled for (it compiles them all "
                                             "before it is ready).")
    batch_shapes: int = Field(description="Batch shapes to compile before ready.")
    stats: StatsBody


class TaskInfo(BaseModel):
    name: str
    anchor_table: str
    key_column: str | None
    key_type: Literal["integer", "string"] | None
    target_type: str
    observation_time: str = Field(description="How a task's observation times were defined at preprocessing.")
    description: str


class StoreInfo(BaseModel):
    name: str
    path: str
    d_t: int = Field(description="Size of the store's text embeddings (the checkpoint's d_t).")
    tasks: int


class ModelCard(BaseModel):
    checkpoint: str = Field(description="The checkpoint directory served.")
    checkpoint_sha256: str = Field(description="sha256 over the checkpoint's files (name, NUL, bytes; name order).")
    step: int = Field(description="Training step of the checkpoint.")
    saved_at: str | None = Field(description="When the checkpoint was written (ISO 8601, UTC).")
    parameters: int = Field(description="Number of model parameters.")
    trained_on: list[str] = Field(description="Databases the run trained on.")
    code: dict[str, Any] | None = Field(default=None, description="The code that trained it: version, git commit, "
                                        "dirty (the package differed from the commit), diff_sha256, environment "
                                        "(library versions, device, CPU); "
                                        "null for checkpoints written before 2026-11-25.")
    config: dict[str, Any] = Field(description="The run's model settings, and a summary of its sampler, loss and "
                                               "schedule.")
    store: StoreInfo


def _field(loc: tuple[Any, ...]) -> str:
    """('body', 'anchors', 0, 'key') -> 'anchors[0].key'."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _validation_message(errors: list[dict[str, Any]]) -> str:
    msgs = []
    for e in errors:
        if e.get("type") == "json_invalid":
            msgs.append(f"the request body is not valid JSON ({e.get('ctx', {}).get('error', e.get('msg'))})")
        else:
            msgs.append(f"{_field(tuple(e.get('loc', ())))}: {e.get('msg')}")
    return "; ".join(msgs)


def create_app(checkpoint: str | Path, db: str | Path, *, batch_size: int | None = None, max_wait_ms: float = 5.0,
               max_anchors: int = 1000, top_k: int = 3, clip_numbers: bool = True, threads: int = 1,
               warm_up: bool = True, draws: int = DEFAULT_DRAWS) -> FastAPI:
    """The ASGI app serving `checkpoint` on the store `db`. Both load here (a ConfluenceError for a bad path, so a
    server can refuse to start before it binds); the batching worker starts with the app (its lifespan) and
    compiles the model (for every batch shape, unless `warm_up` is off) before `/health` says ready."""
    settings = ServeSettings(batch_size=batch_size, max_wait_ms=max_wait_ms, max_anchors=max_anchors, top_k=top_k,
                             clip_numbers=clip_numbers, threads=threads, warm_up=warm_up, draws=draws)
    service = PredictionService(checkpoint, db, settings)
    return build_app(service)


def build_app(service: PredictionService) -> FastAPI:
    """The FastAPI app around a loaded `PredictionService` (started and stopped with the app)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)

    app = FastAPI(title="Confluence prediction service", version=confluence.__version__, lifespan=lifespan,
                  description=f"Predictions of checkpoint step {service.loaded.step} on store "
                              f"'{service.store.name}'. The same rows as `confluence predict --anchors`.")
    app.state.service = service

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        return JSONResponse({"detail": _validation_message(errors), "errors": jsonable_encoder(errors)},
                            status_code=422)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        # the server logs the traceback (Starlette re-raises it); the client gets no traceback
        log.error("internal error on %s %s: %r", request.method, request.url.path, exc)
        return JSONResponse({"detail": "internal server error; the server log has the details"}, status_code=500)

    @app.get("/", include_in_schema=False)
    async def index() -> dict[str, str]:
        return {"service": "confluence", "docs": "/docs", "openapi": "/openapi.json", "health": "/health",
                "tasks": "/tasks", "model": "/model", "predict": "POST /predict"}

    @app.get("/health", response_model=Health, responses={503: {"model": Health}},
             summary="Ready to answer? (503 while the model compiles)")
    async def health() -> JSONResponse:
        b = service.batcher
        status = "failed" if b.failed is not None else ("ready" if b.ready.is_set() else "starting")
        st = service.stats
        body = Health(status=status, store=service.store.name, step=service.loaded.step,
                      batch_size=service.predictor.batch_size, max_wait_ms=service.settings.max_wait_ms,
                      max_anchors=service.settings.max_anchors, draws=service.predictor.draws,
                      compiled_shapes=service.compiled[0], batch_shapes=service.compiled[1],
                      stats=StatsBody(requests=st.requests, anchors=st.anchors, model_calls=st.model_calls,
                                      merged_calls=st.merged_calls, rounds=st.rounds,
                                      max_requests_per_round=st.max_requests_per_round, errors=st.errors,
                                      queued=b.pending()))
        return JSONResponse(body.model_dump(), status_code=200 if status == "ready" else 503)

    @app.get("/tasks", response_model=list[TaskInfo], summary="The store's tasks")
    async def tasks() -> list[dict[str, Any]]:
        return service.tasks

    @app.get("/model", response_model=ModelCard,
             summary="The model card: checkpoint, its sha256, step, parameters, config, store")
    async def model() -> dict[str, Any]:
        return service.card

    @app.post("/predict", response_model=PredictResponse, summary="Predict a task for anchors named by key",
              responses={413: {"model": Error, "description": "More anchors than the server's --max-anchors"},
                         422: {"model": Error, "description": "A field is wrong; `detail` names it"},
                         500: {"model": Error}})
    async def predict(req: PredictRequest) -> Any:
        keys = [a.key for a in req.anchors]
        times = [a.observation_time for a in req.anchors]
        try:
            job = await run_in_threadpool(service.job, req.task, keys,
                                          None if all(t is None for t in times) else times, req.top_k)
        except RequestError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        table = await asyncio.wrap_future(service.batcher.submit(job))
        rows = await run_in_threadpool(json_rows, table)
        return PredictResponse(task=req.task, key_column=service.key_column(req.task), rows=rows)

    return app
