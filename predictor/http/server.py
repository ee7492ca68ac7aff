"""The predictor's server: KServe's ModelServer (:class:`ClefModelServer`) with the HTTP limits it does not expose
(bind address, header size, header read timeout and a connection cap, applied to the uvicorn server it builds), and
KServe's gRPC server (:class:`ClefGRPCServer`), rebuilt with the same bind address and limits behind the API keys.

KServe binds uvicorn to 0.0.0.0 with httptools, which accepts headers of any size and waits forever for a
request's headers. Here the HTTP protocol is h11 (its ``h11_max_incomplete_event_size`` bounds the bytes
of a request line plus headers: past it, 431/400 and the connection closes), every connection must
deliver a request's headers within ``header_timeout`` seconds of opening or of its previous response
(else it is closed), past ``max_connections`` connections new requests get 429 except the probes (a
reserve of :data:`PROBE_RESERVE`), a request with both Content-Length and Transfer-Encoding gets 400 and its
connection closed, and the open-file limit is raised to what ``max_connections`` needs.
The heap built at startup is frozen (``gc.freeze``) before serving. KServe's OpenAI endpoints, which it registers for
its own ``OpenAIModel`` subclasses only, are not imported (:func:`predictor.http.compat.skip_kserve_openai_endpoints`).
The body's own timeout and size are the request-body middleware's (``predictor.http.http_body``).

KServe's repository extension stops the engine on ``unload`` and its ``load`` does nothing (the model stays
503 for good): :class:`ServingSwitch` takes the model out of service and puts it back instead.

KServe's gRPC server (``--enable_grpc``, off by default here) listens on every interface with no access
check; :class:`ClefGRPCServer` is KServe's, bound to ``--host``, with :mod:`predictor.http.grpc_access`'s
interceptor (API keys, closed repository methods), messages up to ``--max-body-bytes``, at most
``--max-connections`` calls at once, and our errors mapped to their gRPC status.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import struct
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import h11
import kserve
import orjson
from grpc import aio
from kserve.errors import ModelNotFound, ModelNotReady
from kserve.logging import logger as kserve_logger
from kserve.model import BaseKServeModel
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor, LoggingInterceptor
from kserve.protocol.grpc.server import GRPCServer
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from uvicorn.protocols.http.h11_impl import H11Protocol

from predictor.core.errors import ServiceError, Unavailable
from predictor.http.auth import OPEN_METHODS, OPEN_PATHS, ApiKeys
from predictor.http.compat import (
    KSERVE_REPOSITORY_EXTENSION,
    attach_aio_server,
    grpc_server_parts,
    model_registry,
    rest_server,
    skip_kserve_openai_endpoints,
    use_grpc_server,
)
from predictor.http.errors import HEADER, ApiError, bad_request, from_service_error
from predictor.http.grpc_access import AccessInterceptor, grpc_status
from predictor.serving.lifecycle import Lifecycle, Phase


@dataclass(frozen=True)
class HttpLimits:
    """Where to listen and how much a client may hold."""

    host: str = "127.0.0.1"
    max_header_bytes: int = 64 * 1024
    header_timeout: float = 30.0
    max_connections: int = 1024
    #: Seconds requests in flight have after SIGTERM's delay (the shutdown middleware answers 503 then).
    drain_s: float = 20.0


#: uvicorn cancels requests still running this long after the drain (a cancelled request is a 500): it never
#: comes to that, the shutdown middleware (``predictor.http.shutdown.GracefulShutdown``) answers them 503 first.
UVICORN_GRACE_AFTER_DRAIN_S = 3.0


#: ``Retry-After`` of a request refused past ``max_connections``.
OVERLOADED_RETRY_AFTER_S = 1
#: Probe requests admitted beyond ``max_connections`` (liveness and readiness must answer under a connection flood,
#: else Kubernetes restarts a pod that is merely under attack).
PROBE_RESERVE = 64


def framing_conflict(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request has both ``Content-Length`` and ``Transfer-Encoding`` (read one way here and another by a
    proxy in front, it smuggles a second request: RFC 9112 section 6.3 says to treat it as an error)."""
    names = {name.lower() for name, _ in headers}
    return b"content-length" in names and b"transfer-encoding" in names


