"""The engines' command-line arguments: vLLM's own engine arguments, or a few of them without vLLM.

With vLLM installed the parser is vLLM's ``FlexibleArgumentParser`` with every flag of
``AsyncEngineArgs.add_cli_args`` (``--tensor-parallel-size``, ``--kv-cache-memory-bytes``,
``--quantization`` ...); the ones given reach :class:`~predictor.engines.config.EngineConfig` through
:func:`given_vllm_flags`, and :func:`vllm_engine_args` builds ``AsyncEngineArgs`` from that configuration and
lays the plugin's fixed settings over them (``clef_plugin.engine_kwargs``, which refuses
contradictions). Without vLLM (a transformers-only install), or when the vLLM engine cannot be chosen
(``--engine transformers``, or ``auto`` without a GPU: building vLLM's parser imports vLLM, seconds of every
start), only the flags the transformers engine reads are declared, with vLLM's names: ``--data-parallel-size``,
``--max-model-len``, ``--dtype``. ``--dp`` is an alias of ``--data-parallel-size`` either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictor.engines.config import SHARED_VLLM_FIELDS, EngineConfig

if TYPE_CHECKING:
    from vllm import AsyncEngineArgs

DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384
"""Every request is a prefill: a step of 16384 tokens holds ~32 prompts of 512 tokens (vLLM's own
offline default on large GPUs; its server default, 2048, would run them four at a time)."""
DTYPES_WITHOUT_VLLM = ("auto", "bfloat16", "float16", "float32")
SERVING_GDN_PREFILL_BACKEND = "triton"
"""The Gated DeltaNet prefill kernel a predictor on a GPU runs unless ``--gdn-prefill-backend`` (or
``--additional-config``'s ``gdn_prefill_backend``) names one: FLA's Triton kernels, under which the plugin's
whole-forward CUDA graphs run and whose compiled kernels Triton's cache keeps across starts. vLLM's own choice on
Hopper is FlashInfer's, measured on an H200 against them (BENCHMARKS.md, R15): one client's p50 74.0 against 58.1 ms
before the whole-forward graphs (27.15 ms with them, R31), about 25 s more in every warm start (its CuTe-DSL kernels
are compiled again by each process), 7.6 % more requests/s at 64 clients."""


def vllm_installed() -> bool:
    """True when vLLM can be imported."""
    return importlib.util.find_spec("vllm") is not None


def engine_reads_videos(requested: str) -> bool:
    """Whether the engine ``--engine requested`` ends on answers videos (with ``--vision``; ``auto`` resolved as
    :func:`predictor.engines.vllm_can_serve` resolves it): the transformers engine does; the vLLM engine where
    its vLLM takes processed video items (``clef_plugin.compat.processed_images.processed_videos_supported``)."""
    from predictor.engines import vllm_can_serve

    if not vllm_can_serve(requested):
        return True
    from clef_plugin.compat.processed_images import processed_videos_supported

    return processed_videos_supported()


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


def _default(field: dataclasses.Field[Any]) -> Any:
    """A dataclass field's default (``MISSING`` when it has none)."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def changed_engine_args(engine_args: AsyncEngineArgs) -> dict[str, Any]:
    """The engine arguments whose value differs from vLLM's own default (set on the command line or by us)."""
    fields = (field for field in dataclasses.fields(engine_args) if field.init)
    return {
        field.name: getattr(engine_args, field.name)
        for field in fields
        if getattr(engine_args, field.name) != _default(field)
    }


def given_vllm_flags(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's engine arguments on the parsed command line ``args`` that differ from vLLM's defaults, the fields
    :class:`~predictor.engines.config.EngineConfig` holds itself left out: none when vLLM cannot serve (not
    installed, or ``--engine`` does not end on vLLM: :func:`predictor.engines.vllm_can_serve`; the parser had no
    vLLM flags then)."""
    from predictor.engines import vllm_can_serve

    if not vllm_installed() or not vllm_can_serve(args.engine):
        return {}
    from vllm import AsyncEngineArgs

    fields = {field.name: field for field in dataclasses.fields(AsyncEngineArgs) if field.init}
    return {
        name: value
        for name, value in vars(args).items()
        if name in fields and name not in SHARED_VLLM_FIELDS and value != _default(fields[name])
    }


def release_flags(flags: Mapping[str, Any], release_dir: Path) -> dict[str, Any]:
    """``flags`` with ``model`` (and ``tokenizer``, unless given) set to the release folder.

    vLLM resolves ``model`` and ``tokenizer`` through the Hugging Face hub when they are constructed if
    ``HF_HUB_OFFLINE`` is set, so its default model id must never reach ``AsyncEngineArgs``: an offline
    machine has no cached copy of it. Raises ``clef_plugin.api.PluginSettingConflict`` for a ``--model``
    other than the release folder.
    """
    from clef_plugin.api import PluginSettingConflict

    release = str(release_dir)
    model = flags.get("model", release)
    if model != release:
        raise PluginSettingConflict("model", model, f"the release folder is {release!r}")
    return {**flags, "model": release, "tokenizer": flags.get("tokenizer") or release}


def vllm_engine_args(config: EngineConfig, on_gpu: bool) -> AsyncEngineArgs:
    """vLLM's ``AsyncEngineArgs`` from ``config`` (vLLM's own flags and the shared ones), with the plugin's
    settings laid over them.

    A step of :data:`DEFAULT_MAX_NUM_BATCHED_TOKENS` unless ``--max-num-batched-tokens`` says otherwise. On a CPU
    the engine runs eager unless asked otherwise (torch.compile costs about a minute there and gains nothing).
    On a GPU the Gated DeltaNet prefill runs :data:`SERVING_GDN_PREFILL_BACKEND` unless a flag names another.
    vLLM's own tokenizer and input processor are not loaded (``skip_tokenizer_init``): the predictor encodes every
    prompt itself (clef_head) and sends vLLM token ids only; loading them took about 20 s of each start on a 2-core
    machine (BENCHMARKS.md, "Start time"). With ``--vision`` they are: vLLM's multimodal processor needs the
    tokenizer to expand each image's and video's placeholder (it runs no image or video processor: the predictor
    sends pixels).
    Raises ``clef_plugin.api.PluginSettingConflict`` for a contradiction.
    """
    from vllm import AsyncEngineArgs

    import clef_plugin

    flags = {
        "max_num_batched_tokens": DEFAULT_MAX_NUM_BATCHED_TOKENS,
        **release_flags(config.vllm_flags, config.release_dir),
        "data_parallel_size": config.data_parallel_size,
        "max_model_len": config.max_model_len,
        "dtype": config.dtype,
    }
    parsed = AsyncEngineArgs(**flags)
    given = changed_engine_args(parsed)
    if not on_gpu:
        given.setdefault("enforce_eager", True)
    elif "gdn_prefill_backend" not in given and "gdn_prefill_backend" not in given.get("additional_config", {}):
        given["gdn_prefill_backend"] = SERVING_GDN_PREFILL_BACKEND
    settings = clef_plugin.engine_kwargs(config.release_dir, vision=config.vision, **given)
    return dataclasses.replace(parsed, **settings, skip_tokenizer_init=not config.vision)
