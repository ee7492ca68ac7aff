"""Everything that differs between the supported vLLM versions (0.26 on GPUs, 0.32 on CPUs).

Differences are detected by feature, not by version number, so a patch release that backports
a change keeps working. Nothing else in the plugin reaches into vLLM internals that moved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import multiprocessing
import os
import pickle
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import vllm
from packaging.specifiers import SpecifierSet
from packaging.version import Version

logger = logging.getLogger(__name__)

DEVICE_PROBES = ("is_available", "get_device_name", "get_device_capability", "current_device")
"""The ``torch.cuda`` functions that modules of vLLM's Qwen3.5 call while they are imported (vLLM 0.26's copy of FLA,
``vllm/third_party/flash_linear_attention/ops/utils.py``: the device's name and capability, and Triton's current
target: Triton's driver is created with ``is_available`` and reads the target through ``current_device`` and
``get_device_capability``, references to which it keeps). Each of them initialises CUDA in the importing process
(``is_available`` the driver only, through ``cudaGetDeviceCount``: that too breaks CUDA in a forked child)."""


def device_facts() -> dict[str, list[Any]]:
    """What the import-time probes read, for every visible device: names, capabilities and Triton's device
    properties (FLA's ``check_shared_mem`` sizes its kernels' blocks by ``max_shared_mem``). Initialises CUDA: run
    it in a child process (:func:`facts_from_child`)."""
    import triton

    count = torch.cuda.device_count()
    utils = triton.runtime.driver.active.utils
    return {
        "names": [torch.cuda.get_device_name(index) for index in range(count)],
        "capabilities": [tuple(torch.cuda.get_device_capability(index)) for index in range(count)],
        "triton_properties": [dict(utils.get_device_properties(index)) for index in range(count)],
    }


def facts_from_child() -> dict[str, list[Any]]:
    """:func:`device_facts` read in a forked child, so that this process does not initialise CUDA (as vLLM reads
    device properties, ``vllm.utils.platform_utils.cuda_get_device_properties``). A bare fork: the child runs the
    function it already holds and imports nothing this process is still importing (this module is, and a pool's
    worker would wait for its import lock forever)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write the facts (or the error) and leave at once
        os.close(reader)
        try:
            payload = pickle.dumps(("ok", device_facts()))
        except BaseException as exc:  # noqa: BLE001 (reported to the parent, whatever it is)
            payload = pickle.dumps(("error", repr(exc)))
        with os.fdopen(writer, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as incoming:
        data = incoming.read()
    os.waitpid(pid, 0)
    if not data:
        raise RuntimeError("reading device facts in a child process failed: the child wrote nothing")
    status, value = pickle.loads(data)
    if status != "ok":
        raise RuntimeError(f"reading device facts in a child process failed: {value}")
    facts: dict[str, list[Any]] = value
    return facts


def _device_index(device: Any = None) -> int:
    """The index ``torch.cuda`` would read for ``device`` in a process that never selected one (device 0)."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    return torch.device(device).index or 0


def _answers_device_probes() -> bool:
    """Whether imports should be shielded from CUDA here (:func:`cuda_left_uninitialised`): in the main process of
    a CUDA machine that has not initialised CUDA yet, unless vLLM is told to spawn its processes anyway."""
    return (
        torch.version.cuda is not None
        and not torch.cuda.is_initialized()
        and multiprocessing.parent_process() is None
        and os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "spawn"
        and torch.cuda.device_count() > 0  # NVML: does not initialise CUDA
    )


@contextlib.contextmanager
def cuda_left_uninitialised(facts: Callable[[], dict[str, list[Any]]] = facts_from_child) -> Iterator[None]:
    """Imports inside the block find their device probes (:data:`DEVICE_PROBES`, Triton's driver and its device
    properties) answered from ``facts()``, read in a child process, so they leave CUDA uninitialised here.

    vLLM starts its engine core with ``fork`` unless CUDA is initialised in the process that starts it
    (``vllm.utils.system_utils._maybe_force_spawn``); spawned, the engine core imports torch, vLLM and the predictor
    again (20 to 26 s of every start on an H200, BENCHMARKS.md R17). Importing vLLM's Qwen3.5 initialised CUDA in
    every process that imports this plugin, the predictor's and ``vllm serve``'s front ends included, so their engine
    cores were spawned. The answers are the ones the probes would have read here (the same calls, in the child), so
    the modules' import-time settings (FLA's block sizes by shared memory, its Hopper switch) are the same as before,
    and a forked engine core inherits them. Elsewhere (CUDA already initialised, no GPU, a child process, spawn asked
    for) or if the child fails, the block runs as it is.
    """
    if not _answers_device_probes():
        yield
        return
    try:
        answers = facts()
    except Exception as exc:  # noqa: BLE001 (a child that cannot read them, for any reason: import as before)
        logger.warning("device properties not read in a child process (%r): imports may initialise CUDA", exc)
        yield
        return
    import triton

    def available() -> bool:
        return bool(answers["names"])

    with _standing_in([(torch.cuda, "is_available", available)]):
        driver = triton.runtime.driver.active  # created now, keeping torch's own functions, not the stand-ins below
        utils = driver.utils

    def name(device: Any = None) -> str:
        return str(answers["names"][_device_index(device)])

    def capability(device: Any = None) -> tuple[int, int]:
        major, minor = answers["capabilities"][_device_index(device)]
        return int(major), int(minor)

    def properties(device: int) -> dict[str, Any]:
        return dict(answers["triton_properties"][device])

    with _standing_in(
        [
            (torch.cuda, "is_available", available),
            (torch.cuda, "get_device_name", name),
            (torch.cuda, "get_device_capability", capability),
            (torch.cuda, "current_device", lambda: 0),
            (driver, "get_current_device", lambda: 0),
            (driver, "get_device_capability", capability),
            (utils, "get_device_properties", properties),
        ]
    ):
        yield


@contextlib.contextmanager
def _standing_in(stand_ins: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each ``(owner, attribute, stand_in)``: ``owner.attribute`` is ``stand_in`` inside the block, as before after."""
    originals = [(owner, attribute, getattr(owner, attribute)) for owner, attribute, _ in stand_ins]
    try:
        for owner, attribute, stand_in in stand_ins:
            setattr(owner, attribute, stand_in)
        yield
    finally:
        for owner, attribute, original in reversed(originals):
            setattr(owner, attribute, original)


