"""The HTTP API's flags (access, limits, names, batch, state overflow) and where they take effect.

``add_api_args`` registers the flags on the predictor's parser; ``install_api`` adds the middleware,
error handlers and routes to KServe's app; ``http_limits`` and ``register_aliases`` configure the
``ClefModelServer`` that serves them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from clef_head.encoder import STATE_OVERFLOW_CHOICES
from predictor.core.errors import ServiceError
from predictor.http.auth import API_KEYS_ENV, ApiKeyMiddleware, ApiKeys
from predictor.http.errors import ApiError, api_error_handler, service_error_handler, validation_error_handler
from predictor.http.health import install_health_routes
from predictor.http.http_body import RequestBodyMiddleware
from predictor.http.jev_api import add_routes
from predictor.http.observe import RequestObserverMiddleware
from predictor.http.route_guard import RouteGuardMiddleware
from predictor.http.server_limits import GrpcSettings, HttpLimits
from predictor.http.shutdown import GracefulShutdown
from predictor.serving.body_limits import DEFAULT_MAX_BATCH_ITEMS
from predictor.serving.encode_pool import CORES_PER_AUTO_PROCESS, MAX_AUTO_PROCESSES, auto_encode_processes, usable_cpus
from predictor.serving.request_policy import RequestPolicy

if TYPE_CHECKING:
    import kserve

    from predictor.serving.lifecycle import Lifecycle
    from predictor.serving.service import SystemOneService

DEFAULTS = HttpLimits()
SDK_DEFAULT_MODEL = "jev-latest"
"""The TypeSafe SDK's default model name, always served as an alias so that the SDK works without a model."""


class ServedModel(Protocol):
    """What the HTTP layer needs of the served model (:class:`predictor.model.ClefModel`, the layer above)."""

    name: str
    service: SystemOneService | None
    lifecycle: Lifecycle


def add_api_args(group: argparse._ActionsContainer) -> None:
    """Register the API's flags (access, limits and names) on ``group``: a parser or one of its groups."""
    group.add_argument(
        "--host", default=DEFAULTS.host, help="address to listen on (0.0.0.0 in a container or to serve other hosts)"
    )
    group.add_argument(
        "--drain-timeout",
        type=int,
        default=20,
        help="seconds after the shutdown delay for requests in flight to finish; those still running then get 503",
    )
    group.add_argument(
        "--shutdown-delay",
        type=float,
        default=5.0,
        help="seconds after SIGTERM during which readiness fails and new requests get 503, before draining "
        "(the process exits within delay + drain + a few seconds: keep it under the pod's grace period, 30 s)",
    )
    group.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help=f"file of API keys, one per line, read again when it changes; clients send 'Authorization: Bearer "
        f"<key>'. Keys in ${API_KEYS_ENV} (comma-separated) are accepted too. Without either, no key is needed",
    )
    group.add_argument(
        "--enable-model-repository",
        action="store_true",
        help="serve KServe's /v2/repository load/unload routes (off: anyone reaching them could unload the model)",
    )
    group.add_argument(
        "--model-alias",
        action="append",
        default=[],
        metavar="NAME",
        help=f"another name served as the same model (repeatable); {SDK_DEFAULT_MODEL}, the TypeSafe SDK's default, "
        "is always served",
    )
    group.add_argument(
        "--accept-any-model-name", action="store_true", help="answer System One requests whatever model they name"
    )
    group.add_argument(
        "--state-overflow",
        choices=STATE_OVERFLOW_CHOICES,
        default="truncate",
        help="a state longer than the prompt can hold: cut it (usage.state_truncated says so) or answer 413",
    )
    group.add_argument(
        "--max-batch-items",
        type=int,
        default=DEFAULT_MAX_BATCH_ITEMS,
        help="most System One requests in one body: POST /v1/systemone/batch, KServe V1 instances, V2 inputs[0].data",
    )
    group.add_argument(
        "--max-header-bytes",
        type=int,
        default=DEFAULTS.max_header_bytes,
        help="largest request line + headers; larger requests are refused and the connection closed",
    )
    group.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULTS.header_timeout,
        help="seconds a connection has to send a request's headers before it is closed",
    )
    group.add_argument(
        "--body-timeout", type=float, default=60.0, help="seconds a request has to send its body (else 408)"
    )
    group.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULTS.max_connections,
        help="open connections (and running requests) beyond which new ones get 503",
    )
    group.add_argument(
        "--vision",
        action="store_true",
        help="read images (System One assets, JSON or multipart as the TypeSafe SDK sends them, and images): the "
        "vision tower stays loaded and images are decoded in the encode workers. Off (the default): text and JSON "
        "only, as lean as the model card's server, and images are refused with 422/400 naming the field. "
        "Transformers engine only for now",
    )
    group.add_argument(
        "--encode-processes",
        type=encode_processes,
        default="auto",
        metavar="N|auto",
        help="worker processes that read, validate and tokenize request bodies outside the serving process's "
        "interpreter lock, which the event loop and the engine's output handling need under load; 0: a thread of "
        f"the serving process. auto: 0 without a GPU (a CPU engine's forward passes need every core), else one "
        f"per {CORES_PER_AUTO_PROCESS} CPUs, at most {MAX_AUTO_PROCESSES}. A worker holds the tokenizer, not the model",
    )


