"""The cluster's front door: every HTTP request goes to a replica, chosen by free bytes.

A request is read (bounded as a single server bounds it), sent to the replica the
router ranks first, and answered with what that replica answers, streamed as it comes.
When a replica refuses it in a way another may not (its queue is full, the job is too
big for its device, it is paused, stopping or failed) or dies before it answered, the
request goes to another replica before the caller sees anything; an answer already
streaming cannot move. `X-Vramgate-Tries` says how many replicas were asked. `GET
/status` lists every replica with its own /status; `/replicas/{id}/...` asks one
replica (its /metrics, its /status).
"""

# No `from __future__ import annotations`: FastAPI reads the routes' parameter types
# after Ray Serve has rewritten the class's methods, away from this module's names.
import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from app.cluster import registry  # by attribute: see app.cluster.registry
from app.cluster.asgi import Forwarded, Head, caller_address
from app.cluster.replica import REPLICA_HEADER

log = logging.getLogger("vramgate.cluster")

# Refusals that another replica may not give: the request moves there.
RETRY_CODES = {"queue_full", "exceeds_device_memory", "out_of_memory", "paused"}
RETRY_CODES |= {"shutting_down", "device_failed", "model_loading"}
# A GGUF model's runner that ended or failed a valid request (app.errors.RunnerStopped,
# RunnerFailed): that replica reloads it on its next request; another's may be sound.
RETRY_CODES |= {"model_runner_stopped", "model_runner_failed"}
LOST_CODE = "device_failed"  # no replica could answer: every one asked was lost
MAX_TRIES = 4  # replicas asked for one request (a dead one, a refusing one, ...)
TRIES_HEADER = "x-vramgate-tries"  # how many replicas were asked
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]

ingress_app = FastAPI(title="vramgate cluster", openapi_url=None, docs_url=None)
# Every name the class uses is defined above it: Ray Serve pickles the class, with the
# globals its methods name, when the decorator runs.


def _model_of(body: bytes) -> str | None:
    """The `model` a JSON request names (what the router ranks replicas for)."""
    if not body.startswith(b"{"):
        return None
    try:
        model = orjson.loads(body).get("model")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return model if isinstance(model, str) else None


def streams(path: str, body: bytes) -> bool:
    """Whether the answer may stream, from the request: OpenAI's `"stream": true`,
    Ollama's routes unless `"stream": false`, a pull's progress. Other answers are
    fetched in one call (a streamed call costs Ray one message per chunk)."""
    if path == "/admin/models/pull":
        return True
    try:
        asked = orjson.loads(body).get("stream") if body.startswith(b"{") else None
    except (orjson.JSONDecodeError, AttributeError):
        return False
    ollama = path.startswith("/api/") and path not in ("/api/embed", "/api/embeddings")
    return asked is True or (ollama and asked is not False)


def _error_code(body: bytes) -> str | None:
    """The stable code of a refusal, in OpenAI's shape or Ollama's."""
    try:
        error = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(error, dict) and isinstance(error.get("error"), dict):
        error = error["error"]
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _response(head: Head, body: bytes) -> Response:
    return Response(body, status_code=head.status, headers=_headers(head))


def _headers(head: Head) -> dict[str, str]:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
    headers.pop("content-length", None)
    return headers


def _stream_error(path: str, media: str, message: str) -> bytes | None:
    """The event that ends a stream whose replica was lost after it began, in the shape
    the server itself ends a stream that fails midway (a runner that died): OpenAI's
    `data: {"error": ...}` and `[DONE]`; on other event streams (Anthropic's
    /v1/messages, images) an `error` event; Ollama's NDJSON `{"error", "code"}`. None
    for a stream with no error event of its own (audio bytes)."""
    error = {"message": message, "type": "server_error", "param": None, "code": LOST_CODE}
    if media.startswith("text/event-stream"):
        if path in ("/v1/chat/completions", "/v1/completions"):
            return b"data: " + orjson.dumps({"error": error}) + b"\n\ndata: [DONE]\n\n"
        return b"event: error\ndata: " + orjson.dumps({"type": "error", "error": error}) + b"\n\n"
    if media.startswith("application/x-ndjson"):
        return orjson.dumps({"error": message, "code": LOST_CODE}) + b"\n"
    return None


