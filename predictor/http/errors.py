"""API errors: one exception type and the one body it becomes, whatever the status.

Every error body has our ``{"error": {"message", "type", "param"}}`` object and FastAPI's ``detail``, as the
hosted API (a FastAPI app) answers: a ``[{"loc", "msg", "type"}]`` list when a part of the request is at fault,
``loc`` naming where (``["body", "questions", "q", "criteria"]``, ``["header", "Authorization"]``,
``["path", "model_name"]``); the message alone (FastAPI's ``HTTPException`` shape) when nothing in the request
is (a full queue, a server warming up, a route that does not exist). ``param`` is the field or header name,
or null. The message itself starts with the field path too (``questions.q.criteria: ...``): clients often
log only the message. Field-level validation errors are 422, as in FastAPI and the hosted API.

A full admission queue is 429 (``too_many_requests``) with ``Retry-After`` and ``retry-after-ms``; 503 stays
for a server that cannot serve at all now (warming up, draining, engine down). The TypeSafe SDK raises
``TypeSafeRateLimitError`` for a 429 (with ``retry_after_ms``) and ``TypeSafeInternalServerError`` for a 503;
both it and ``jev-lite`` retry either after the delay the headers give (``retry-after-ms`` read first).
"""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from predictor.core.errors import (
    BadInput,
    Location,
    ModelNotServed,
    PicklableError,
    ServiceError,
    TooLarge,
    Unavailable,
    Unreadable,
    format_param,
    parse_param,
    quoted,
)

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
TOO_LARGE = "request_too_large"
UNSUPPORTED_MEDIA = "unsupported_media_type"
UNAVAILABLE = "service_unavailable"
TOO_MANY_REQUESTS = "too_many_requests"
METHOD_NOT_ALLOWED = "method_not_allowed"
ENGINE_ERROR = "engine_error"
AUTHENTICATION = "authentication_error"
TIMEOUT = "request_timeout"
BODY = "body"
HEADER = "header"
PATH = "path"
"""Where a ``loc`` starts (FastAPI's request parts): the body, a header, the URL path."""
OVERLOADED = "overloaded"
"""The :class:`~predictor.core.errors.Unavailable` reason of a request shed for capacity (answered 429)."""


