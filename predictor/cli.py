"""``python -m predictor``: serve Clef-flash with KServe's ModelServer.

With no ``--model-dir`` it serves the embedded tiny demo release (RANDOM weights, said loudly).
vLLM's engine arguments (``--tensor-parallel-size`` ...) and KServe's own flags (``--http_port``,
``--grpc_port``, ``--enable_grpc`` ...) are accepted as well; gRPC is off unless ``--enable_grpc true``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from clef_head.checkpoint import is_random_release
from clef_plugin import ENGINE_SIDE_LOGGERS
from clef_plugin.api import PluginSettingConflict
from predictor.config import config_from_args
from predictor.demo import RANDOM_WARNING, demo_release
from predictor.engines import ENGINE_CHOICES, build_engine, visible_gpus, vllm_can_serve
from predictor.engines.engine_args import add_engine_args, new_parser
from predictor.engines.memory import InsufficientMemory
from predictor.http.api_args import add_api_args, check_api_args
from predictor.http.app import api_keys, build_server, install_api, register_aliases
from predictor.http.compat import add_action, declared_options, kserve_parser_actions
from predictor.http.health import NotReadyTracebackFilter
from predictor.http.observe import configure_json_logs
from predictor.model import ClefModel
from predictor.serving.body_limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_QUEUE_WAIT_S
from predictor.serving.lifecycle import ENGINE_DEAD_EXIT_CODE, exit_after_shutdown
from predictor.serving.prepare import TOKENIZER_FILE, ReleaseTokenizer
from predictor.serving.warmup import WarmupDoesNotFit, warmup_schema

log = logging.getLogger("predictor")

DEFAULT_ANSWER_CACHE_BYTES = 16 << 20


def add_kserve_args(parser: argparse.ArgumentParser) -> None:
    """KServe's model-server flags (``--http_port`` ...), also spelt with dashes.

    vLLM's parser rewrites ``--http_port`` to ``--http-port`` before parsing, so each KServe flag gets
    its dashed spelling as well, unless the parser has it already (vLLM's ``--log-config-file``, same
    meaning and destination). KServe's own parser is left as it is.
    """
    group = parser.add_argument_group(
        "KServe", "KServe's model-server flags, either spelling (--http_port, --http-port)"
    )
    for action in kserve_parser_actions():
        spellings = [*action.option_strings, *(option.replace("_", "-") for option in action.option_strings)]
        spellings = [option for option in spellings if option not in declared_options(parser)]
        dashed = copy.copy(action)
        dashed.option_strings = list(dict.fromkeys(spellings))
        add_action(group, dashed)


def vllm_may_serve(argv: Sequence[str]) -> bool:
    """Whether the command line ``argv`` can end up on the vLLM engine (:func:`predictor.engines.vllm_can_serve`:
    ``--engine vllm``, or ``auto`` with vLLM and a GPU), or asks for help (which lists vLLM's flags): only then is
    vLLM's parser built (it imports vLLM)."""
    if any(arg in ("-h", "--help") or arg.startswith("--help=") for arg in argv):
        return True
    engine = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    engine.add_argument("--engine", default="auto")
    requested = engine.parse_known_args(list(argv))[0].engine
    return requested in ENGINE_CHOICES and vllm_can_serve(requested)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """KServe's flags, vLLM's engine arguments (see predictor.engines.engine_args) and the predictor's own.

    With ``argv``, vLLM's engine arguments are declared only when ``argv`` can choose the vLLM engine
    (:func:`vllm_may_serve`); without it, always (when vLLM is installed).
    """
    vllm_flags = argv is None or vllm_may_serve(argv)
    parser = new_parser(vllm_flags, prog="python -m predictor", description=__doc__.split("\n\n")[0])
    add_engine_args(parser, vllm_flags)
    add_kserve_args(parser)
    group = parser.add_argument_group(
        "Predictor", "the predictor's own flags, the API's included (python -m predictor --help=predictor)"
    )
    group.add_argument(
        "--model-dir", type=Path, default=None, help="release folder; without it, the random demo release"
    )
    group.add_argument(
        "--engine", choices=ENGINE_CHOICES, default="auto", help="auto: vLLM on GPUs when installed, else transformers"
    )
    group.add_argument("--max-batch", type=int, default=32, help="transformers engine: records per forward pass")
    group.add_argument("--batch-wait-ms", type=float, default=5.0, help="transformers engine: wait to fill a batch")
    group.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="larger request bodies, on the wire or decompressed, get 413",
    )
    group.add_argument("--warmup-rounds", type=int, default=1, help="times to run the warm-up shapes before ready")
    group.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="records admitted at once; more get 429 + Retry-After (default: 4 x what the engine runs at once)",
    )
    group.add_argument(
        "--max-queue-wait-s",
        type=float,
        default=DEFAULT_MAX_QUEUE_WAIT_S,
        help="a request is refused with 429 + Retry-After when the prompt tokens already admitted would take longer "
        "than this to answer at the measured service rate (prompt tokens answered per busy second)",
    )
    group.add_argument(
        "--answer-cache-bytes",
        type=int,
        default=DEFAULT_ANSWER_CACHE_BYTES,
        help="bytes of answers kept for identical requests: option logits by prompt, responses by body (0: no cache; "
        "identical requests in flight are merged)",
    )
    group.add_argument(
        "--exit-on-engine-death",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"exit with code {ENGINE_DEAD_EXIT_CODE} when the engine dies (else serve 503 and fail liveness)",
    )
    group.add_argument("--json-logs", action="store_true", help="one JSON line per inference request on stdout")
    group.add_argument("--description", default=None, help="model description in GET /v1/models")
    group.add_argument(
        "--release-date", default=None, help="YYYY-MM-DD in GET /v1/models; without it, config.json's date"
    )
    group.add_argument("--demo-cache-dir", type=Path, default=None, help="where the demo release is cached")
    add_api_args(group)
    # gRPC only when asked for (KServe's default is on, listening on every interface).
    parser.set_defaults(model_name="clef-flash", enable_grpc=False)
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject combinations the server cannot honour."""
    if args.workers != 1:
        parser.error("--workers must be 1: each worker would load its own engine; use --dp for more GPUs")
    if args.data_parallel_size < 1:
        parser.error("--dp (--data-parallel-size) must be at least 1")
    if args.max_model_len is not None and args.max_model_len < 64:
        parser.error("--max-model-len must be at least 64")
    if args.warmup_rounds < 1:
        parser.error("--warmup-rounds must be at least 1")
    if args.max_queue_wait_s <= 0:
        parser.error("--max-queue-wait-s must be positive")
    if args.max_queued_requests is not None and args.max_queued_requests < 1:
        parser.error("--max-queued-requests must be at least 1")
    if args.answer_cache_bytes < 0:
        parser.error("--answer-cache-bytes must be 0 (off) or more")
    if args.shutdown_delay < 0:
        parser.error("--shutdown-delay must be 0 or more")
    if args.drain_timeout < 1:
        parser.error("--drain-timeout must be at least 1")
    if args.max_body_bytes < 1024:
        parser.error("--max-body-bytes must be at least 1024")
    if args.release_date is not None and not is_iso_date(args.release_date):
        parser.error(f"--release-date {args.release_date!r} is not a date written YYYY-MM-DD")
    if args.model_dir is not None and not args.model_dir.is_dir():
        parser.error(f"--model-dir {args.model_dir} is not a directory")
    check_api_args(parser, args)


def is_iso_date(text: str) -> bool:
    """Whether ``text`` is a date written ``YYYY-MM-DD``."""
    try:
        return datetime.date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False


def configure_logging(args: argparse.Namespace) -> None:
    """KServe's log format for our loggers too; ``--json-logs`` keeps stdout for request lines only."""
    from kserve import logging as kserve_logging

    if args.configure_logging:
        kserve_logging.configure_logging(args.log_config_file)
    kserve_logger = logging.getLogger(kserve_logging.KSERVE_LOGGER_NAME)
    kserve_logger.addFilter(NotReadyTracebackFilter())
    for name in ("predictor", *ENGINE_SIDE_LOGGERS):
        ours = logging.getLogger(name)
        ours.handlers = list(kserve_logger.handlers)
        ours.setLevel(logging.INFO)
        ours.propagate = not ours.handlers
    if args.json_logs:
        configure_json_logs()
        logging.getLogger("uvicorn.access").disabled = True


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, build the model and serve it until SIGTERM/SIGINT."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    check_args(parser, args)
    configure_logging(args)

    from kserve.model_server import app

    if args.model_dir is None:
        release_dir = demo_release(args.demo_cache_dir)
    else:
        release_dir = args.model_dir
    random = is_random_release(release_dir)
    if random:
        for line in ("*" * 100, RANDOM_WARNING, "*" * 100):
            log.warning(line)
    config = config_from_args(args, release_dir, random, visible_gpus())
    if (release_dir / TOKENIZER_FILE).is_file():  # else the engine's tokenizer measures it at load
        try:  # the shortest prompt, measured before any engine is built
            warmup_schema(ReleaseTokenizer(release_dir), config.engine.max_model_len)
        except WarmupDoesNotFit as exc:
            parser.error(str(exc))
    model = ClefModel(config.card, lambda: build_engine(config.engine), options=config.serving)
    try:
        model.load()
    except (PluginSettingConflict, WarmupDoesNotFit) as exc:
        parser.error(str(exc))
    except InsufficientMemory as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")
    keys = api_keys(config.api)
    install_api(app, model, config.api, keys)
    server = build_server(config.api, keys)
    register_aliases(server, model, config.serving.policy.aliases)
    server.start([model])
    exit_after_shutdown()
