"""vLLM reads dict image and video items as processed pixels (clef_plugin.compat.processed_images)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm


def test_processed_images_parse_as_passthrough_pixels() -> None:
    """Pins vLLM's data parser: a dict image item is pixels and a grid, passed through, one item a grid row."""
    from vllm.model_executor.models.qwen2_vl import Qwen2VLMultiModalDataParser
    from vllm.multimodal.parse import DictEmbeddingItems

    from clef_plugin.compat.processed_images import processed_image_parser

    parser = processed_image_parser(Qwen2VLMultiModalDataParser)(2)
    items = parser.parse_mm_data(
        {"image": {"pixel_values": torch.zeros(20, 4), "image_grid_thw": torch.tensor([[1, 4, 4], [1, 2, 2]])}}
    )["image"]
    assert isinstance(items, DictEmbeddingItems) and len(items) == 2
    assert set(items.get_passthrough_data()) == {"pixel_values", "image_grid_thw"}
    with pytest.raises(ValueError, match="should contain the fields"):
        parser.parse_mm_data(
            {"image": {"image_embeds": torch.zeros(5, 4), "image_grid_thw": torch.tensor([[1, 2, 2]])}}
        )
    timestamps = [torch.tensor([0.25, 1.5], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64)]
    video = {
        "pixel_values_videos": torch.zeros(20, 4),
        "video_grid_thw": torch.tensor([[2, 2, 4], [1, 2, 2]]),
        "timestamps": timestamps,
    }
    videos = parser.parse_mm_data({"video": video})["video"]
    assert isinstance(videos, DictEmbeddingItems) and len(videos) == 2
    assert set(videos.get_passthrough_data()) == {"pixel_values_videos", "video_grid_thw", "timestamps"}
    with pytest.raises(ValueError, match="should contain the fields"):
        parser.parse_mm_data({"video": {key: value for key, value in video.items() if key != "timestamps"}})


def test_engine_settings_take_processed_pixels_as_they_are() -> None:
    """Pins vLLM's engine arguments: dict items need ``enable_mm_embeds``; pixels are not normalized twice."""
    from vllm.engine.arg_utils import EngineArgs

    from clef_plugin.compat.processed_images import processed_image_settings

    fields = {field.name for field in dataclasses.fields(EngineArgs)}
    settings = processed_image_settings()
    assert settings["enable_mm_embeds"] is True and set(settings) <= fields
    assert settings.get("mm_device_do_normalize", False) is False
    assert ("mm_device_do_normalize" in settings) == ("mm_device_do_normalize" in fields)


def test_hf_processor_is_made_around_vllms_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pins vLLM's multimodal processing context: the Qwen3-VL processor it asks for at start, in profiling and at
    each image (with a video's per-call options too) is one processor made around the tokenizer vLLM loaded, and
    the release's tokenizer is read once (vLLM's own loading read it again for each); a processor option that is
    not a per-call one still goes through vLLM's own loading, which applies it. A release of its own, so that no
    cache of vLLM's from another test serves it."""
    from transformers import Qwen3VLProcessor
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from vllm.engine.arg_utils import EngineArgs
    from vllm.multimodal import MULTIMODAL_REGISTRY

    import clef_plugin
    from clef_tools.tiny import build_tiny_release

    release = build_tiny_release(tmp_path / "release", seed=3, vocabulary="toy").path

    reads: list[str] = []
    load = PreTrainedTokenizerBase.from_pretrained.__func__  # type: ignore[attr-defined]

    def counted(cls: type, *args: Any, **kwargs: Any) -> Any:
        reads.append(cls.__name__)
        return load(cls, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "from_pretrained", classmethod(counted))
    settings = clef_plugin.engine_kwargs(release, max_model_len=512, enforce_eager=True, vision=True)
    info = MULTIMODAL_REGISTRY.create_processor(EngineArgs(**settings).create_model_config()).info

    processor = info.get_hf_processor()
    assert isinstance(processor, Qwen3VLProcessor) and processor.tokenizer is info.get_tokenizer()
    assert info.get_hf_processor(use_fast=True, fps=2.0, do_sample_frames=False) is processor
    assert info.get_image_processor().merge_size == 2 and info.get_video_processor() is processor.video_processor
    assert len(reads) == 1, reads

    template = "{{ messages }}"
    own = info.get_hf_processor(chat_template=template)
    assert own is not processor and isinstance(own, Qwen3VLProcessor) and own.chat_template == template
    assert len(reads) > 1