class ApiError(PicklableError):
    """An error answered with ``status`` and a body naming the offending part of the request: ``source`` (the body,
    a header, the path; None when no part of the request is at fault) and, within it, the field ``loc``."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        param: str | Sequence[int | str] | None = None,
        headers: dict[str, str] | None = None,
        kind: str | None = None,
        source: str | None = BODY,
    ) -> None:
        self.loc: Location = parse_param(param) if isinstance(param, str) else tuple(param or ())
        self.param = format_param(self.loc) or None
        super().__init__(f"{self.param}: {message}" if self.param else message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}
        self.kind = kind or error_type
        self.source = source

    def full_message(self) -> str:
        """The message, prefixed by the field path when there is one."""
        return f"{self.param}: {self.message}" if self.param else self.message

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        message = self.full_message()
        detail: str | list[dict[str, Any]] = message
        if self.source is not None:
            detail = [{"loc": [self.source, *self.loc], "msg": message, "type": self.kind}]
        return {"error": {"message": message, "type": self.error_type, "param": self.param}, "detail": detail}

    def response(self) -> JSONResponse:
        """The error as a JSON response."""
        return JSONResponse(status_code=self.status, content=self.body(), headers=self.headers)

    def under(self, prefix: Sequence[int | str]) -> ApiError:
        """The same error for a field under ``prefix`` (an item of a V1/V2/batch request)."""
        return ApiError(
            self.status, self.error_type, self.message, (*prefix, *self.loc), self.headers, self.kind, self.source
        )


def bad_request(message: str, param: str | Sequence[int | str] | None = None, source: str = BODY) -> ApiError:
    """A 400 ``invalid_request_error`` (the body, or the header ``param`` with ``source`` HEADER, cannot be read)."""
    return ApiError(HTTPStatus.BAD_REQUEST, INVALID_REQUEST, message, param, source=source)


def invalid_field(message: str, param: str | Sequence[int | str] | None, kind: str = "value_error") -> ApiError:
    """A 422 ``invalid_request_error``: the body was read but a field breaks a rule."""
    return ApiError(HTTPStatus.UNPROCESSABLE_ENTITY, INVALID_REQUEST, message, param, kind=kind)


def from_service_error(exc: ServiceError) -> ApiError:
    """The HTTP error for a domain error of the service (503s carry ``Retry-After``)."""
    if isinstance(exc, Unreadable):
        return bad_request(exc.message, exc.loc)
    if isinstance(exc, BadInput):
        return invalid_field(exc.message, exc.loc, exc.kind)
    if isinstance(exc, ModelNotServed):
        return ApiError(HTTPStatus.NOT_FOUND, NOT_FOUND, exc.message, exc.loc)
    if isinstance(exc, TooLarge):
        return ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, TOO_LARGE, exc.message, exc.loc)
    if isinstance(exc, Unavailable):
        return unavailable(exc)
    return ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, ENGINE_ERROR, exc.message, exc.loc, source=None)


def unavailable(exc: Unavailable) -> ApiError:
    """429 for a request shed for capacity, else 503; both with ``Retry-After`` (seconds) and ``retry-after-ms``."""
    headers = {"Retry-After": str(exc.retry_after), "retry-after-ms": str(exc.retry_after * 1000)}
    if exc.reason == OVERLOADED:
        return ApiError(HTTPStatus.TOO_MANY_REQUESTS, TOO_MANY_REQUESTS, exc.message, headers=headers, source=None)
    return ApiError(HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE, exc.message, headers=headers, source=None)


def route_error(request: Request, exc: HTTPException) -> ApiError:
    """Starlette's own refusals (no route for the path: 404; a route without the method: 405) in our shape."""
    where = quoted(request.url.path)
    if exc.status_code == HTTPStatus.NOT_FOUND:
        return ApiError(exc.status_code, NOT_FOUND, f"no route {where} on this server", source=None)
    headers = dict(exc.headers or {})
    if exc.status_code == HTTPStatus.METHOD_NOT_ALLOWED:
        allowed = headers.get("Allow") or headers.get("allow") or ""
        message = f"{request.method} is not allowed on {where}" + (f"; use {allowed}" if allowed else "")
        return ApiError(exc.status_code, METHOD_NOT_ALLOWED, message, headers=headers, source=None)
    return ApiError(exc.status_code, INVALID_REQUEST, str(exc.detail), headers=headers, source=None)


async def http_exception_handler(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI handler for Starlette's ``HTTPException`` (undefined routes, wrong methods)."""
    assert isinstance(exc, HTTPException)
    return route_error(request, exc).response()


async def service_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI handler for the service's domain errors (:mod:`predictor.core.errors`)."""
    assert isinstance(exc, ServiceError)
    return from_service_error(exc).response()


async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI handler for :class:`ApiError`."""
    assert isinstance(exc, ApiError)
    return exc.response()


async def validation_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's request-model errors (KServe V2 bodies) as a 422 naming the field in our shape."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request body", "type": "value_error"}
    location = list(first.get("loc", ()))
    source = BODY
    if location and location[0] in (BODY, HEADER, PATH, "query", "cookie"):
        source, location = str(location[0]), location[1:]
    if location and isinstance(location[0], str) and location[0][:1].isupper():
        location = location[1:]  # the request model's class name, not a field
    message = str(first.get("msg", "invalid request body"))
    kind = str(first.get("type", "value_error"))
    error = ApiError(
        HTTPStatus.UNPROCESSABLE_ENTITY, INVALID_REQUEST, message, tuple(location), kind=kind, source=source
    )
    return error.response()
