"""Images: from bytes to the model's input, bounded before any pixel is decoded.

The original release code puts a record's media ahead of its state: after ``STATE:\\n`` come, per image,
``<|vision_start|>``, one ``<|image_pad|>`` per merged patch and ``<|vision_end|>``, then one ``\\n``, then the
state. The image processor (Qwen3.5's: 16-pixel patches merged 2×2, pixels scaled to [-1, 1]) turns each
image into ``pixel_values`` rows and one ``image_grid_thw`` row; ``mm_token_type_ids`` marks the pad tokens
(1) among the prompt's other tokens (0). :func:`encode_images` builds the same ids and tensors.

:func:`decode_image` accepts PNG and JPEG (the hosted API's formats) recognised by their file signature, and
refuses, naming the field: more bytes than allowed, a size (read from the header) over the pixel or side
limits or the processor's aspect ratio — before the pixels are decoded, so a decompression bomb costs a header
read — and files that do not decode (truncated, corrupt, or another format behind the signature).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO
from typing import TYPE_CHECKING, Any, Protocol

from clef_head.request import InvalidRequest, Location

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
MEDIA_SEPARATOR = "\n"
"""The text after the last image, before the state."""
IMAGE_TOKEN_TYPE = 1
"""``mm_token_type_ids`` of an image's pad tokens (every other token is 0)."""
SIGNATURES: dict[bytes, str] = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}
"""File signatures of the accepted formats, and Pillow's name for each."""
MAX_ASPECT_RATIO = 200
"""Longest side over shortest side: Qwen2-VL's ``smart_resize`` (Qwen3.5's processor) refuses more."""


@dataclass(frozen=True)
class MediaLimits:
    """Bounds on a request's images; each has a default and can be changed by the server."""

    max_images: int = 16
    max_image_bytes: int = 16 * 1024 * 1024
    max_total_bytes: int = 32 * 1024 * 1024
    max_image_pixels: int = 16_777_216
    """Width × height: the largest image Qwen3.5's processor keeps at full size (4096 × 4096)."""
    max_image_side: int = 16384


DEFAULT_MEDIA_LIMITS = MediaLimits()


class ImageProcessor(Protocol):
    """The part of a transformers Qwen2-VL image processor the encoder uses."""

    merge_size: int

    def __call__(self, images: Any, return_tensors: str = ...) -> Any: ...


class Tokenizer(Protocol):
    """The part of a transformers tokenizer the media ids need."""

    def convert_tokens_to_ids(self, token: str) -> Any: ...

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Any: ...


@dataclass(frozen=True)
class EncodedMedia:
    """A prompt's images as the backbone reads them: the media's token ids (placed right after ``STATE:\\n``),
    their ``mm_token_type_ids``, and the processor's ``pixel_values`` and ``image_grid_thw``."""

    token_ids: list[int]
    token_type_ids: list[int]
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    digest: bytes
    """SHA-256 of the image files, in order: what tells two prompts' images apart (the answer cache's key)."""

    @property
    def image_count(self) -> int:
        """Number of images."""
        return int(self.image_grid_thw.shape[0])


def image_format(data: bytes) -> str | None:
    """Pillow's name of the format whose signature ``data`` starts with (``None``: not PNG or JPEG)."""
    for signature, name in SIGNATURES.items():
        if data.startswith(signature):
            return name
    return None


def check_image_bytes(size: int, where: Location, limits: MediaLimits) -> None:
    """Refuse an image of more than ``max_image_bytes`` bytes."""
    if size > limits.max_image_bytes:
        raise InvalidRequest(
            where, f"the image has {size} bytes, more than the {limits.max_image_bytes} allowed", "image_too_large"
        )


def decode_image(data: bytes, where: Location, limits: MediaLimits = DEFAULT_MEDIA_LIMITS) -> Image:
    """The decoded image of a PNG or JPEG file; :class:`InvalidRequest` at ``where`` when it is refused."""
    from PIL import JpegImagePlugin, PngImagePlugin

    check_image_bytes(len(data), where, limits)
    name = image_format(data)
    if name is None:
        raise InvalidRequest(where, "not a PNG or JPEG image (no PNG or JPEG file signature)", "image_format")
    reader = PngImagePlugin.PngImageFile if name == "PNG" else JpegImagePlugin.JpegImageFile
    try:
        image = reader(BytesIO(data))  # the format's own reader: the header only, no size check of Pillow's
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as exc:
        raise InvalidRequest(where, f"the {name} file cannot be read: {exc}", "image_unreadable") from None
    width, height = image.size
    if width * height > limits.max_image_pixels or max(width, height) > limits.max_image_side:
        raise _too_many_pixels(where, (width, height), limits)
    if width < 1 or height < 1:
        raise InvalidRequest(where, f"the image is {width}×{height} pixels: it has no pixels", "image_unreadable")
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise InvalidRequest(
            where,
            f"the image is {width}×{height} pixels; its longer side may be at most {MAX_ASPECT_RATIO} times its "
            "shorter side",
            "image_aspect_ratio",
        )
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as exc:
        raise InvalidRequest(
            where, f"the {name} file does not decode (truncated or corrupt): {exc}", "image_unreadable"
        ) from None
    return image


def _too_many_pixels(where: Location, size: tuple[int, int], limits: MediaLimits) -> InvalidRequest:
    return InvalidRequest(
        where,
        f"the image is {size[0]}×{size[1]} pixels; at most {limits.max_image_pixels} pixels and "
        f"{limits.max_image_side} per side are allowed",
        "image_too_large",
    )


def files_digest(files: Sequence[bytes]) -> bytes:
    """SHA-256 over the files, each preceded by its length (two lists of files never run together)."""
    digest = hashlib.sha256()
    for data in files:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.digest()


@functools.lru_cache(maxsize=4)
def release_image_processor(release_dir: str) -> ImageProcessor:
    """The release's image processor (``processor_config.json``), loaded once per process."""
    from transformers import AutoImageProcessor

    processor: ImageProcessor = AutoImageProcessor.from_pretrained(release_dir)
    return processor


def encode_images(
    tokenizer: Tokenizer, processor: ImageProcessor, images: Sequence[Image], digest: bytes
) -> EncodedMedia:
    """The token ids and tensors of ``images`` (at least one), placed as the original release code places them;
    ``digest``: :func:`files_digest` of their files."""
    if not images:
        raise ValueError("encode_images needs at least one image")
    processed = processor(images=list(images), return_tensors="pt")
    grid = processed["image_grid_thw"]
    start, end, pad = (int(tokenizer.convert_tokens_to_ids(token)) for token in (VISION_START, VISION_END, IMAGE_PAD))
    merged = processor.merge_size**2
    token_ids: list[int] = []
    token_types: list[int] = []
    for row in grid.tolist():
        pads = (row[0] * row[1] * row[2]) // merged
        token_ids += [start, *([pad] * pads), end]
        token_types += [0, *([IMAGE_TOKEN_TYPE] * pads), 0]
    separator = list(tokenizer(MEDIA_SEPARATOR, add_special_tokens=False)["input_ids"])
    return EncodedMedia(
        token_ids=token_ids + separator,
        token_type_ids=token_types + [0] * len(separator),
        pixel_values=processed["pixel_values"],
        image_grid_thw=grid,
        digest=digest,
    )
