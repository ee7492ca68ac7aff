"""The HTTP API's flags (access, limits, names, batch, state overflow) and what they become.

``add_api_args`` registers the flags on the predictor's parser, :func:`check_api_args` rejects what the server
cannot honour and :func:`api_config` reads them into an :class:`~predictor.http.api_config.ApiConfig`, which
:mod:`predictor.http.app` assembles the server from.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from clef_head.encoder import STATE_OVERFLOW_CHOICES
from predictor.http.api_config import ApiConfig, GrpcConfig, KServeServerConfig
from predictor.http.auth import API_KEYS_ENV
from predictor.http.server import HttpLimits
from predictor.serving.body_limits import DEFAULT_MAX_BATCH_ITEMS
from predictor.serving.encode_pool import (
    CORES_PER_AUTO_PROCESS,
    DEFAULT_INLINE_ENCODE_MAX_BYTES,
    MAX_AUTO_PROCESSES,
    auto_encode_processes,
    usable_cpus,
)
from predictor.serving.request_policy import RequestPolicy

DEFAULTS = ApiConfig()
SDK_DEFAULT_MODEL = "jev-latest"
"""The TypeSafe SDK's default model name, always served as an alias so that the SDK works without a model."""


def add_api_args(group: argparse._ActionsContainer) -> None:
    """Register the API's flags (access, limits and names) on ``group``: a parser or one of its groups."""
    group.add_argument(
        "--host",
        default=DEFAULTS.limits.host,
        help="address to listen on (0.0.0.0 in a container or to serve other hosts)",
    )
    group.add_argument(
        "--drain-timeout",
        type=int,
        default=int(DEFAULTS.limits.drain_s),
        help="seconds after the shutdown delay for requests in flight to finish; those still running then get 503",
    )
    group.add_argument(
        "--shutdown-delay",
        type=float,
        default=DEFAULTS.shutdown_delay,
        help="seconds after SIGTERM during which readiness fails (the pod's endpoints are withdrawn) while requests "
        "are still answered, before draining "
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
        default=DEFAULTS.limits.max_header_bytes,
        help="largest request line + headers; larger requests are refused and the connection closed",
    )
    group.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULTS.limits.header_timeout,
        help="seconds a connection has to send a request's headers before it is closed",
    )
    group.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULTS.body_timeout,
        help="seconds a request has to send its body (else 408)",
    )
    group.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULTS.limits.max_connections,
        help="open connections (and running requests) beyond which new ones get 429 + Retry-After",
    )
    group.add_argument(
        "--vision",
        action="store_true",
        help="read images (System One assets, JSON or multipart as the TypeSafe SDK sends them, and images) and "
        "videos (their frames): the vision tower stays loaded and images and frames are decoded in the encode "
        "workers. Off (the default): text and JSON only, as lean as the model card's server, and images and videos "
        "are refused with 422/400 naming the field",
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
    group.add_argument(
        "--inline-encode-max-bytes",
        type=int,
        default=DEFAULT_INLINE_ENCODE_MAX_BYTES,
        metavar="BYTES",
        help="with encode workers, a body of at most this size that comes while no other request is being prepared "
        "or answered is prepared in the serving process (its images and videos, if any, by a worker): its hop to a "
        "worker would cost a lone request more than its encoding. 0: every body goes to the workers",
    )


def encode_processes(value: str) -> int | str:
    """``--encode-processes``: ``auto`` or a count of 0 or more."""
    if value == "auto":
        return value
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of processes (0 or more), got {value!r}")
    return int(value)


def resolve_encode_processes(value: int | str, gpu_count: int) -> int:
    """The number of encode worker processes ``--encode-processes value`` asks for on this machine."""
    if value == "auto":
        return auto_encode_processes(gpu_count, usable_cpus())
    return int(value)


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
    if args.inline_encode_max_bytes < 0:
        parser.error("--inline-encode-max-bytes must be 0 or more")


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


def api_config(args: argparse.Namespace) -> ApiConfig:
    """The API as the flags (the predictor's and KServe's) ask for it."""
    server = KServeServerConfig(
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        max_threads=args.max_threads,
        max_asyncio_workers=args.max_asyncio_workers,
        enable_docs_url=args.enable_docs_url,
        enable_latency_logging=args.enable_latency_logging,
        access_log_format=args.access_log_format,
        event_loop=args.event_loop,
        timeout_keep_alive=args.timeout_keep_alive,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
    )
    limits = HttpLimits(
        host=args.host,
        max_header_bytes=args.max_header_bytes,
        header_timeout=args.header_timeout,
        max_connections=args.max_connections,
        drain_s=args.drain_timeout,
    )
    grpc = GrpcConfig(args.grpc_max_receive_message_length, args.grpc_max_send_message_length)
    return ApiConfig(
        server=server,
        limits=limits,
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        shutdown_delay=args.shutdown_delay,
        api_key_file=args.api_key_file,
        enable_model_repository=args.enable_model_repository,
        json_logs=args.json_logs,
        grpc=grpc if args.enable_grpc else None,
    )