async def _rest(answer: DeploymentResponseGenerator, path: str, media: str) -> AsyncIterator[bytes]:
    """The rest of a stream. Its replica lost midway (its machine left the cluster, its
    process died: Ray raises `ActorDiedError`, a `RayError`), the stream cannot move, as
    its beginning has reached the caller: it ends with an error event where its shape
    has one, and otherwise (a raw body) its connection closes before its end."""
    try:
        async for part in answer:
            if isinstance(part, bytes):
                yield part
    except RayError as exc:
        log.warning("a replica was lost in the middle of a stream on %s: %s", path, exc)
        end = _stream_error(path, media, "the replica answering was lost; the answer is incomplete")
        if end is None:
            raise
        yield end


def _error(status: int, code: str, message: str, retry_after: str | None = None) -> Response:
    """An error in OpenAI's shape, with vramgate's stable code (as a replica answers)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    error = {"message": message, "type": kind, "param": None, "code": code}
    headers = {"Retry-After": retry_after} if retry_after else None
    return JSONResponse({"error": error}, status_code=status, headers=headers)


# The ingress runs on the head machine, beside Ray Serve's one HTTP proxy
# (`proxy_location="HeadOnly"`, app.cluster.deploy). Ray gives the head node a resource
# of its own, "node:__internal_head__" (ray/_common/constants.py,
# HEAD_NODE_RESOURCE_NAME; Ray's own train state actor is pinned there the same way,
# with 0.001 of it). Placed anywhere else, the ingress shared the fate of a worker
# machine: when that machine left the cluster, every request the ingress held failed in
# the proxy, which does not retry. Ray Serve's proxy logs such a request as "Request
# failed: The actor died unexpectedly before finishing this task." and counts it a 500
# (ray/serve/_private/http_util.py, get_http_response_status), sends no answer of its
# own for it (send_http_response_on_exception answers 408, 429 and 503 only), and its
# uvicorn answers the bare 500 "Internal Server Error" that callers saw. On the head
# the ingress is lost only with the proxy itself.
HEAD_NODE = {"node:__internal_head__": 0.001}


@serve.deployment(
    ray_actor_options={"num_cpus": 0, "resources": HEAD_NODE}, max_ongoing_requests=4096
)
@serve.ingress(ingress_app)
class Ingress:
    def __init__(self, replicas: DeploymentHandle, max_body_bytes: int) -> None:
        self._replicas = replicas
        self._max_body = max_body_bytes

    @ingress_app.get("/status")
    async def status(self, request: Request) -> Response:
        """The cluster: each replica's own figures and its /status document, asked with
        the caller's headers, so that each replica's guard (its token) decides."""
        replicas, headers = [], tuple(request.headers.raw)
        for replica, stats in await self._figures():  # one at a time: calls made within
            try:  # one request share its id, which Ray's router matches answers by
                head, body = await asyncio.wait_for(self._ask(replica, "/status", headers), 10)
            except (RayError, TimeoutError):
                replicas.append({**stats, "replica": replica, "status": None})
                continue
            if head.status != 200:  # refused (no token, a foreign Host): that is the answer
                return _response(head, body)
            replicas.append({**stats, "replica": replica, "status": orjson.loads(body)})
        return JSONResponse({"cluster": "ray-serve", "replicas": replicas})

    async def _figures(self) -> list[tuple[str, dict[str, Any]]]:
        if not registry.ROUTERS:  # the handle makes its router on its first call
            await self._ask(None, "/health", ((b"host", b"127.0.0.1"),))
        router = next(iter(registry.ROUTERS))
        return sorted(router.replica_figures())

    async def _ask(
        self, replica: str | None, path: str, headers: tuple[tuple[bytes, bytes], ...]
    ) -> tuple[Head, bytes]:
        """One replica's whole answer to a GET (`replica` None: any one)."""
        head, body = await self._replicas.answer_whole.remote(
            Forwarded("GET", path, headers=headers), pin=replica
        )
        return head, body

    def _call(
        self, request: Forwarded, model: str | None, avoid: tuple[str, ...]
    ) -> DeploymentResponseGenerator:
        handle = self._replicas.options(stream=True)
        answer = handle.answer.remote(request, model=model, avoid=avoid)
        assert isinstance(answer, DeploymentResponseGenerator)
        return answer

    @ingress_app.api_route("/replicas/{replica}/{path:path}", methods=METHODS)
    async def one_replica(self, request: Request, replica: str, path: str) -> Response:
        """A request for one replica alone (its /metrics, its /status)."""
        if replica not in {known for known, _ in await self._figures()}:
            return _error(404, "not_found", f"no replica {replica!r} (GET /status lists them)")
        forwarded = await self._forwarded(request, "/" + path)
        if not isinstance(forwarded, Forwarded):
            return forwarded
        try:
            head, body = await self._replicas.answer_whole.remote(forwarded, pin=replica)
        except RayError as exc:  # that replica was lost: no other one can answer for it
            return _error(503, LOST_CODE, f"replica {replica!r} was lost: {exc}", "1")
        return _response(head, body)

    @ingress_app.api_route("/{path:path}", methods=METHODS)
    async def forward(self, request: Request, path: str) -> Response:
        forwarded = await self._forwarded(request, "/" + path)
        if not isinstance(forwarded, Forwarded):
            return forwarded
        model, failure = _model_of(forwarded.body), None
        tried: list[str] = []
        streamed = streams(forwarded.path, forwarded.body)
        for attempt in range(MAX_TRIES):
            try:
                head, rest = await self._first(forwarded, model, tuple(tried), streamed)
                head.headers.append((TRIES_HEADER.encode(), str(attempt + 1).encode()))
                if isinstance(rest, DeploymentResponseGenerator):
                    media = head.header("content-type") or ""
                    return StreamingResponse(
                        _rest(rest, forwarded.path, media),
                        status_code=head.status,
                        headers=_headers(head),
                    )
            except RayError as exc:  # the replica died or is gone: another one answers
                failure = exc
                log.warning("a replica failed a request (try %d): %s", attempt + 1, exc)
                await asyncio.sleep(0.05 * 2**attempt)
                continue
            if not self._another(head, rest, tried):
                return _response(head, rest)
        return _error(503, LOST_CODE, f"no replica could answer: {failure}", "1")

    async def _first(
        self, forwarded: Forwarded, model: str | None, avoid: tuple[str, ...], streamed: bool
    ) -> tuple[Head, bytes | DeploymentResponseGenerator]:
        """The answer's head, and its body: whole, or (a stream that is not an error)
        the rest of the stream to read."""
        if not streamed:
            whole = self._replicas.answer_whole.remote(forwarded, model=model, avoid=avoid)
            head, body = await whole
            return head, body
        answer = self._call(forwarded, model, avoid)
        head = await answer.__anext__()
        assert isinstance(head, Head)
        if head.status < 400:
            return head, answer
        return head, b"".join([part async for part in answer if isinstance(part, bytes)])

    def _another(self, head: Head, body: bytes, tried: list[str]) -> bool:
        """Whether a refusal goes to another replica: one that another may not give, and
        a replica not asked yet (`tried` gains this one)."""
        code = _error_code(body) if head.status >= 400 else None
        replica = head.header(REPLICA_HEADER) or ""
        if code not in RETRY_CODES or replica in tried:
            return False
        tried.append(replica)
        routers = list(registry.ROUTERS)
        known = len(routers[0].replica_figures()) if routers else MAX_TRIES
        return len(tried) < known

    async def _forwarded(self, request: Request, path: str) -> Forwarded | Response:
        """The request as a replica needs it; a body over the bound is a 413 here."""
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body:
            return _error(413, "request_too_large", f"the body is over {self._max_body} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self._max_body:
                return _error(413, "request_too_large", f"the body is over {self._max_body} bytes")
        return Forwarded(
            request.method,
            path,
            request.url.query.encode(),
            tuple(request.headers.raw),
            bytes(body),
            caller_address(request.client),
        )