def encode_processes(value: str) -> int | str:
    """``--encode-processes``: ``auto`` or a count of 0 or more."""
    if value == "auto":
        return value
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of processes (0 or more), got {value!r}")
    return int(value)


def resolve_encode_processes(args: argparse.Namespace, gpu_count: int) -> int:
    """The number of encode worker processes ``--encode-processes`` asks for on this machine."""
    if args.encode_processes == "auto":
        return auto_encode_processes(gpu_count, usable_cpus())
    return int(args.encode_processes)


def check_api_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject API settings the server cannot honour."""
    if args.api_key_file is not None and not args.api_key_file.is_file():
        parser.error(f"--api-key-file {args.api_key_file} is not a file")
    if args.max_batch_items < 1:
        parser.error("--max-batch-items must be at least 1")
    if args.max_header_bytes < 1024:
        parser.error("--max-header-bytes must be at least 1024")
    if args.header_timeout <= 0 or args.body_timeout <= 0:
        parser.error("--header-timeout and --body-timeout must be positive")
    if args.max_connections < 1:
        parser.error("--max-connections must be at least 1")


def model_aliases(args: argparse.Namespace) -> tuple[str, ...]:
    """The names served besides ``--model-name``: each ``--model-alias`` and :data:`SDK_DEFAULT_MODEL`, once."""
    names = dict.fromkeys((*args.model_alias, SDK_DEFAULT_MODEL))
    names.pop(args.model_name, None)
    return tuple(names)


def request_policy(args: argparse.Namespace) -> RequestPolicy:
    """The request policy the flags ask for."""
    return RequestPolicy(
        aliases=model_aliases(args), accept_any_name=args.accept_any_model_name, state_overflow=args.state_overflow
    )


def http_limits(args: argparse.Namespace) -> HttpLimits:
    """The HTTP limits the flags ask for."""
    return HttpLimits(
        host=args.host,
        max_header_bytes=args.max_header_bytes,
        header_timeout=args.header_timeout,
        max_connections=args.max_connections,
        drain_s=args.drain_timeout,
    )


def api_keys(args: argparse.Namespace) -> ApiKeys:
    """The API keys of ``--api-key-file`` and the environment (HTTP and gRPC share them)."""
    return ApiKeys(args.api_key_file, os.environ.get(API_KEYS_ENV))


def grpc_settings(args: argparse.Namespace, keys: ApiKeys) -> GrpcSettings | None:
    """KServe's gRPC server as the flags ask for it, or None (the default: ``--enable_grpc`` is off)."""
    if not args.enable_grpc:
        return None
    return GrpcSettings(
        port=args.grpc_port,
        max_message_bytes=min(args.max_body_bytes, args.grpc_max_receive_message_length),
        max_send_bytes=args.grpc_max_send_message_length,
        max_threads=args.max_threads,
        keys=keys,
        enable_model_repository=args.enable_model_repository,
    )


def install_api(app: FastAPI, model: ServedModel, args: argparse.Namespace, keys: ApiKeys) -> None:
    """Add the middleware, error handlers and routes to KServe's app (before the server starts).

    Middleware, outermost first: request ids and metrics, the shutdown window (503 once SIGTERM came), API keys,
    closed routes, request bodies.
    """
    assert model.service is not None, "load the model first"
    app.add_middleware(RequestBodyMiddleware, max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout)
    app.add_middleware(
        RouteGuardMiddleware,
        served_names=(model.name, *model_aliases(args)),
        enable_model_repository=args.enable_model_repository,
        enable_docs=args.enable_docs_url,
    )
    if keys.enabled:
        app.add_middleware(ApiKeyMiddleware, keys=keys)
    app.add_middleware(
        GracefulShutdown, lifecycle=model.lifecycle, delay_s=args.shutdown_delay, drain_s=args.drain_timeout
    )
    app.add_middleware(RequestObserverMiddleware, json_logs=args.json_logs)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(ServiceError, service_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    add_routes(app, model.service, args.max_batch_items)
    install_health_routes(app, model.lifecycle)


def register_aliases(server: kserve.ModelServer, model: kserve.Model, args: argparse.Namespace) -> None:
    """Serve the model under each alias (:func:`model_aliases`) on KServe's routes too."""
    for alias in model_aliases(args):
        server.register_model(model, name=alias)
