"""The HTTP JSON API of the prediction service (FastAPI): `POST /predict`, `GET /health`, `GET /tasks`,
`GET /model`, the schema at `/openapi.json` (and with `docs`, the Swagger page at `/docs`). In front of it, `Guard`
checks the bearer token and the body size before a byte of the body is parsed; `/predict` parses, checks and
renders on worker threads, never on the event loop. docs/reference/http.md
describes the API, docs/design/serving.md the load it holds."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator
from pydantic_core import PydanticCustomError
from starlette.concurrency import run_in_threadpool

import confluence
from confluence.inference.draws import DEFAULT_DRAWS
from confluence.serving.batching import Unavailable
from confluence.serving.service import PredictionService, RequestError, ServeSettings, json_rows

log = logging.getLogger("confluence.serving")

MAX_TOP_K = 100
MAX_EXPLAIN_ROWS = 64  # rows per explanation a request may ask for
EXCERPT = 100  # most characters of one input value an error message repeats
MAX_ERRORS = 10  # validation errors listed in one answer (the count of the rest follows)
# a refused body of up to this many bytes is read and dropped (for up to DISCARD_S) before the 413, so that a client
# that sends its whole body before it reads (most do) gets the answer, not a reset connection; beyond: at once
DISCARD_BYTES = 64 * 1024 * 1024
DISCARD_S = 5.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """`text` cut to `limit` characters and "…": an error names a bad value without echoing a large input."""
    return text if len(text) <= limit else text[:limit] + "…"


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
            raise PydanticCustomError("key_type", "a key is an integer or a string, not {value}",
                                      {"value": excerpt(repr(v))})
        return v


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: StrictStr = Field(description="A task of the store (`GET /tasks`).", examples=["flights.dep_delay"])
    anchors: list[Anchor] = Field(min_length=1, description="The anchors, answered in this order.")
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K, description="Categorical tasks: classes listed "
                                                                     "(class_1, prob_1, ...); default: the "
                                                                     "server's --top-k. Link tasks: target rows "
                                                                     "ranked per anchor (at least 1); default: "
                                                                     "the task's k.")
    context_labels: Literal["train", "val", "test", "all"] = Field(
        "all", description="Whose labels a labelled context may show: every label known at the observation time "
                           "(all, the default), or those an evaluation of that split reads (test: train and "
                           "validation labels): with 'test', a test seed's answer is exactly the one `confluence "
                           "evaluate` scored and `predict --split test` wrote. Link tasks show no labels.")


class ExplainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: StrictStr = Field(description="A task of the store (`GET /tasks`).", examples=["flights.dep_delay"])
    anchors: list[Anchor] = Field(min_length=1, description="The anchors, explained in this order (at most the "
                                                            "server's --max-explain-anchors).")
    rows: int = Field(8, ge=1, le=MAX_EXPLAIN_ROWS, description="Context rows listed per explanation, those that "
                                                                 "moved the prediction most first.")
    context_labels: Literal["train", "val", "test", "all"] = Field(
        "all", description="Whose labels a labelled context may show, as for /predict.")


class ExplainResponse(BaseModel):
    task: str
    explanations: list[dict[str, Any]] = Field(description="One per anchor, in request order: the anchor, the "
                                                           "explained quantity and its value, and the context rows "
                                                           "(table, key, role, time, effect, cells) that moved it "
                                                           "most (docs/guide/README.md, 'Why this prediction').")


class PredictResponse(BaseModel):
    task: str
    kind: Literal["cell", "link"] = Field("cell", description="A link task's answer says 'link' (cell tasks' "
                                                              "answers omit the field).")
    key_column: str = Field(description="The anchor table's primary-key column, the first field of each row.")
    target_key_column: str | None = Field(None, description="Link tasks: the field of each row listing the "
                                                            "target rows' keys, likeliest first.")
    rows: list[dict[str, Any]] = Field(description="One row per anchor, in request order, with the columns of "
                                                   "`confluence predict` (docs/design/evaluation.md): the key, "
                                                   "observation_time, prediction, the target type's columns, "
                                                   "p_null. Link tasks: the key, observation_time, the list of "
                                                   "target keys (target_key_column) and the list of their "
                                                   "'score' (calibrated chance of a link within the horizon). "
                                                   "Timestamps are ISO 8601 (UTC); NaN is null.")


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
    max_body_bytes: int = Field(description="Most bytes in a request body (more: 413 before it is read).")
    draws: int = Field(description="Contexts each anchor is answered from (the server's --draws).")
    compiled_shapes: int = Field(description="Batch shapes the model is compiled for (it compiles them all "
                                             "before it is ready).")
    batch_shapes: int = Field(description="Batch shapes to compile before ready.")
    stats: StatsBody


class TaskInfo(BaseModel):
    name: str
    kind: Literal["cell", "link"] = Field("cell", description="cell: predict a value of the anchor row; link: "
                                                              "rank the target table's rows it will link to.")
    anchor_table: str
    key_column: str | None
    key_type: Literal["integer", "string"] | None
    target_type: str
    observation_time: str = Field(description="How a task's observation times were defined at preprocessing.")
    description: str
    blend: dict[str, Any] | None = Field(None, description="With the server's --blend gbdt: the task's blend "
                                         "(weight: the model's share served; the validation scores it was chosen "
                                         "on; best_weight, val_gain, val_ci, guard: the best weight on validation, "
                                         "its gain over LightGBM with a paired 95% interval, and whether that "
                                         "showed it better, else LightGBM is served; trivial, trivial_name, "
                                         "trivial_gain, trivial_ci: the best trivial baseline on validation and "
                                         "the served choice's gain over it; ship: model, LightGBM, blend or "
                                         "trivial, the baseline where nothing was shown better than it); null "
                                         "without one.")
    target_table: str | None = Field(None, description="Link tasks: the table whose rows are ranked.")
    target_key_column: str | None = Field(None, description="Link tasks: the answer rows' field of target keys.")
    k: int | None = Field(None, description="Link tasks: target rows ranked per anchor by default.")


class StoreInfo(BaseModel):
    name: str
    path: str = Field(description="The store's directory name (its absolute path with the server's "
                                  "--model-details).")
    d_t: int = Field(description="Size of the store's text embeddings (the checkpoint's d_t).")
    tasks: int


class ModelCard(BaseModel):
    checkpoint: str = Field(description="The checkpoint directory served: its name (its absolute path with the "
                                        "server's --model-details).")
    checkpoint_sha256: str = Field(description="sha256 over the checkpoint's files (name, NUL, bytes; name order).")
    step: int = Field(description="Training step of the checkpoint.")
    saved_at: str | None = Field(description="When the checkpoint was written (ISO 8601, UTC).")
    parameters: int = Field(description="Number of model parameters.")
    trained_on: list[str] = Field(description="Databases the run trained on.")
    code: dict[str, Any] | None = Field(default=None, description="The code that trained it: version, git commit, "
                                        "dirty (the package differed from the commit), diff_sha256, and with the "
                                        "server's --model-details environment (library versions, device, CPU); "
                                        "null for checkpoints written before 2026-11-25.")
    config: dict[str, Any] = Field(description="The run's model settings, and a summary of its sampler, loss and "
                                               "schedule.")
    store: StoreInfo
    link_tasks: list[str] = Field(default_factory=list, description="The link tasks its link head answers (kind "
                                                                    "'link' in GET /tasks); none without one.")


def _field(loc: tuple[Any, ...]) -> str:
    """('body', 'anchors', 0, 'key') -> 'anchors[0].key' (a long name cut to an excerpt)."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        part = part if isinstance(part, int) else excerpt(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "body"


