"""vLLM reads the predictor's image and video items as processed pixels (the release processor's), not embeddings."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from clef_plugin.compat.cuda_probes import cuda_left_uninitialised

with cuda_left_uninitialised():
    from transformers import Qwen3VLProcessor
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.qwen2_vl import Qwen2VLMultiModalDataParser, _create_qwen2vl_field_factory
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ProcessingInfo
    from vllm.model_executor.models.qwen3_vl import Qwen3VLDummyInputsBuilder, Qwen3VLMultiModalProcessor
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.parse import DictEmbeddingItems
    from vllm.transformers_utils.processor import get_processor_kwargs_keys, get_processor_kwargs_type


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


@functools.lru_cache(maxsize=4)
def release_processor(release_dir: str, tokenizer: Any) -> Qwen3VLProcessor:
    """Qwen3-VL's processor of ``release_dir`` made around ``tokenizer`` (one already loaded), once per process.

    Its image and video processors are the ones the predictor prepares media with
    (``clef_head.media.release_image_processor`` and ``release_video_processor``). Made from its parts, so the
    release's ``tokenizer.json`` (248,077 tokens, seconds per load) is not read again: ``from_pretrained`` of
    transformers 5's processors loads the release's tokenizer even when one is given.
    """
    from clef_head.media import release_image_processor, release_video_processor

    return Qwen3VLProcessor(
        image_processor=release_image_processor(release_dir),
        tokenizer=tokenizer,
        video_processor=release_video_processor(release_dir),
        chat_template=tokenizer.chat_template,
    )


class ProcessedImageInfo(Qwen3_5ProcessingInfo):
    """Qwen3.5's processing info whose data parser reads dict image and video items as processed pixels, and whose
    Hugging Face processor is made around the tokenizer vLLM already loaded."""

    def get_data_parser(self) -> Qwen2VLMultiModalDataParser:
        """Qwen3.5's own parser (its settings kept), of its class made by :func:`processed_image_parser`."""
        parser = super().get_data_parser()
        parser.__class__ = processed_image_parser(type(parser))
        return parser

    def get_hf_processor(self, **kwargs: object) -> Qwen3VLProcessor:
        """:func:`release_processor` around vLLM's tokenizer, unless options for the processor itself are set (the
        engine's ``mm_processor_kwargs`` or a request's, other than those its calls take, as vLLM sorts them): then
        vLLM's own loading, which applies them.

        vLLM's own loading reads the release's tokenizer two or more times again in each process that builds a
        multimodal processor (the serving process and the engine core): a processor loaded without options (to
        learn which options are per call), then one given vLLM's tokenizer, whose ``from_pretrained`` reads the
        tokenizer anyway, and again for each other set of per-call options (BENCHMARKS.md, R34).
        """
        processor = release_processor(str(self.ctx.model_config.model), self.get_tokenizer())
        per_call = get_processor_kwargs_keys(get_processor_kwargs_type(processor))
        options = set(self.ctx.get_merged_mm_kwargs(kwargs)) - per_call - {"use_fast", "tokenizer"}
        return super().get_hf_processor(**kwargs) if options else processor


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
