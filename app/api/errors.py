"""Every error leaves the server through here, as an OpenAI-style JSON body."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app.core.work import log_refusal
from app.errors import (
    BodyTooLarge,
    ContextLengthExceeded,
    InternalError,
    InvalidJson,
    InvalidRequest,
    ModelNotFound,
    VramgateError,
)

log = logging.getLogger("vramgate.api")


class RouteNotFound(ModelNotFound):
    code = "not_found"


class MethodNotAllowed(InvalidRequest):
    status = 405
    code = "method_not_allowed"


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}
_ERROR_STATUSES = {
    400: "bad input (nothing was queued)",
    401: "a token is configured and was not given",
    403: "a foreign Host or Origin, or an admin route from another machine",
    404: "no such model or route",
    405: "method not allowed on this route",
    413: "body too large, or a job that can never fit on this device",
    415: "the body is not JSON",
    431: "too many or too large headers",
    500: "the model failed on this request",
    503: "overloaded, loading, paused or shutting down; see Retry-After",
    504: "not admitted, or no progress, in time; see Retry-After",
}
# The OpenAPI document's error responses, for every route (all errors share one shape).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    for status, text in _ERROR_STATUSES.items()
}

OLLAMA_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}, "code": {"type": "string"}},
}
# Ollama's routes answer errors in Ollama's shape (see `error_response`).
OLLAMA_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"schema": OLLAMA_ERROR_SCHEMA}}}
    for status, text in _ERROR_STATUSES.items()
}

OLLAMA_PREFIX = "/api/"
ANTHROPIC_PREFIX = "/v1/messages"  # and /v1/messages/count_tokens

# Anthropic's error types by HTTP status (its SDKs pick their exception by the status).
ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message", "code"],
            "properties": {
                "type": {"type": "string"},
                "message": {"type": "string"},
                "code": {"type": "string"},  # vramgate's stable code
                "param": {"type": ["string", "null"]},
            },
        },
    },
}
ANTHROPIC_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {
        "description": text,
        "content": {"application/json": {"schema": ANTHROPIC_ERROR_SCHEMA}},
    }
    for status, text in _ERROR_STATUSES.items()
}


def anthropic_body(error: VramgateError) -> dict[str, Any]:
    """The error in Anthropic's shape, with our stable code, param and details beside; a
    context overflow in Anthropic's own words ("prompt is too long: N tokens > M maximum",
    which Claude Code and litellm recognise)."""
    if error.status < 500:
        kind = ANTHROPIC_TYPES.get(error.status, "invalid_request_error")
    else:
        kind = ANTHROPIC_TYPES.get(error.status, "api_error")
    inner = {**error.body()["error"], "type": kind}
    if isinstance(error, ContextLengthExceeded):
        inner["message"] = error.anthropic_message
    return {"type": "error", "error": inner}


def ollama_message(error: VramgateError) -> str:
    """The error's message as Ollama's routes say it: a context overflow in Ollama's own
    words ("the input length exceeds the context length", with the numbers)."""
    if isinstance(error, ContextLengthExceeded):
        return error.ollama_message
    return error.message


def error_response(error: VramgateError, path: str = "") -> JSONResponse:
    """The error in OpenAI's shape; on Ollama's routes (`path` under /api/) in Ollama's:
    `error` is the message (its clients raise it as is), `code` our stable code beside it;
    on Anthropic's (/v1/messages) in Anthropic's, `code` beside its `type`."""
    body = error.body()
    if path.startswith(OLLAMA_PREFIX):
        body = {"error": ollama_message(error), "code": error.code}
    elif path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/"):
        body = anthropic_body(error)
    return JSONResponse(body, status_code=error.status, headers=error.headers())


def from_validation_errors(errors: Sequence[Any]) -> VramgateError:
    """The first of pydantic's errors, as our 400."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return InvalidJson("the request body is not valid JSON")
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request")
    if first.get("type") == "missing" and not loc:
        message = "the request needs a JSON body"
    return InvalidRequest(f"{param}: {message}" if param else message, param=param)


def from_http(exc: HTTPException) -> VramgateError:
    if exc.status_code == 413:
        return BodyTooLarge(str(exc.detail))
    if exc.status_code == 404:
        return RouteNotFound("no such route")
    if exc.status_code == 405:
        return MethodNotAllowed("method not allowed on this route")
    if 400 <= exc.status_code < 500:  # e.g. FastAPI's "There was an error parsing the body"
        return InvalidRequest(str(exc.detail))
    return InternalError("internal server error")


def counted(scope: Mapping[str, Any], error: VramgateError) -> VramgateError:
    """`error`, counted by its code (/metrics' vramgate_rejections, /status' counters)
    and logged with its route, unless the service already did both (a refusal of a
    model's request is counted with its model there)."""
    if not error.counted:
        error.counted = True
        fleet = getattr(getattr(scope.get("app"), "state", None), "fleet", None)
        if fleet is not None:
            fleet.metrics.observe_refusal(error.metric_label)
        log_refusal(error, f"{scope.get('method', '')} {scope.get('path', '')}")
    return error


async def _vramgate_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, VramgateError)
    return error_response(counted(request.scope, exc), request.url.path)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    error = counted(request.scope, from_validation_errors(exc.errors()))
    return error_response(error, request.url.path)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return error_response(counted(request.scope, from_http(exc)), request.url.path)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    error = InternalError("internal server error")
    return error_response(counted(request.scope, error), request.url.path)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(VramgateError, _vramgate_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
