"""``python -m predictor``: serve Clef-flash with KServe's ModelServer.

With no ``--model-dir`` it serves the embedded tiny demo release (RANDOM weights, said loudly).
KServe's own flags (``--http_port``, ``--grpc_port``, ``--enable_grpc`` ...) are accepted as well.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
from pathlib import Path

from clef_head.checkpoint import is_random_release
from predictor.api_args import add_api_args, check_api_args, http_limits, install_api, register_aliases
from predictor.demo import RANDOM_WARNING, demo_release
from predictor.engines import DTYPE_CHOICES, ENGINE_CHOICES, EngineSpec, build_engine
from predictor.model import ClefModel
from predictor.observe import configure_json_logs
from predictor.server_limits import ClefModelServer
from predictor.service import ModelCard

log = logging.getLogger("predictor")

DEFAULT_MAX_MODEL_LEN = 16384
DEMO_MAX_MODEL_LEN = 1024
# Every request is a prefill: a step of 16384 tokens holds ~32 prompts of 512 tokens (vLLM's own
# offline default on large GPUs; its server default, 2048, would run them four at a time).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384
DESCRIPTION = (
    "Clef-flash, Cloudflare's decision model (Qwen3.5-9B backbone + joint schema head): "
    "answers noul, choice and score questions about a JSON state."
)


def json_object(text: str) -> dict[str, object]:
    """A command-line value that must be a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Our flags on top of KServe's model-server parser."""
    from kserve.model_server import parser as kserve_parser

    parser = argparse.ArgumentParser(
        prog="python -m predictor",
        description=__doc__.split("\n\n")[0],
        parents=[kserve_parser],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    group = parser.add_argument_group("clef")
    group.add_argument("--model-dir", type=Path, default=None, help="release folder (default: the random demo release)")
    group.add_argument("--model-name", dest="model_name", help="served model name (same as --model_name)")
    group.add_argument(
        "--engine", choices=ENGINE_CHOICES, default="auto", help="auto: vLLM when usable, else transformers"
    )
    group.add_argument("--dp", type=int, default=1, help="data-parallel engines (one per GPU) behind one port")
    group.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help=f"longest prompt in tokens (default {DEFAULT_MAX_MODEL_LEN}; {DEMO_MAX_MODEL_LEN} for the demo release)",
    )
    group.add_argument(
        "--dtype", choices=DTYPE_CHOICES, default="auto", help="auto: bfloat16, but float32 for transformers on a CPU"
    )
    group.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM's GPU memory share")
    group.add_argument("--enforce-eager", action="store_true", help="vLLM: no CUDA graphs / torch.compile")
    group.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help="vLLM: prompt tokens per engine step (prefill only, so this is the batch size in tokens)",
    )
    group.add_argument("--max-num-seqs", type=int, default=None, help="vLLM: requests per engine step (default: vLLM's)")
    group.add_argument(
        "--compilation-config",
        type=json_object,
        default=None,
        help="vLLM: CompilationConfig as a JSON object, e.g. '{\"cudagraph_capture_sizes\": [256, 512]}'",
    )
    group.add_argument("--max-batch", type=int, default=32, help="transformers engine: records per forward pass")
    group.add_argument("--batch-wait-ms", type=float, default=5.0, help="transformers engine: wait to fill a batch")
    group.add_argument("--max-body-bytes", type=int, default=8 << 20, help="larger request bodies get 413")
    group.add_argument("--warmup-rounds", type=int, default=1, help="times to run the warm-up shapes before ready")
    group.add_argument("--drain-timeout", type=int, default=30, help="seconds to finish in-flight requests on SIGTERM")
    group.add_argument("--json-logs", action="store_true", help="one JSON line per inference request on stdout")
    group.add_argument("--description", default=None, help="model description in GET /jev/v1/models")
    group.add_argument(
        "--release-date", default=None, help="YYYY-MM-DD in GET /jev/v1/models (default: config.json date)"
    )
    group.add_argument("--demo-cache-dir", type=Path, default=None, help="where the demo release is cached")
    add_api_args(parser)
    parser.set_defaults(model_name="clef-flash")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject combinations the server cannot honour."""
    if args.workers != 1:
        parser.error("--workers must be 1: each worker would load its own engine; use --dp for more GPUs")
    if args.dp < 1:
        parser.error("--dp must be at least 1")
    if args.max_model_len is not None and args.max_model_len < 64:
        parser.error("--max-model-len must be at least 64")
    if args.warmup_rounds < 1:
        parser.error("--warmup-rounds must be at least 1")
    if args.max_num_batched_tokens < 1:
        parser.error("--max-num-batched-tokens must be at least 1")
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        parser.error("--max-num-seqs must be at least 1")
    if args.max_body_bytes < 1024:
        parser.error("--max-body-bytes must be at least 1024")
    if args.model_dir is not None and not args.model_dir.is_dir():
        parser.error(f"--model-dir {args.model_dir} is not a directory")
    check_api_args(parser, args)


def configure_logging(args: argparse.Namespace) -> None:
    """KServe's log format for our loggers too; ``--json-logs`` keeps stdout for request lines only."""
    from kserve import logging as kserve_logging

    if args.configure_logging:
        kserve_logging.configure_logging(args.log_config_file)
    kserve_logger = logging.getLogger(kserve_logging.KSERVE_LOGGER_NAME)
    for name in ("predictor", "clef_head"):
        ours = logging.getLogger(name)
        ours.handlers = list(kserve_logger.handlers)
        ours.setLevel(logging.INFO)
        ours.propagate = not ours.handlers
    if args.json_logs:
        configure_json_logs()
        logging.getLogger("uvicorn.access").disabled = True


