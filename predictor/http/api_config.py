"""How the HTTP and gRPC API serves, as frozen values: KServe's server settings, the limits the predictor adds,
and the API's access and shutdown settings (built from the command line by
:func:`predictor.config.config_from_args`, or directly by a test or a tool)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kserve.model_server import parser as kserve_parser

from predictor.http.server import HttpLimits
from predictor.serving.body_limits import DEFAULT_MAX_BODY_BYTES


@dataclass(frozen=True)
class KServeServerConfig:
    """The settings of KServe's ``ModelServer`` that the predictor passes on; KServe's own flags of the same
    names set them, and KServe's parser holds their defaults."""

    http_port: int = kserve_parser.get_default("http_port")
    grpc_port: int = kserve_parser.get_default("grpc_port")
    max_threads: int = kserve_parser.get_default("max_threads")
    max_asyncio_workers: int | None = kserve_parser.get_default("max_asyncio_workers")
    enable_docs_url: bool = kserve_parser.get_default("enable_docs_url")
    enable_latency_logging: bool = kserve_parser.get_default("enable_latency_logging")
    access_log_format: str | None = kserve_parser.get_default("access_log_format")
    event_loop: str = kserve_parser.get_default("event_loop")
    timeout_keep_alive: int = kserve_parser.get_default("timeout_keep_alive")
    ssl_certfile: str | None = kserve_parser.get_default("ssl_certfile")
    ssl_keyfile: str | None = kserve_parser.get_default("ssl_keyfile")


@dataclass(frozen=True)
class GrpcConfig:
    """KServe's gRPC server, when it runs (``--enable_grpc``): the largest message it receives (capped by
    ``ApiConfig.max_body_bytes``) and sends."""

    max_receive_bytes: int = kserve_parser.get_default("grpc_max_receive_message_length")
    max_send_bytes: int = kserve_parser.get_default("grpc_max_send_message_length")


@dataclass(frozen=True)
class ApiConfig:
    """The API: KServe's server (``server``), the connection limits (``limits``), request bodies up to
    ``max_body_bytes`` sent within ``body_timeout`` seconds, ``shutdown_delay`` seconds of failing readiness after
    SIGTERM before the drain (``limits.drain_s``), API keys in ``api_key_file`` (and the environment), KServe's
    repository routes only with ``enable_model_repository``, one JSON line per request with ``json_logs``, and
    the gRPC server only when ``grpc`` is given."""

    server: KServeServerConfig = KServeServerConfig()
    limits: HttpLimits = HttpLimits()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout: float = 60.0
    shutdown_delay: float = 5.0
    api_key_file: Path | None = None
    enable_model_repository: bool = False
    json_logs: bool = False
    grpc: GrpcConfig | None = None
