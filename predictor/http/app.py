"""The predictor's HTTP app and server, assembled: KServe's ModelServer with the API installed on its app.

:func:`install_api` adds the middleware, error handlers and routes to KServe's app; :func:`build_server` makes the
:class:`~predictor.http.server.ClefModelServer` (with its gRPC server when asked for) that serves them, and
:func:`register_aliases` serves the model under its other names. The settings come from the flags
(:mod:`predictor.http.api_args`); the API keys (:func:`api_keys`) are shared by HTTP and gRPC.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from predictor.core.errors import ServiceError
from predictor.http.api_config import ApiConfig
from predictor.http.auth import API_KEYS_ENV, ApiKeyMiddleware, ApiKeys
from predictor.http.errors import (
    ApiError,
    api_error_handler,
    http_exception_handler,
    service_error_handler,
    validation_error_handler,
)
from predictor.http.health import install_health_routes
from predictor.http.http_body import RequestBodyMiddleware
from predictor.http.jev_api import API_BASES, add_routes
from predictor.http.observe import RequestObserverMiddleware
from predictor.http.route_guard import RouteGuardMiddleware
from predictor.http.server import ClefModelServer, GrpcSettings
from predictor.http.shutdown import GracefulShutdown

if TYPE_CHECKING:
    import kserve

    from predictor.serving.lifecycle import Lifecycle
    from predictor.serving.options import ServingOptions
    from predictor.serving.service import SystemOneService


class ServedModel(Protocol):
    """What the HTTP layer needs of the served model (:class:`predictor.model.ClefModel`, the layer above)."""

    name: str
    service: SystemOneService | None
    lifecycle: Lifecycle
    options: ServingOptions


def api_keys(config: ApiConfig) -> ApiKeys:
    """The API keys of ``config.api_key_file`` and the environment (HTTP and gRPC share them)."""
    return ApiKeys(config.api_key_file, os.environ.get(API_KEYS_ENV))


def grpc_settings(config: ApiConfig, keys: ApiKeys) -> GrpcSettings | None:
    """KServe's gRPC server as ``config`` asks for it, or None (the default: ``--enable_grpc`` is off)."""
    if config.grpc is None:
        return None
    return GrpcSettings(
        port=config.server.grpc_port,
        max_message_bytes=min(config.max_body_bytes, config.grpc.max_receive_bytes),
        max_send_bytes=config.grpc.max_send_bytes,
        max_threads=config.server.max_threads,
        keys=keys,
        enable_model_repository=config.enable_model_repository,
    )


def install_api(app: FastAPI, model: ServedModel, config: ApiConfig, keys: ApiKeys) -> None:
    """Add the middleware, error handlers and routes to KServe's app (before the server starts).

    Middleware, outermost first: request ids and metrics, the shutdown window (503 once SIGTERM came), API keys,
    closed routes, request bodies.
    """
    assert model.service is not None, "load the model first"
    app.add_middleware(RequestBodyMiddleware, max_body_bytes=config.max_body_bytes, body_timeout=config.body_timeout)
    app.add_middleware(
        RouteGuardMiddleware,
        served_names=(model.name, *model.options.policy.aliases),
        enable_model_repository=config.enable_model_repository,
        enable_docs=config.server.enable_docs_url,
    )
    if keys.enabled:
        app.add_middleware(ApiKeyMiddleware, keys=keys)
    app.add_middleware(
        GracefulShutdown, lifecycle=model.lifecycle, delay_s=config.shutdown_delay, drain_s=config.limits.drain_s
    )
    app.add_middleware(RequestObserverMiddleware, json_logs=config.json_logs)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(ServiceError, service_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(HTTPException, http_exception_handler)
    add_routes(app, model.service, model.options.max_batch_items)
    install_health_routes(app, model.lifecycle, API_BASES)


def build_server(config: ApiConfig, keys: ApiKeys) -> ClefModelServer:
    """KServe's model server (one worker) with the predictor's limits and, when asked for, its gRPC server."""
    server = config.server
    return ClefModelServer(
        config.limits,
        grpc_settings(config, keys),
        enable_model_repository=config.enable_model_repository,
        http_port=server.http_port,
        grpc_port=server.grpc_port,
        workers=1,
        max_threads=server.max_threads,
        max_asyncio_workers=server.max_asyncio_workers,
        enable_docs_url=server.enable_docs_url,
        enable_latency_logging=server.enable_latency_logging,
        access_log_format=server.access_log_format,
        event_loop=server.event_loop,
        timeout_keep_alive=server.timeout_keep_alive,
        grace_period=int(config.limits.drain_s),
        ssl_certfile=server.ssl_certfile,
        ssl_keyfile=server.ssl_keyfile,
    )


def register_aliases(server: kserve.ModelServer, model: kserve.Model, aliases: tuple[str, ...]) -> None:
    """Serve the model under each alias (its request policy's) on KServe's routes too."""
    for alias in aliases:
        server.register_model(model, name=alias)
