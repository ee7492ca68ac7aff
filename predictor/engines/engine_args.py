"""The engines' command-line arguments: vLLM's own engine arguments, or a few of them without vLLM.

With vLLM installed the parser is vLLM's ``FlexibleArgumentParser`` with every flag of
``AsyncEngineArgs.add_cli_args`` (``--tensor-parallel-size``, ``--kv-cache-memory-bytes``,
``--quantization`` ...); :func:`vllm_engine_args` builds them with ``AsyncEngineArgs.from_cli_args``
and lays the plugin's fixed settings over them (``clef_plugin.engine_kwargs``, which refuses
contradictions). Without vLLM (a transformers-only install), or when the vLLM engine cannot be chosen
(``--engine transformers``: building vLLM's parser imports vLLM, seconds of every start), only the flags the
transformers engine reads are declared, with vLLM's names: ``--data-parallel-size``, ``--max-model-len``,
``--dtype``. ``--dp`` is an alias of ``--data-parallel-size`` either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm import AsyncEngineArgs

DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384
"""Every request is a prefill: a step of 16384 tokens holds ~32 prompts of 512 tokens (vLLM's own
offline default on large GPUs; its server default, 2048, would run them four at a time)."""
DTYPES_WITHOUT_VLLM = ("auto", "bfloat16", "float16", "float32")


def vllm_installed() -> bool:
    """True when vLLM can be imported."""
    return importlib.util.find_spec("vllm") is not None


def new_parser(vllm_flags: bool = True, **kwargs: Any) -> argparse.ArgumentParser:
    """vLLM's ``FlexibleArgumentParser`` when vLLM's flags are wanted and vLLM is installed (its dict flags need
    it), else argparse's."""
    if vllm_flags and vllm_installed():
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        return FlexibleArgumentParser(**kwargs)
    return argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter, **kwargs)


def add_engine_args(parser: argparse.ArgumentParser, vllm_flags: bool = True) -> None:
    """vLLM's engine arguments when wanted and installed (else the transformers engine's few), ``--dp``, and the
    predictor's defaults."""
    if vllm_flags and vllm_installed():
        from vllm import AsyncEngineArgs

        AsyncEngineArgs.add_cli_args(parser)
        group = parser.add_argument_group("Engine aliases", "short spellings the operator passes")
        # SUPPRESS: the alias sets no default of its own, so --data-parallel-size's stays in force.
        group.add_argument(
            "--dp", dest="data_parallel_size", type=int, default=argparse.SUPPRESS, help="same as --data-parallel-size"
        )
        parser.set_defaults(max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS)
        return
    group = parser.add_argument_group(
        "engine", "the transformers engine's flags only (vLLM is not installed, or --engine transformers)"
    )
    group.add_argument(
        "--data-parallel-size",
        "--dp",
        "-dp",
        dest="data_parallel_size",
        type=int,
        default=1,
        help="data-parallel engines (one per GPU, or N on the CPU) behind one port",
    )
    group.add_argument("--max-model-len", type=int, default=None, help="longest prompt in tokens")
    group.add_argument(
        "--dtype", choices=DTYPES_WITHOUT_VLLM, default="auto", help="auto: bfloat16 on GPUs, float32 on a CPU"
    )


def changed_engine_args(engine_args: AsyncEngineArgs) -> dict[str, Any]:
    """The engine arguments whose value differs from vLLM's own default (set on the command line or by us)."""
    changed = {}
    for field in dataclasses.fields(engine_args):
        if not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = dataclasses.MISSING
        value = getattr(engine_args, field.name)
        if value != default:
            changed[field.name] = value
    return changed


def release_namespace(args: argparse.Namespace, model_dir: Path) -> argparse.Namespace:
    """A copy of ``args`` whose ``--model`` (and ``--tokenizer``, unless given) is the release folder.

    vLLM resolves ``model`` and ``tokenizer`` through the Hugging Face hub when they are constructed if
    ``HF_HUB_OFFLINE`` is set, so its default model id must never reach ``AsyncEngineArgs``: an offline
    machine has no cached copy of it. Raises ``clef_plugin.api.PluginSettingConflict`` for a ``--model``
    other than the release folder.
    """
    from vllm import AsyncEngineArgs

    from clef_plugin.api import PluginSettingConflict

    release = str(model_dir)
    if args.model not in (AsyncEngineArgs.model, release):
        raise PluginSettingConflict("model", args.model, f"the release folder is {release!r}")
    return argparse.Namespace(**{**vars(args), "model": release, "tokenizer": args.tokenizer or release})


def vllm_engine_args(args: argparse.Namespace, model_dir: Path, on_gpu: bool) -> AsyncEngineArgs:
    """vLLM's ``AsyncEngineArgs`` from the command line, with the plugin's settings laid over them.

    On a CPU the engine runs eager unless asked otherwise (torch.compile costs about a minute there
    and gains nothing). vLLM's own tokenizer and input processor are not loaded (``skip_tokenizer_init``):
    the predictor encodes every prompt itself (clef_head) and sends vLLM token ids only; loading them took
    about 20 s of each start on a 2-core machine (BENCHMARKS.md, "Start time").
    Raises ``clef_plugin.api.PluginSettingConflict`` for a contradiction.
    """
    from vllm import AsyncEngineArgs

    import clef_plugin

    parsed = AsyncEngineArgs.from_cli_args(release_namespace(args, model_dir))
    given = changed_engine_args(parsed)
    if not on_gpu:
        given.setdefault("enforce_eager", True)
    return dataclasses.replace(parsed, **clef_plugin.engine_kwargs(model_dir, **given), skip_tokenizer_init=True)