async def refuse_framing(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    """400 and ``Connection: close``: nothing after this request's headers is read as another request."""
    refusal = bad_request(
        "a request may not have both Content-Length and Transfer-Encoding", "Transfer-Encoding", HEADER
    )
    body = orjson.dumps(refusal.body())
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class HeaderDeadlineProtocol(H11Protocol):
    """h11 with a deadline for each request's headers (a slowloris client cannot hold a connection), requests with
    both Content-Length and Transfer-Encoding refused, and the connection cap (``max_connections``; uvicorn's own
    ``limit_concurrency`` is left off) applied with :data:`PROBE_RESERVE` places kept for the probes."""

    header_timeout: float = 30.0
    max_connections: int = 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inner_app = self.app
        self.app = self._admit

    async def _admit(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "http" and framing_conflict(scope["headers"]):
            await refuse_framing(scope, receive, send)
            return
        limit = self.max_connections
        # this request's connection and task are counted already (uvicorn compares before adding the task)
        over = len(self.connections) >= limit or len(self.tasks) > limit
        if over and scope["type"] == "http":
            probe = scope["method"] in OPEN_METHODS and OPEN_PATHS.match(scope["path"]) is not None
            if not probe or len(self.tasks) > limit + PROBE_RESERVE:
                busy = Unavailable(
                    f"the server holds --max-connections {limit} connections; retry shortly",
                    "overloaded",
                    OVERLOADED_RETRY_AFTER_S,
                )
                refusal = from_service_error(busy)
                refusal.headers["Connection"] = "close"  # frees a place for the next client
                await refusal.response()(scope, receive, send)
                return
        await self._inner_app(scope, receive, send)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the first request's header deadline."""
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        """Start the next request's header deadline (an idle keep-alive connection has its own timeout)."""
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the deadline with the connection."""
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._header_deadline_passed)

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        # uvicorn annotates ``cycle`` as never None, yet it is None until a request's headers arrive
        waiting_for_headers = self.conn.their_state in (h11.IDLE, h11.DONE) and (
            self.cycle is None or self.cycle.response_complete  # type: ignore[redundant-expr]
        )
        if waiting_for_headers and not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(limits: HttpLimits) -> type[HeaderDeadlineProtocol]:
    """The protocol class with the limits set (uvicorn instantiates it per connection)."""
    settings = {"header_timeout": limits.header_timeout, "max_connections": limits.max_connections}
    return type("BoundedH11Protocol", (HeaderDeadlineProtocol,), settings)


@dataclass(frozen=True)
class GrpcSettings:
    """KServe's gRPC server as this predictor runs it (on ``HttpLimits.host``)."""

    port: int
    max_message_bytes: int
    max_send_bytes: int
    max_threads: int
    keys: ApiKeys | None
    enable_model_repository: bool


#: Seconds gRPC calls still running get when the server stops: it stops after the HTTP drain, so calls in flight
#: have had ``--shutdown-delay`` + ``--drain-timeout`` already.
GRPC_STOP_GRACE_S = 1.0


def listen_address(host: str, port: int) -> str:
    """``host:port`` as gRPC writes it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ErrorStatusInterceptor(ExceptionToStatusInterceptor):
    """KServe's exception mapping, with ours first: a bad request is not an ``INTERNAL`` error.

    ``ModelInfer`` decodes the client's tensors (``InferRequest.from_grpc``, then ``as_numpy``) before the model
    sees them; malformed ``raw_input_contents`` or a shape that does not match the data fail there with
    ``struct.error`` or ``ValueError``, which are the client's fault.
    """

    async def handle_exception(self, ex: Exception, request_or_iterator: Any, context: Any, method_name: str) -> None:
        """Abort with our error's status; anything else as KServe maps it."""
        if isinstance(ex, (ApiError, ServiceError)):
            code, message = grpc_status(ex)
            await context.abort(code, message)
        if method_name.endswith("/ModelInfer") and isinstance(ex, (struct.error, ValueError)):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"the input tensors cannot be decoded: {str(ex)[:200]}"
            )
        await super().handle_exception(ex, request_or_iterator, context, method_name)


class ClefGRPCServer(GRPCServer):
    """KServe's gRPC server on ``limits.host`` with the access interceptor and the HTTP limits."""

    def __init__(
        self, limits: HttpLimits, settings: GrpcSettings, data_plane: DataPlane, repository: ModelRepositoryExtension
    ) -> None:
        super().__init__(settings.port, data_plane, repository, kwargs={}, grace_period=GRPC_STOP_GRACE_S)
        self.limits = limits
        self.settings = settings

    async def start(self, max_workers: int) -> None:
        """Build, bind and run the server until it is stopped."""
        access = AccessInterceptor(self.settings.keys, self.settings.enable_model_repository)
        server = aio.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            interceptors=(LoggingInterceptor(), access, ErrorStatusInterceptor()),
            options=[
                ("grpc.max_receive_message_length", self.settings.max_message_bytes),
                ("grpc.max_send_message_length", self.settings.max_send_bytes),
                ("grpc.max_metadata_size", self.limits.max_header_bytes),
            ],
            maximum_concurrent_rpcs=self.limits.max_connections,
        )
        attach_aio_server(self, server)
        parts = grpc_server_parts(self)
        servicer = InferenceServicer(parts.data_plane, parts.repository)
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        address = listen_address(self.limits.host, parts.port)
        if server.add_insecure_port(address) == 0:
            raise OSError(f"gRPC cannot listen on {address}")
        kserve_logger.info("gRPC server on %s (API keys: %s)", address, "required" if access.keys else "none")
        await server.start()
        await server.wait_for_termination()


