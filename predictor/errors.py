"""API errors: one exception type and the ``{"error": {"message", "type", "param"}}`` body it becomes."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from predictor.service_errors import BadInput, ModelNotServed, ServiceError, Unavailable

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
TOO_LARGE = "request_too_large"
UNSUPPORTED_MEDIA = "unsupported_media_type"
UNAVAILABLE = "service_unavailable"
ENGINE_ERROR = "engine_error"


class ApiError(Exception):
    """An error answered with ``status`` and a body naming the offending field (``param``)."""

    def __init__(
        self, status: int, error_type: str, message: str, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.param = param or None
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param}}

    def response(self) -> JSONResponse:
        """The error as a JSON response."""
        return JSONResponse(status_code=self.status, content=self.body(), headers=self.headers or None)


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 ``invalid_request_error``."""
    return ApiError(HTTPStatus.BAD_REQUEST, INVALID_REQUEST, message, param)


def join_param(prefix: str, param: str | None) -> str | None:
    """``prefix.param`` (``instances[2]`` + ``questions.a`` → ``instances[2].questions.a``)."""
    if not prefix:
        return param or None
    return f"{prefix}.{param}" if param else prefix


def from_service_error(exc: ServiceError) -> ApiError:
    """The HTTP error for a domain error of the service (503s carry ``Retry-After``)."""
    if isinstance(exc, BadInput):
        return bad_request(exc.message, exc.param)
    if isinstance(exc, ModelNotServed):
        return ApiError(HTTPStatus.NOT_FOUND, NOT_FOUND, exc.message, exc.param)
    if isinstance(exc, Unavailable):
        headers = {"Retry-After": str(exc.retry_after)}
        return ApiError(HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE, exc.message, exc.param, headers)
    return ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, ENGINE_ERROR, exc.message, exc.param)


async def service_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI handler for the service's domain errors (:mod:`predictor.service_errors`)."""
    assert isinstance(exc, ServiceError)
    return from_service_error(exc).response()


async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI handler for :class:`ApiError`."""
    assert isinstance(exc, ApiError)
    return exc.response()


async def validation_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's request-model errors (KServe V2 bodies) as a 400 naming the field, not a 422."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request body"}
    location = list(first.get("loc", ()))
    if location and location[0] == "body":
        location = location[1:]
    if location and isinstance(location[0], str) and location[0][:1].isupper():
        location = location[1:]  # the request model's class name, not a field
    return bad_request(str(first.get("msg", "invalid request body")), format_param(location)).response()


def format_param(location: list[int | str] | tuple[int | str, ...]) -> str:
    """A field path such as ``inputs[0].shape`` from a location like ``("inputs", 0, "shape")``."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
