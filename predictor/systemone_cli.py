"""``clef-systemone``: the FP8 model card's server command, served by this predictor.

    clef-systemone --model /models/clef-flash-fp8 [--host H] [--port 8000] [--dp N] [--tp N]
                   [--served-model-name clef-flash] [--max-model-len 16384] [other predictor/vLLM flags]

The card's flags are translated to ``python -m predictor`` flags (``--model`` → ``--model-dir``,
``--served-model-name`` → ``--model-name``, ``--port`` → ``--http_port``, ``--tp`` →
``--tensor-parallel-size``; ``--host``, ``--dp`` and ``--max-model-len`` keep their names) and every
other flag is passed through unchanged, so the predictor's own parser accepts or refuses it. The
engine is vLLM unless ``--engine`` says otherwise. A card flag the predictor cannot honour (e.g.
``--host`` or ``--tp`` with a predictor that has no such flag) stops the command with an error.

Routes are the predictor's (``POST /v1/systemone``, ``GET /health`` answering 503 until warm-up has
finished, KServe's and the Jev API's); its ``GET /v1/models`` carries the card's OpenAI-style list
(``{"object": "list", "data": [{"id": NAME, "object": "model", ...}]}``) beside the hosted API's ``models``
(:func:`predictor.http.jev_api.model_list`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

CARD_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
"""The predictor's default ``--host`` (``predictor.http.server.HttpLimits.host``; a test keeps them equal)."""
CARD_MAX_MODEL_LEN = 16384
CARD_MODEL_NAME = "clef-flash"


def build_parser() -> argparse.ArgumentParser:
    """The card's flags; anything else is left for the predictor's parser."""
    parser = argparse.ArgumentParser(
        prog="clef-systemone",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Other flags go to `python -m predictor` unchanged (see its --help).",
    )
    parser.add_argument("--model", type=Path, required=True, help="release folder")
    parser.add_argument("--served-model-name", default=CARD_MODEL_NAME, help="served model name")
    parser.add_argument(  # SUPPRESS: absent unless given, so the predictor's own default applies
        "--host",
        default=argparse.SUPPRESS,
        help=f"address to listen on (default: {DEFAULT_HOST}, this machine only; 0.0.0.0: every interface)",
    )
    parser.add_argument("--port", type=int, default=CARD_PORT, help="HTTP port")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel engines, one per GPU")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per engine")
    parser.add_argument("--max-model-len", type=int, default=CARD_MAX_MODEL_LEN, help="longest prompt in tokens")
    return parser


def _accepts(predictor_parser: argparse.ArgumentParser, flag: str, value: str) -> bool:
    """Whether the predictor's parser takes ``flag value`` as its own option (not as an unknown one)."""
    namespace, unknown = predictor_parser.parse_known_args([flag, value])
    return not unknown and getattr(namespace, flag.lstrip("-").replace("-", "_"), None) is not None


def chooses_engine(rest: list[str]) -> bool:
    """Whether the pass-through arguments ``rest`` choose the engine (else the card's command serves vLLM)."""
    return any(item == "--engine" or item.startswith("--engine=") for item in rest)


def predictor_argv(args: argparse.Namespace, rest: list[str], predictor_parser: argparse.ArgumentParser) -> list[str]:
    """``python -m predictor`` arguments for the card's ``args`` plus the pass-through ``rest``.

    Raises ``ValueError`` naming the card flag when the predictor has no equivalent for it.
    """
    argv = [
        "--model-dir", str(args.model),
        "--model-name", args.served_model_name,
        "--http_port", str(args.port),
        "--dp", str(args.dp),
        "--max-model-len", str(args.max_model_len),
    ]  # fmt: skip
    optional = {
        "--host": (getattr(args, "host", None), "--host"),
        "--tp": (None if args.tp == 1 else str(args.tp), "--tensor-parallel-size"),
    }
    for card_flag, (value, flag) in optional.items():
        if value is None:
            continue
        if not _accepts(predictor_parser, flag, value):
            raise ValueError(f"{card_flag} {value}: this predictor has no {flag} flag, so it cannot honour {card_flag}")
        argv += [flag, value]
    if not chooses_engine(rest) and _accepts(predictor_parser, "--engine", "vllm"):
        argv += ["--engine", "vllm"]
    return argv + rest


def main(argv: list[str] | None = None) -> None:
    """Parse the card's command line and run the predictor with it."""
    from predictor import cli

    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        # the predictor's parser for the engine that will serve: vLLM's flags only if it can be vLLM
        translated = predictor_argv(
            args, rest, cli.build_parser(rest if chooses_engine(rest) else ["--engine", "vllm"])
        )
    except ValueError as exc:
        parser.error(str(exc))
    cli.main(translated)


if __name__ == "__main__":
    main()