with cuda_left_uninitialised():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.pooler import PoolingParamsUpdate
    from vllm.model_executor.layers.pooler.abstract import Pooler
    from vllm.model_executor.layers.pooler.tokwise.methods import AllPool
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, Qwen3_5ForConditionalGenerationConfig
    from vllm.model_executor.models.qwen2_vl import Qwen2VLMultiModalDataParser, _create_qwen2vl_field_factory
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ProcessingInfo
    from vllm.model_executor.models.qwen3_vl import Qwen3VLDummyInputsBuilder, Qwen3VLMultiModalProcessor
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.parse import DictEmbeddingItems
    from vllm.v1.pool.metadata import PoolingMetadata

SUPPORTED_VLLM = SpecifierSet(">=0.26.0,<0.33")
"""vLLM releases the plugin is tested with (keep in step with the ``vllm`` extra in pyproject.toml)."""

__all__ = [
    "AllPool",
    "Pooler",
    "PoolingMetadata",
    "PoolingParamsUpdate",
    "SUPPORTED_VLLM",
    "check_vllm_version",
    "cuda_left_uninitialised",
    "finished_mask",
    "install_config_hook",
    "processed_image_settings",
    "processed_videos_supported",
    "prompt_hidden_states",
    "register_processed_images",
    "row_wise_fp8_on_cpu",
    "skip_router_gemm_warmup",
]


def check_vllm_version() -> None:
    """Warn once when the installed vLLM is outside :data:`SUPPORTED_VLLM`."""
    installed = Version(vllm.__version__)
    if Version(installed.base_version) not in SUPPORTED_VLLM:
        logger.warning("clef_plugin is tested with vLLM %s; vLLM %s is installed", SUPPORTED_VLLM, vllm.__version__)


def finished_mask(pooling_metadata: PoolingMetadata) -> list[bool]:
    """Per scheduled request: True when this step completes its prompt."""
    cursor = pooling_metadata.get_pooling_cursor()
    if hasattr(cursor, "get_finished_mask"):  # vLLM >= 0.27
        return list(cursor.get_finished_mask())
    return cursor.is_finished().tolist()


