"""Who may call KServe's gRPC inference service, and what its errors become.

- API keys: with keys configured (``--api-key-file``, ``$CLEF_API_KEYS``), every gRPC method needs the metadata
  ``authorization: Bearer <key>``, probes included (Kubernetes probes the HTTP port); without it the call ends
  ``UNAUTHENTICATED`` before KServe's servicer runs.
- ``RepositoryModelLoad`` / ``RepositoryModelUnload`` end ``UNIMPLEMENTED`` unless ``--enable-model-repository``,
  as their HTTP routes answer 404.
- Our errors (:class:`~predictor.http.errors.ApiError`, :class:`~predictor.core.errors.ServiceError`) keep their
  meaning: a bad request is ``INVALID_ARGUMENT`` naming the field, a busy or draining server ``UNAVAILABLE``
  (KServe's own mapping would call them ``INTERNAL``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import grpc
from grpc import aio

from predictor.core.errors import ServiceError
from predictor.http.auth import ApiKeys, bearer_token
from predictor.http.errors import ApiError, from_service_error

SERVICE = "inference.GRPCInferenceService"
REPOSITORY_METHODS = frozenset({f"/{SERVICE}/RepositoryModelLoad", f"/{SERVICE}/RepositoryModelUnload"})
#: gRPC status of each HTTP status our errors carry.
STATUS_CODES = {
    HTTPStatus.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.UNPROCESSABLE_ENTITY: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.UNSUPPORTED_MEDIA_TYPE: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    HTTPStatus.UNAUTHORIZED: grpc.StatusCode.UNAUTHENTICATED,
    HTTPStatus.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    HTTPStatus.REQUEST_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    HTTPStatus.SERVICE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    # a full queue: gRPC's retryable status (RESOURCE_EXHAUSTED means a quota, which retrying does not cure)
    HTTPStatus.TOO_MANY_REQUESTS: grpc.StatusCode.UNAVAILABLE,
}


def refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that ends any unary call with ``code`` (the request is not even decoded)."""

    async def refuse(request: bytes, context: aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(refuse)


def metadata_token(metadata: Any) -> bytes | None:
    """The Bearer token of a call's ``authorization`` metadata, if any."""
    pairs = [(str(key).encode(), value.encode() if isinstance(value, str) else value) for key, value in metadata or ()]
    return bearer_token(pairs)


class AccessInterceptor(aio.ServerInterceptor):
    """Refuses calls without a valid key, and the repository methods unless they are enabled."""

    def __init__(self, keys: ApiKeys | None, enable_model_repository: bool) -> None:
        self.keys = keys if keys is not None and keys.enabled else None
        self.enable_model_repository = enable_model_repository

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Check the key first, then the method; pass allowed calls on."""
        if self.keys is not None:
            token = metadata_token(details.invocation_metadata)
            if token is None:
                return refusal(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "an API key is required: send the metadata 'authorization: Bearer <key>'",
                )
            if not self.keys.accepts(token):
                return refusal(grpc.StatusCode.UNAUTHENTICATED, "the API key is not valid")
        if details.method in REPOSITORY_METHODS and not self.enable_model_repository:
            return refusal(
                grpc.StatusCode.UNIMPLEMENTED,
                "the model-repository API is disabled (start the server with --enable-model-repository)",
            )
        return await continuation(details)


def grpc_status(error: ApiError | ServiceError) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message of one of our errors (the message names the field, as over HTTP)."""
    api_error = from_service_error(error) if isinstance(error, ServiceError) else error
    message = api_error.full_message()
    retry_after = api_error.headers.get("Retry-After")
    if retry_after:
        message = f"{message} (retry after {retry_after} s)"
    return STATUS_CODES.get(HTTPStatus(api_error.status), grpc.StatusCode.INTERNAL), message
