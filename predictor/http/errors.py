"""API errors: one exception type and the body it becomes.

Every error body has our ``{"error": {"message", "type", "param"}}`` object and, for the TypeSafe SDK,
FastAPI's ``{"detail": [{"loc", "msg", "type"}]}`` list; ``loc`` is the field path after ``"body"``.
The message itself starts with the field path too (``questions.q.criteria: ...``): clients often log
only the message. Field-level validation errors are 422, as in FastAPI and the hosted API.
"""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

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
)

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
TOO_LARGE = "request_too_large"
UNSUPPORTED_MEDIA = "unsupported_media_type"
UNAVAILABLE = "service_unavailable"
ENGINE_ERROR = "engine_error"
AUTHENTICATION = "authentication_error"
TIMEOUT = "request_timeout"


class ApiError(PicklableError):
    """An error answered with ``status`` and a body naming the offending field (``loc``)."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        param: str | Sequence[int | str] | None = None,
        headers: dict[str, str] | None = None,
        kind: str | None = None,
    ) -> None:
        self.loc: Location = parse_param(param) if isinstance(param, str) else tuple(param or ())
        self.param = format_param(self.loc) or None
        super().__init__(f"{self.param}: {message}" if self.param else message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}
        self.kind = kind or error_type

    def full_message(self) -> str:
        """The message, prefixed by the field path when there is one."""
        return f"{self.param}: {self.message}" if self.param else self.message

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        message = self.full_message()
        return {
            "error": {"message": message, "type": self.error_type, "param": self.param},
            "detail": [{"loc": ["body", *self.loc], "msg": message, "type": self.kind}],
        }

    def response(self) -> JSONResponse:
        """The error as a JSON response."""
        return JSONResponse(status_code=self.status, content=self.body(), headers=self.headers)

    def under(self, prefix: Sequence[int | str]) -> ApiError:
        """The same error for a field under ``prefix`` (an item of a V1/V2/batch request)."""
        return ApiError(self.status, self.error_type, self.message, (*prefix, *self.loc), self.headers, self.kind)


def bad_request(message: str, param: str | Sequence[int | str] | None = None) -> ApiError:
    """A 400 ``invalid_request_error`` (the body cannot be read at all)."""
    return ApiError(HTTPStatus.BAD_REQUEST, INVALID_REQUEST, message, param)


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
        headers = {"Retry-After": str(exc.retry_after)}
        return ApiError(HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE, exc.message, exc.loc, headers)
    return ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, ENGINE_ERROR, exc.message, exc.loc)


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
    if location and location[0] == "body":
        location = location[1:]
    if location and isinstance(location[0], str) and location[0][:1].isupper():
        location = location[1:]  # the request model's class name, not a field
    message = str(first.get("msg", "invalid request body"))
    return invalid_field(message, tuple(location), str(first.get("type", "value_error"))).response()