def prompt_hidden_states(
    collector: AllPool, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
) -> list[torch.Tensor | None]:
    """Each request's full [prompt_len, hidden] states once its prefill is complete, else None.

    vLLM's ``AllPool`` keeps the chunks of a chunked prefill across steps. Before vLLM 0.27 it
    kept views into the step's output buffer, which the next step (a CUDA graph replay, for
    instance) may overwrite; there the step's states are copied first whenever a request is
    still mid-prefill.
    """
    owns_chunks = hasattr(collector, "clone_finished")
    if not owns_chunks and collector.enable_chunked_prefill and not all(finished_mask(pooling_metadata)):
        hidden_states = hidden_states.clone()
    return collector(hidden_states, pooling_metadata)


def install_config_hook(architecture: str, hook: type) -> None:
    """Run ``hook.verify_and_update_config(vllm_config)`` for engines of ``architecture``.

    vLLM looks up per-architecture config hooks in ``MODELS_CONFIG_MAP`` when it builds an
    engine's config (before the scheduler and KV cache exist). The hook must chain Qwen3.5's own
    hook (:data:`QWEN3_5_CONFIG_HOOK`), which sets the Gated DeltaNet state dtype.
    """
    MODELS_CONFIG_MAP[architecture] = hook


QWEN3_5_CONFIG_HOOK = Qwen3_5ForConditionalGenerationConfig
"""vLLM's config hook for Qwen3.5 (state dtypes of the linear-attention layers)."""


PROCESSED_IMAGE_FIELDS = frozenset({"pixel_values", "image_grid_thw"})
"""An image item as the predictor sends it: the release processor's ``pixel_values`` rows and its
``image_grid_thw`` row (which sizes the item's placeholder run)."""
PROCESSED_VIDEO_FIELDS = frozenset({"pixel_values_videos", "video_grid_thw", "timestamps"})
"""A video item as the predictor sends it: the release video processor's ``pixel_values_videos`` rows, its
``video_grid_thw`` row and its frame pairs' times in seconds (which, with the grid, make the item's
placeholder run: each pair's ``<t seconds>`` text, markers and pads)."""


_PROCESSED_PARSERS: dict[type, type[Qwen2VLMultiModalDataParser]] = {}


def processed_image_parser(base: type[Qwen2VLMultiModalDataParser]) -> type[Qwen2VLMultiModalDataParser]:
    """``base`` (the data parser vLLM's Qwen3.5 processing builds: Qwen2-VL's before vLLM 0.32, Qwen3-VL's
    since) reading dict image and video items as already-processed pixels instead of embeddings.

    vLLM passes such an item's tensors through to the model untouched (no image or video processor runs in
    vLLM) and still expands the item's one ``<|image_pad|>`` to ``t·h·w / merge²`` tokens from its grid, and a
    video's one ``<|video_pad|>`` to, per frame pair, its ``<t seconds>`` text, ``<|vision_start|>``, ``h·w /
    merge²`` pads and ``<|vision_end|>`` from its grid and ``timestamps``. Both versions take dict items as
    ``DictEmbeddingItems`` with Qwen2-VL's field factory, which declares ``pixel_values`` and
    ``pixel_values_videos`` (and, since vLLM 0.32, ``timestamps``).
    """

    if base in _PROCESSED_PARSERS:
        return _PROCESSED_PARSERS[base]

    class ProcessedImageParser(base):
        def _parse_image_data(self, data: Any) -> Any:
            if isinstance(data, dict):
                return DictEmbeddingItems(
                    data,
                    modality="image",
                    required_fields=set(PROCESSED_IMAGE_FIELDS),
                    fields_factory=_create_qwen2vl_field_factory(self._spatial_merge_size),
                )
            return super()._parse_image_data(data)

        def _parse_video_data(self, data: Any) -> Any:
            if isinstance(data, dict):
                return DictEmbeddingItems(
                    data,
                    modality="video",
                    required_fields=set(PROCESSED_VIDEO_FIELDS),
                    fields_factory=_create_qwen2vl_field_factory(self._spatial_merge_size),
                )
            return super()._parse_video_data(data)

    _PROCESSED_PARSERS[base] = ProcessedImageParser
    return ProcessedImageParser


