"""vLLM reads dict image and video items as processed pixels (clef_plugin.compat.processed_images)."""

from __future__ import annotations

import dataclasses

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