def _public_errors(errors: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    """pydantic's errors as the answer's `detail` (one line per error, naming the field) and `errors` (each with
    its loc, msg, type and the input, cut to an excerpt); at most MAX_ERRORS of each, then how many more."""
    msgs, out = [], []
    for e in errors[:MAX_ERRORS]:
        if e.get("type") == "json_invalid":
            msgs.append(f"the request body is not valid JSON ({excerpt(str(e.get('ctx', {}).get('error', '')))})")
        else:
            msgs.append(f"{_field(tuple(e.get('loc', ())))}: {excerpt(str(e.get('msg')), 2 * EXCERPT)}")
        loc = [p if isinstance(p, int) else excerpt(str(p)) for p in e.get("loc", ())]
        item = {"loc": loc, "msg": excerpt(str(e.get("msg")), 2 * EXCERPT), "type": e.get("type")}
        if "input" in e:
            text = json.dumps(jsonable_encoder(e["input"]), default=repr)
            item["input"] = e["input"] if len(text) <= EXCERPT else excerpt(text)
        out.append(item)
    if len(errors) > MAX_ERRORS:
        msgs.append(f"and {len(errors) - MAX_ERRORS} more error(s)")
    return "; ".join(msgs), out


def _non_finite(data: Any) -> tuple[str, float] | None:
    """The first NaN or infinity in parsed JSON (Python's parser accepts NaN, Infinity and 1e999): (field, value)."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while stack:
        loc, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return _field(loc), v
        if isinstance(v, dict):
            stack.extend(reversed([((*loc, k), x) for k, x in v.items()]))
        elif isinstance(v, list):
            stack.extend(reversed([((*loc, i), x) for i, x in enumerate(v)]))
    return None


class InvalidBody(RequestError):
    """A body that does not fit the request schema: 422 with pydantic's errors (inputs cut to excerpts)."""

    def __init__(self, message: str, errors: list[dict[str, Any]]):
        super().__init__(message, 422)
        self.errors = errors


def parse_request(body: bytes, max_anchors: int, model: type[BaseModel] = PredictRequest,
                  option: str = "--max-anchors") -> Any:
    """A `POST /predict` body checked: JSON (NaN and infinities refused, naming the field), at most `max_anchors`
    anchors (counted before each is validated), and the schema. RequestError (413 or 422) otherwise. Runs on a
    worker thread: a large body never holds the event loop."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise RequestError("the request body is not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer of more than 4,300 digits
        raise RequestError(f"the request body is not valid JSON ({excerpt(str(exc))})") from None
    bad = _non_finite(data)
    if bad is not None:
        where, value = bad
        name = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        raise RequestError(f"{where}: {name} is not a number JSON allows (no NaN or Infinity)")
    anchors = data.get("anchors") if isinstance(data, dict) else None
    if isinstance(anchors, list) and len(anchors) > max_anchors:
        raise RequestError(f"anchors: {len(anchors)} anchors, at most {max_anchors} per request (the server's "
                           f"{option})", status=413)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidBody(*_public_errors(exc.errors())) from None


def shorten(message: str, values: list[Any]) -> str:
    """`message` with every long string or integer of `values` (the request's task, keys, times) it repeats cut
    to an excerpt, so an error about a 50 MB key does not send the key back."""
    for v in values:
        if isinstance(v, str | int) and not isinstance(v, bool):
            text = str(v)
            if len(text) > EXCERPT:
                for form in {repr(v), text}:
                    message = message.replace(form, excerpt(form))
    return message


def _render(task: str, key_column: str, table: Any, target_key_column: str | None = None) -> bytes:
    """The `POST /predict` answer as JSON bytes (on a worker thread: a 1,000-row answer is no event-loop work);
    with `target_key_column`, a link task's (`table`: its rows, already JSON)."""
    if target_key_column is None:
        body = {"task": task, "key_column": key_column, "rows": json_rows(table)}
    else:
        body = {"task": task, "kind": "link", "key_column": key_column, "target_key_column": target_key_column,
                "rows": table}
    return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()


async def _discard(receive: Callable[[], Awaitable[Message]], budget: int) -> None:
    """Read and drop the rest of a refused request body: at most `budget` bytes, for at most DISCARD_S (nothing is
    kept: memory stays flat)."""
    async def drain() -> None:
        left = budget
        while left > 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            left -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(drain(), DISCARD_S)


async def _reply(send: Callable[[Message], Awaitable[None]], status: int, detail: str,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware in front of every endpoint, before a byte of the body is parsed: the bearer token (every
    path but /health; 401 with `WWW-Authenticate: Bearer`, compared in constant time), then the body size: a
    Content-Length over `max_body`, or a chunked body whose bytes pass it, gets 413 (the rest of the body, up to
    DISCARD_BYTES, read and dropped first: `_discard`; a larger one, or one sent with `Expect: 100-continue`, is
    not read at all). The body read is handed on to the app."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body: int):
        self.app = app
        self.token = None if token is None else token.encode()
        self.max_body = max_body

    def _authorized(self, header: bytes | None) -> bool:
        scheme, _, given = (header or b"").strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token or b"")

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.token is not None and scope["path"] != "/health" and \
                not self._authorized(headers.get(b"authorization")):
            await _reply(send, 401, "this server needs a bearer token (header 'Authorization: Bearer TOKEN'); the "
                                    "one given is missing or wrong", [(b"www-authenticate", b"Bearer")])
            return
        too_big = f"at most {self.max_body} bytes per request (the server's --max-body-bytes)"
        if b"content-length" in headers:
            try:
                declared = int(headers[b"content-length"])
            except ValueError:
                await _reply(send, 400, "Content-Length is not a number")
                return
            if declared > self.max_body:
                if declared <= DISCARD_BYTES and headers.get(b"expect", b"").lower() != b"100-continue":
                    await _discard(receive, declared)
                await _reply(send, 413, f"request body: {declared} bytes, {too_big}")
                return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            size += len(message.get("body", b""))
            if size > self.max_body:
                if message.get("more_body", False):
                    await _discard(receive, DISCARD_BYTES - size)
                await _reply(send, 413, f"request body: more than {self.max_body} bytes, {too_big}")
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body, given = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def create_app(checkpoint: str | Path, db: str | Path, *, batch_size: int | None = None, max_wait_ms: float = 5.0,
               max_anchors: int = 1000, top_k: int = 3, clip_numbers: bool = True, threads: int | None = None,
               warm_up: bool = True, draws: int = DEFAULT_DRAWS, max_body_bytes: int | None = None,
               token: str | None = None, docs: bool = False, model_details: bool = False,
               blend: str | None = None, max_explain_anchors: int = 16) -> FastAPI:
    """The ASGI app serving `checkpoint` on the store `db`. Both load here (a ConfluenceError for a bad path, so a
    server can refuse to start before it binds); the batching worker starts with the app (its lifespan) and
    compiles the model (for every batch shape, unless `warm_up` is off) before `/health` says ready. The other
    settings are ServeSettings'."""
    settings = ServeSettings(batch_size=batch_size, max_wait_ms=max_wait_ms, max_anchors=max_anchors, top_k=top_k,
                             clip_numbers=clip_numbers, threads=threads, warm_up=warm_up, draws=draws,
                             max_body_bytes=max_body_bytes, token=token, docs=docs, model_details=model_details,
                             blend=blend, max_explain_anchors=max_explain_anchors)
    service = PredictionService(checkpoint, db, settings)
    return build_app(service)


_PREDICT_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/PredictRequest"}}}}}
_EXPLAIN_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/ExplainRequest"}}}}}


async def _parsed(request: Request, most: int, model: type[BaseModel], option: str) -> Any:
    """The request's body as `model` (`parse_request`, on a worker thread), or the error response naming the
    field."""
    try:
        return await run_in_threadpool(parse_request, await request.body(), most, model, option)
    except InvalidBody as exc:
        return JSONResponse({"detail": str(exc), "errors": exc.errors}, status_code=exc.status)
    except RequestError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)


def _keys_and_times(req: Any) -> tuple[list[Any], list[str | None] | None]:
    """A request's anchor keys, and their observation times (None when no anchor gives one)."""
    times = [a.observation_time for a in req.anchors]
    return [a.key for a in req.anchors], None if all(t is None for t in times) else times


def _refused(exc: RequestError, req: Any) -> JSONResponse:
    """A request the service refused: its message, with at most an excerpt of each long value it repeats."""
    values = [req.task, *(a.key for a in req.anchors), *(a.observation_time for a in req.anchors)]
    return JSONResponse({"detail": shorten(str(exc), values)}, status_code=exc.status)


def build_app(service: PredictionService) -> FastAPI:
    """The FastAPI app around a loaded `PredictionService` (started and stopped with the app), behind `Guard`."""
    settings = service.settings

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)

    app = FastAPI(title="Confluence prediction service", version=confluence.__version__, lifespan=lifespan,
                  description=f"Predictions of checkpoint step {service.loaded.step} on store "
                              f"'{service.store.name}'. The same rows as `confluence predict --anchors`.",
                  docs_url="/docs" if settings.docs else None, redoc_url=None)
    app.state.service = service
    app.add_middleware(Guard, token=settings.token, max_body=settings.body_limit)

    def openapi() -> dict[str, Any]:
        """FastAPI's schema, with the request bodies /predict and /explain read themselves (PredictRequest,
        ExplainRequest) and the bearer token."""
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, description=app.description,
                               routes=app.routes)
            components = spec.setdefault("components", {})
            for model in (PredictRequest, ExplainRequest):
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.setdefault("schemas", {}).update({**schema.pop("$defs", {}), model.__name__: schema})
            if settings.token is not None:
                components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                spec["security"] = [{"bearer": []}]
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        detail, errors = _public_errors(list(exc.errors()))
        return JSONResponse({"detail": detail, "errors": errors}, status_code=422)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        # the server logs the traceback (Starlette re-raises it); the client gets no traceback
        log.error("internal error on %s %s: %r", request.method, request.url.path, exc)
        return JSONResponse({"detail": "internal server error; the server log has the details"}, status_code=500)

    @app.get("/", include_in_schema=False)
    async def index() -> dict[str, str]:
        return {"service": "confluence", **({"docs": "/docs"} if settings.docs else {}), "openapi": "/openapi.json",
                "health": "/health", "tasks": "/tasks", "model": "/model", "predict": "POST /predict"}

    @app.get("/health", response_model=Health, responses={503: {"model": Health}},
             summary="Ready to answer? (503 while the model compiles; no token needed)")
    async def health() -> JSONResponse:
        b = service.batcher
        status = "failed" if b.failed is not None else ("ready" if b.ready.is_set() else "starting")
        st = service.stats
        body = Health(status=status, store=service.store.name, step=service.loaded.step,
                      batch_size=service.predictor.batch_size, max_wait_ms=settings.max_wait_ms,
                      max_anchors=settings.max_anchors, max_body_bytes=settings.body_limit,
                      draws=service.predictor.draws, compiled_shapes=service.compiled[0],
                      batch_shapes=service.compiled[1],
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
              openapi_extra=_PREDICT_BODY,
              responses={401: {"model": Error, "description": "The server needs a bearer token"},
                         413: {"model": Error, "description": "More anchors than the server's --max-anchors, or "
                                                              "a body over its --max-body-bytes"},
                         422: {"model": Error, "description": "A field is wrong; `detail` names it"},
                         500: {"model": Error},
                         503: {"model": Error, "description": "The server is shutting down"}})
    async def predict(request: Request) -> Response:
        req = await _parsed(request, settings.max_anchors, PredictRequest, "--max-anchors")
        if isinstance(req, Response):
            return req
        keys, times = _keys_and_times(req)
        if service.is_link(req.task):  # ranked on this worker thread by the task's calibrated ranker
            try:
                rows = await run_in_threadpool(service.link_rows, req.task, keys, times, req.top_k)
            except RequestError as exc:
                return _refused(exc, req)
            content = await run_in_threadpool(_render, req.task, service.key_column(req.task), rows,
                                              service.target_key_column(req.task))
            return Response(content, media_type="application/json")
        try:
            job = await run_in_threadpool(service.job, req.task, keys, times, req.top_k, req.context_labels)
        except RequestError as exc:
            return _refused(exc, req)
        try:
            table = await asyncio.wrap_future(service.batcher.submit(job))
        except Unavailable as exc:
            return JSONResponse({"detail": f"{exc}; try again later"}, status_code=503,
                                headers={"retry-after": "5"})
        content = await run_in_threadpool(_render, req.task, service.key_column(req.task), table)
        return Response(content, media_type="application/json")

    @app.post("/explain", response_model=ExplainResponse, summary="Why: the context rows and cells that moved "
                                                                   "each prediction most",
              openapi_extra=_EXPLAIN_BODY,
              responses={401: {"model": Error, "description": "The server needs a bearer token"},
                         413: {"model": Error, "description": "More anchors than the server's "
                                                              "--max-explain-anchors"},
                         422: {"model": Error, "description": "A field is wrong; `detail` names it"},
                         500: {"model": Error}})
    async def explain(request: Request) -> Response:
        req = await _parsed(request, settings.max_explain_anchors, ExplainRequest, "--max-explain-anchors")
        if isinstance(req, Response):
            return req
        keys, times = _keys_and_times(req)
        try:
            out = await run_in_threadpool(service.explain, req.task, keys, times, req.rows, req.context_labels)
        except RequestError as exc:
            return _refused(exc, req)
        return JSONResponse({"task": req.task, "explanations": out})

    return app