def processed_videos_supported() -> bool:
    """Whether this vLLM takes processed video items: its Qwen2-VL field factory declares the frame times
    (``timestamps``, which its Qwen3-VL processing writes into each video's placeholder run). Without them
    vLLM could not write the run the predictor placed, so videos are not sent to it."""
    return "timestamps" in _create_qwen2vl_field_factory(2)({})


class ProcessedImageInfo(Qwen3_5ProcessingInfo):
    """Qwen3.5's processing info whose data parser reads dict image and video items as processed pixels."""

    def get_data_parser(self) -> Qwen2VLMultiModalDataParser:
        """Qwen3.5's own parser (its settings kept), of its class made by :func:`processed_image_parser`."""
        parser = super().get_data_parser()
        parser.__class__ = processed_image_parser(type(parser))
        return parser


def register_processed_images(model_class: type) -> None:
    """Have vLLM read ``model_class``'s dict image and video items as processed pixels
    (:class:`ProcessedImageInfo`)."""
    MULTIMODAL_REGISTRY.register_processor(
        Qwen3VLMultiModalProcessor, info=ProcessedImageInfo, dummy_inputs=Qwen3VLDummyInputsBuilder
    )(model_class)


def processed_image_settings() -> dict[str, Any]:
    """Engine settings under which vLLM reads processed pixels as they are.

    Dict image and video items are accepted only with ``enable_mm_embeds``. vLLM releases that normalize pixels on the
    device (``mm_device_do_normalize``, on by default) would normalize the processor's already-normalized
    pixels a second time; it is turned off where it exists.
    """
    settings: dict[str, Any] = {"enable_mm_embeds": True}
    if "mm_device_do_normalize" in {field.name for field in dataclasses.fields(EngineArgs)}:
        settings["mm_device_do_normalize"] = False
    return settings


ROUTER_GEMM_WARMUP = "_warmup_ll_bf16_router_gemm"
"""vLLM's start-up warm-up of its CuTe-DSL BF16 GEMMs for MoE routers, a function of
``vllm.model_executor.warmup.kernel_warmup`` that ``kernel_warmup(worker)`` calls on every engine start on SM90 or
newer. vLLM 0.26's takes no arguments and compiles the GEMMs of fixed DeepSeek-sized router shapes whatever the model
(12 to 15 s of every start on an H200, kept in memory only); vLLM 0.32's takes the model and warms up only the shapes
of its own routers (none for Clef's dense backbone)."""

_ROUTERLESS_MODELS: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
"""The models without a MoE router built in this process and still alive (vLLM builds one per worker process)."""


class RouterGemmWarmupUnlessRouterless:
    """vLLM 0.26's router-GEMM warm-up, skipped while a model without MoE routers is alive in this process."""

    def __init__(self, original: Callable[[], None]) -> None:
        self.original = original

    def __call__(self) -> None:
        if _ROUTERLESS_MODELS:
            names = sorted({type(model).__name__ for model in _ROUTERLESS_MODELS})
            logger.info("vLLM's ll_bf16 router GEMM warm-up skipped: %s has no MoE router", ", ".join(names))
            return
        self.original()


def skip_router_gemm_warmup(model: torch.nn.Module) -> None:
    """Have vLLM skip its router-GEMM warm-up (:data:`ROUTER_GEMM_WARMUP`) for ``model``, which has no MoE router.

    Where vLLM's warm-up takes the model, it finds no router in it and skips by itself: nothing is changed. Where it
    takes no arguments (vLLM 0.26), it is replaced, in its module, by :class:`RouterGemmWarmupUnlessRouterless`, which
    skips it while ``model`` is alive in this process (``kernel_warmup`` runs in the worker process that built the
    model, after building it); an engine of another model built later in the same process, once ``model`` is gone,
    gets vLLM's warm-up as before. vLLM offers no engine argument or variable for it (its ``kernel_config`` switches
    cover FlashInfer's autotuning and the registered CuTe-DSL compile units, not this warm-up).
    """
    from vllm.model_executor.warmup import kernel_warmup

    warmup = getattr(kernel_warmup, ROUTER_GEMM_WARMUP, None)
    if warmup is None:
        logger.warning(
            "vLLM %s has no %s: its router-GEMM warm-up is left to vLLM", vllm.__version__, ROUTER_GEMM_WARMUP
        )
        return
    if isinstance(warmup, RouterGemmWarmupUnlessRouterless):
        _ROUTERLESS_MODELS.add(model)
        return
    if inspect.signature(warmup).parameters:  # it reads the model's own router shapes
        return
    _ROUTERLESS_MODELS.add(model)
    setattr(kernel_warmup, ROUTER_GEMM_WARMUP, RouterGemmWarmupUnlessRouterless(warmup))


