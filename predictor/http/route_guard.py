"""Closes the routes a hostile client could misuse and answers unsupported ones with 404 before KServe does.

- KServe's model-repository routes (``/v2/repository/...``: ``unload`` stops serving for good) answer 404
  unless ``--enable-model-repository`` is given.
- ``/openapi.json``, ``/docs`` and ``/redoc`` answer 404 unless KServe's ``--enable_docs_url true``.
- Model versions (``/v2/models/<name>/versions/...``) and explanations (``:explain``) do not exist here:
  404, not KServe's 501.
- ``/v1/models/<name>...`` and ``/v2/models/<name>...`` for a name this server does not serve: 404 that
  quotes at most :data:`predictor.core.errors.MAX_QUOTED_CHARS` characters of the name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from http import HTTPStatus
from typing import Any

from predictor.core.errors import quoted
from predictor.http.errors import NOT_FOUND, PATH, ApiError

REPOSITORY = re.compile(r"^/v2/repository(/|$)")
DOCS = re.compile(r"^/(openapi\.json|docs|docs/oauth2-redirect|redoc)$")
VERSIONS = re.compile(r"^/v2/models/[^/]+/versions(/|$)")
EXPLAIN = re.compile(r"^/v1/models/[^/]+:explain$")
MODEL_PATH = re.compile(r"^/v[12]/models/([^/:]+)")
MODEL_NAME_PARAM = "model_name"
"""The model's name in KServe's paths (its routes' path parameter)."""


def not_found(message: str) -> ApiError:
    """A 404 in the API's error shape for a path this server does not serve."""
    return ApiError(HTTPStatus.NOT_FOUND, NOT_FOUND, message, source=None)


class RouteGuardMiddleware:
    """Answers 404 for closed, unsupported and unknown-model paths; passes everything else on."""

    def __init__(
        self,
        app: Callable[..., Any],
        served_names: Collection[str],
        enable_model_repository: bool = False,
        enable_docs: bool = False,
    ) -> None:
        self.app = app
        self.served_names = frozenset(served_names)
        self.enable_model_repository = enable_model_repository
        self.enable_docs = enable_docs

    def refusal(self, path: str) -> ApiError | None:
        """The 404 for ``path``, or None when the path is served."""
        if REPOSITORY.match(path) and not self.enable_model_repository:
            return not_found("the model-repository API is disabled (start the server with --enable-model-repository)")
        if DOCS.match(path) and not self.enable_docs:
            return not_found("the API documentation is disabled (start the server with --enable_docs_url true)")
        if VERSIONS.match(path):
            return not_found("model versions are not supported: use /v2/models/<name>/... without /versions")
        if EXPLAIN.match(path):
            return not_found("this model has no explainer: use :predict")
        match = MODEL_PATH.match(path)
        if match and match.group(1) not in self.served_names:
            served = ", ".join(sorted(map(repr, self.served_names)))
            message = f"model {quoted(match.group(1))} is not served here; this server serves {served}"
            return ApiError(HTTPStatus.NOT_FOUND, NOT_FOUND, message, MODEL_NAME_PARAM, source=PATH)
        return None

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """ASGI entry point."""
        error = self.refusal(scope.get("path", "")) if scope["type"] == "http" else None
        if error is None:
            await self.app(scope, receive, send)
        else:
            await error.response()(scope, receive, send)