#: Files the process holds besides client connections (model files, logs, pipes, the engine's sockets).
OPEN_FILES_BESIDES_CONNECTIONS = 512


def raise_open_file_limit(needed: int) -> None:
    """Raise the soft limit on open files towards ``needed`` (at most the hard limit): a soft limit of 1,024,
    common outside containers, would stop accepting connections before ``max_connections``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            kserve_logger.warning(
                "open files are limited to %d (hard limit): fewer than the %d --max-connections needs", target, needed
            )


class ServingSwitch(ModelRepositoryExtension):
    """The repository API's ``unload`` takes a model out of service (readiness and inference 503, the engine kept
    warm); ``load`` puts it back. Shutdown still unloads through the registry, which closes the engine."""

    def _lifecycle(self, model_name: str) -> Lifecycle:
        model = model_registry(self).get_model(model_name)
        if model is None:
            raise ModelNotFound(model_name)
        lifecycle = getattr(model, "lifecycle", None)
        assert isinstance(lifecycle, Lifecycle), "only predictor models are served here"
        return lifecycle

    async def load(self, model_name: str) -> None:
        """Serve an unloaded model again; :class:`ModelNotReady` (503) if it cannot serve now."""
        if not self._lifecycle(model_name).put_back_in_service():
            raise ModelNotReady(model_name)

    async def unload(self, model_name: str) -> None:
        """Stop serving the model; :class:`ModelNotReady` (503) unless it was serving."""
        lifecycle = self._lifecycle(model_name)
        if not lifecycle.take_out_of_service() and lifecycle.phase is not Phase.UNLOADED:
            raise ModelNotReady(model_name, f"model {model_name!r} is {lifecycle.phase.value}, not serving")


class ClefDataPlane(DataPlane):
    """KServe's data plane whose server metadata (HTTP ``GET /v2`` and gRPC ``ServerMetadata``) lists the
    model-repository extension only when its routes and methods are open (``--enable-model-repository``): KServe's
    lists it always, while they answer 404 / ``UNIMPLEMENTED`` unless enabled."""

    def __init__(self, model_registry: Any, enable_model_repository: bool) -> None:
        super().__init__(model_registry)
        self.enable_model_repository = enable_model_repository

    def metadata(self) -> dict[str, Any]:
        """KServe's server metadata, less the extensions this server does not serve."""
        metadata = dict(super().metadata())
        if not self.enable_model_repository:
            metadata["extensions"] = [name for name in metadata["extensions"] if name != KSERVE_REPOSITORY_EXTENSION]
        return metadata


class ClefModelServer(kserve.ModelServer):
    """KServe's ModelServer with :class:`HttpLimits` applied to its uvicorn server before it starts,
    :class:`ClefGRPCServer` instead of KServe's gRPC server when ``grpc`` is given, and :class:`ClefDataPlane`."""

    def __init__(
        self, limits: HttpLimits, grpc: GrpcSettings | None = None, enable_model_repository: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(enable_grpc=False, **kwargs)
        self.limits = limits
        self.grpc = grpc
        self.dataplane = ClefDataPlane(self.registered_models, enable_model_repository)
        self.model_repository_extension = ServingSwitch(model_registry=self.registered_models)

    def start(self, models: list[BaseKServeModel]) -> None:
        """KServe's start, without its OpenAI endpoints' import (Clef's model is not one of KServe's OpenAI models)."""
        skip_kserve_openai_endpoints()
        super().start(models)

    def setup_event_loop(self) -> None:
        """KServe's loop setup, then the limits (the REST server exists by now and has not started)."""
        super().setup_event_loop()
        # The startup heap (engine, tokenizer, modules) is long-lived: frozen, the collections that a
        # request's many new objects trigger do not walk it again and again.
        gc.freeze()
        rest = rest_server(self)
        assert rest is not None, "one REST server (workers=1) is expected"
        config = rest.config
        config.host = self.limits.host
        config.http = bounded_protocol(self.limits)
        config.h11_max_incomplete_event_size = self.limits.max_header_bytes
        config.limit_concurrency = None  # the protocol applies max_connections, with room for the probes
        raise_open_file_limit(self.limits.max_connections + PROBE_RESERVE + OPEN_FILES_BESIDES_CONNECTIONS)
        config.timeout_graceful_shutdown = int(self.limits.drain_s + UVICORN_GRACE_AFTER_DRAIN_S)
        if self.grpc is not None:
            grpc_server = ClefGRPCServer(self.limits, self.grpc, self.dataplane, self.model_repository_extension)
            use_grpc_server(self, grpc_server)
            self.servers.append(grpc_server.start(self.grpc.max_threads))