def _row_wise_scaled_mm_works() -> bool:
    """Whether this PyTorch multiplies FP8 matrices on the CPU with one scale per row of A and per column of B."""
    a = torch.ones(2, 16, dtype=torch.float8_e4m3fn)
    b = torch.ones(16, 16, dtype=torch.float8_e4m3fn)
    scale_a = torch.full((2, 1), 2.0, dtype=torch.float32)
    scale_b = torch.full((1, 16), 0.5, dtype=torch.float32)
    try:
        out = torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
    return bool(torch.equal(out, torch.full((2, 16), 16.0, dtype=torch.bfloat16)))


def row_wise_fp8_on_cpu() -> type | None:
    """On a CPU, have vLLM run FP8 W8A8 layers with per-channel weight and per-token activation scales (the FP8
    release's scheme) through PyTorch's row-wise ``torch._scaled_mm``; return the kernel class added, or None.

    vLLM's CPU kernel list (``_POSSIBLE_FP8_KERNELS[CPU]`` in ``vllm.model_executor.kernels.linear``) has a native
    kernel for these layers only on CPUs with AMX-FP8; elsewhere it picks ``ChannelWiseTorchFP8ScaledMMLinearKernel``,
    which calls ``torch._scaled_mm`` with unit per-tensor scales and applies the real ones after. PyTorch's CPU
    ``_scaled_mm`` takes a reference path for per-tensor scales (1.8 s for a 190×512×512 product on an AVX-512
    Xeon) and oneDNN's for row-wise ones (4 ms), so the tiny FP8 release's prompts ran at about 27 tokens/s. vLLM's
    ``RowWiseTorchFP8ScaledMMLinearKernel`` makes the row-wise call but declares itself ROCm-only; a subclass that
    declares the CPU is placed just before the channel-wise kernel, so it takes exactly the layers that one would
    (the same products, its scaling fused into the GEMM: equal within BF16 rounding). Nothing changes on GPUs, on
    CPUs where vLLM has a native kernel for these layers, or where this PyTorch lacks the row-wise CPU product.
    Idempotent: the kernel list is vLLM's, for the whole process."""
    from vllm.platforms import PlatformEnum, current_platform

    if not current_platform.is_cpu():
        return None
    try:
        from vllm.model_executor.kernels import linear
        from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
            ChannelWiseTorchFP8ScaledMMLinearKernel,
            RowWiseTorchFP8ScaledMMLinearKernel,
        )
    except ImportError as exc:
        logger.warning("vLLM's CPU FP8 kernels left as they are: %s", exc)
        return None
    kernels: list[type] | None = getattr(linear, "_POSSIBLE_FP8_KERNELS", {}).get(PlatformEnum.CPU)
    if kernels is None:
        logger.warning("vLLM's CPU FP8 kernels left as they are: vLLM %s has no CPU kernel list", vllm.__version__)
        return None
    present = [kernel for kernel in kernels if getattr(kernel, "clef_cpu_row_wise", False)]
    if present:
        return present[0]
    if ChannelWiseTorchFP8ScaledMMLinearKernel not in kernels or not _row_wise_scaled_mm_works():
        logger.warning("vLLM's CPU FP8 kernels left as they are: no channel-wise fallback or no row-wise _scaled_mm")
        return None

    class CPURowWiseTorchFP8ScaledMMLinearKernel(RowWiseTorchFP8ScaledMMLinearKernel):
        """vLLM's row-wise ``torch._scaled_mm`` kernel, on the CPU (:func:`row_wise_fp8_on_cpu`)."""

        clef_cpu_row_wise = True

        @classmethod
        def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
            if not current_platform.is_cpu():
                return False, "requires CPU."
            return True, None

    kernels.insert(kernels.index(ChannelWiseTorchFP8ScaledMMLinearKernel), CPURowWiseTorchFP8ScaledMMLinearKernel)
    return CPURowWiseTorchFP8ScaledMMLinearKernel