def model_card(args: argparse.Namespace, model_dir: Path, random: bool) -> ModelCard:
    """Name, description (with the RANDOM warning when it applies) and release date."""
    description = args.description or DESCRIPTION
    if random:
        description = f"{RANDOM_WARNING} {description}"
    release_date = args.release_date
    if release_date is None:
        config = model_dir / "config.json"
        stamp = config.stat().st_mtime if config.exists() else model_dir.stat().st_mtime
        release_date = datetime.datetime.fromtimestamp(stamp, tz=datetime.timezone.utc).date().isoformat()
    return ModelCard(name=args.model_name, description=description, release_date=release_date)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, build the model and serve it until SIGTERM/SIGINT."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    configure_logging(args)

    from kserve.model_server import app

    if args.model_dir is None:
        model_dir = demo_release(args.demo_cache_dir)
    else:
        model_dir = args.model_dir
    random = is_random_release(model_dir)
    if random:
        for line in ("*" * 100, RANDOM_WARNING, "*" * 100):
            log.warning(line)
    max_length = args.max_model_len or (DEMO_MAX_MODEL_LEN if args.model_dir is None else DEFAULT_MAX_MODEL_LEN)
    spec = EngineSpec(
        kind=args.engine,
        model_dir=model_dir,
        max_length=max_length,
        data_parallel=args.dp,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        compilation_config=args.compilation_config,
        max_batch=args.max_batch,
        batch_wait_ms=args.batch_wait_ms,
        dtype=args.dtype,
    )
    model = ClefModel(
        model_card(args, model_dir, random),
        lambda: build_engine(spec),
        warmup_rounds=args.warmup_rounds,
        warmup_max_batch=min(16, args.max_batch),
    )
    model.load()
    install_api(app, model, args)
    server = ClefModelServer(
        http_limits(args),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        workers=1,
        max_threads=args.max_threads,
        max_asyncio_workers=args.max_asyncio_workers,
        enable_grpc=args.enable_grpc,
        enable_docs_url=args.enable_docs_url,
        enable_latency_logging=args.enable_latency_logging,
        access_log_format=args.access_log_format,
        event_loop=args.event_loop,
        timeout_keep_alive=args.timeout_keep_alive,
        grace_period=args.drain_timeout,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
    )
    register_aliases(server, model, args)
    server.start([model])
