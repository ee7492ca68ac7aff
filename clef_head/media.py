"""Images and videos: from bytes to the model's input, bounded before any pixel is decoded.

The original release code puts a record's media ahead of its state: after ``STATE:\\n`` come, per image,
``<|vision_start|>``, one ``<|image_pad|>`` per merged patch and ``<|vision_end|>``; then, per video,
``<|vision_start|>``, for each pair of kept frames its time (``<1.5 seconds>``) and that pair's own
``<|vision_start|>``, ``<|video_pad|>`` run and ``<|vision_end|>``, then ``<|vision_end|>``; then one ``\\n``,
then the state. The image processor (Qwen3.5's: 16-pixel patches merged 2×2, pixels scaled to [-1, 1]) turns
each image into ``pixel_values`` rows and one ``image_grid_thw`` row; the video processor keeps 2 frames a
second of each video (at least 4 frames, at most all), pairs them and turns each video into
``pixel_values_videos`` rows and one ``video_grid_thw`` row. ``mm_token_type_ids`` marks the image pads (1)
and the video pads (2) among the prompt's other tokens (0). :func:`encode_media` builds the same ids and
tensors.

:func:`decode_image` accepts PNG and JPEG (the hosted API's formats) recognised by their file signature, and
refuses, naming the field: more bytes than allowed, a size (read from the header) over the pixel or side
limits or the processor's aspect ratio — before the pixels are decoded, so a decompression bomb costs a header
read — and files that do not decode (truncated, corrupt, or another format behind the signature).
:func:`decode_videos` reads every frame's header first (each frame bounded as an image; a video's frames of
one size; all frames' pixels within ``max_video_pixels``) and only then decodes them.
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
VIDEO_PAD = "<|video_pad|>"
MEDIA_SEPARATOR = "\n"
"""The text after the last image or video, before the state."""
IMAGE_TOKEN_TYPE = 1
"""``mm_token_type_ids`` of an image's pad tokens (every other token but a video's pads is 0)."""
VIDEO_TOKEN_TYPE = 2
"""``mm_token_type_ids`` of a video's pad tokens."""
MIN_VIDEO_FRAMES = 2
"""Frames a video needs at least: the video processor pairs frames and refuses a video of one."""
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
    max_videos: int = 4
    max_video_frames: int = 64
    """Frames per video (each counted, bounded and decoded as an image; its bytes count with the images')."""
    max_total_frames: int = 128
    max_video_pixels: int = 67_108_864
    """Width × height summed over every frame of a request's videos: what their decoded frames hold in memory."""


DEFAULT_MEDIA_LIMITS = MediaLimits()


class ImageProcessor(Protocol):
    """The part of a transformers Qwen2-VL image processor the encoder uses."""

    merge_size: int

    def __call__(self, images: Any, return_tensors: str = ...) -> Any: ...


class VideoProcessor(Protocol):
    """The part of a transformers Qwen3-VL video processor the encoder uses."""

    merge_size: int
    temporal_patch_size: int

    def __call__(self, videos: Any, **kwargs: Any) -> Any: ...


class Tokenizer(Protocol):
    """The part of a transformers tokenizer the media ids need."""

    def convert_tokens_to_ids(self, token: str) -> Any: ...

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Any: ...


@dataclass(frozen=True)
class ImageSource:
    """One image's (or video frame's) file bytes and the field they came from (named by errors about them)."""

    data: bytes
    where: Location


@dataclass(frozen=True)
class VideoSource:
    """One video's frame files in order, its stated frames per second (``None``: unstated), and its field."""

    frames: tuple[ImageSource, ...]
    fps: float | None
    where: Location


@dataclass(frozen=True)
class Clip:
    """One video's decoded frames (RGB, all of one size), its stated frames per second and its field."""

    frames: tuple[Image, ...]
    fps: float | None
    where: Location


@dataclass(frozen=True)
class EncodedMedia:
    """A prompt's images and videos as the backbone reads them: the media's token ids (placed right after
    ``STATE:\\n``), their ``mm_token_type_ids``, and the processors' tensors (``None`` for a kind the prompt
    has none of): ``pixel_values`` and ``image_grid_thw``; ``pixel_values_videos``, ``video_grid_thw`` and
    each video's kept frame pairs' times in seconds (``video_timestamps``, what the prompt states)."""

    token_ids: list[int]
    token_type_ids: list[int]
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    pixel_values_videos: torch.Tensor | None
    video_grid_thw: torch.Tensor | None
    video_timestamps: tuple[tuple[float, ...], ...]
    video_runs: tuple[tuple[int, int], ...]
    """Each video's [start, end) in ``token_ids``: its frame pairs' times, markers and pads (what stands for
    one ``<|video_pad|>`` of the original's placeholder), between the video's own outer markers."""
    digest: bytes
    """SHA-256 of the media files (:func:`media_digest`): what tells two prompts' media apart (the answer
    cache's key)."""

    @property
    def image_count(self) -> int:
        """Number of images."""
        return 0 if self.image_grid_thw is None else int(self.image_grid_thw.shape[0])

    @property
    def video_count(self) -> int:
        """Number of videos."""
        return len(self.video_timestamps)


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
    return _load(open_image(data, where, limits), where)


def open_image(data: bytes, where: Location, limits: MediaLimits = DEFAULT_MEDIA_LIMITS) -> Image:
    """A PNG or JPEG file's image with only its header read, its size checked against the limits;
    :class:`InvalidRequest` at ``where`` when it is refused."""
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
    return image


def _load(image: Image, where: Location) -> Image:
    """``image`` (opened by :func:`open_image`) with its pixels decoded."""
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as exc:
        raise InvalidRequest(
            where, f"the {image.format} file does not decode (truncated or corrupt): {exc}", "image_unreadable"
        ) from None
    return image


def decode_videos(videos: Sequence[VideoSource], limits: MediaLimits = DEFAULT_MEDIA_LIMITS) -> list[Clip]:
    """Every video's frames decoded and converted to RGB (as the image processor converts images), once every
    frame's header has been read and checked: each frame as an image, a video's frames all of its first
    frame's size (the video processor stacks them), all frames' pixels within ``max_video_pixels``."""
    opened: list[list[Image]] = []
    pixels = 0
    for video in videos:
        frames = [open_image(frame.data, frame.where, limits) for frame in video.frames]
        for frame, source in zip(frames[1:], video.frames[1:], strict=True):
            if frame.size != frames[0].size:
                raise InvalidRequest(
                    source.where,
                    f"the frame is {frame.size[0]}×{frame.size[1]} pixels, the video's first frame "
                    f"{frames[0].size[0]}×{frames[0].size[1]}: a video's frames must all be of one size",
                    "video_frame_size",
                )
        pixels += len(frames) * frames[0].size[0] * frames[0].size[1]
        if pixels > limits.max_video_pixels:
            raise InvalidRequest(
                video.where,
                f"the videos' frames have more than {limits.max_video_pixels} pixels in all (width × height summed "
                "over every frame); send fewer or smaller frames",
                "video_too_large",
            )
        opened.append(frames)
    return [
        Clip(
            tuple(
                _load(frame, source.where).convert("RGB") for frame, source in zip(frames, video.frames, strict=True)
            ),
            video.fps,
            video.where,
        )
        for frames, video in zip(opened, videos, strict=True)
    ]


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


def media_digest(images: Sequence[ImageSource], videos: Sequence[VideoSource] = ()) -> bytes:
    """SHA-256 of a prompt's media: its images' files, then each video's frame count, stated fps and frame
    files (a frame moved from one video to the next, or another fps, gives another digest)."""
    parts = [files_digest([image.data for image in images])]
    for video in videos:
        fps = b"" if video.fps is None else struct.pack("<d", video.fps)
        parts += [len(video.frames).to_bytes(8, "little") + fps, files_digest([frame.data for frame in video.frames])]
    return files_digest(parts)


@functools.lru_cache(maxsize=4)
def release_image_processor(release_dir: str) -> ImageProcessor:
    """The release's image processor (``processor_config.json``), loaded once per process."""
    from transformers import AutoImageProcessor

    processor: ImageProcessor = AutoImageProcessor.from_pretrained(release_dir)
    return processor


@functools.lru_cache(maxsize=4)
def release_video_processor(release_dir: str) -> VideoProcessor:
    """The release's video processor, loaded once per process."""
    from transformers import AutoVideoProcessor

    processor: VideoProcessor = AutoVideoProcessor.from_pretrained(release_dir)
    return processor


def frame_timestamps(indices: Sequence[int], fps: float, group: int) -> tuple[float, ...]:
    """The time in seconds of each group of ``group`` kept frames (the frames at ``indices`` of a clip at
    ``fps``; the last frame repeated to fill the last group): the mean of the group's first and last frames'
    times, as the video processor's prompt states them."""
    padded = [*indices, *[indices[-1]] * (-len(indices) % group)]
    seconds = [index / fps for index in padded]
    return tuple((seconds[start] + seconds[start + group - 1]) / 2 for start in range(0, len(seconds), group))


@dataclass
class _MediaTokens:
    """The media's token ids and ``mm_token_type_ids`` as they are built, image by image, video by video."""

    ids: list[int]
    types: list[int]

    def add(self, ids: Sequence[int], token_type: int = 0) -> None:
        self.ids += ids
        self.types += [token_type] * len(ids)


def encode_media(
    tokenizer: Tokenizer,
    images: Sequence[Image],
    videos: Sequence[Clip],
    digest: bytes,
    image_processor: ImageProcessor | None = None,
    video_processor: VideoProcessor | None = None,
    pixel_dtype: torch.dtype | None = None,
) -> EncodedMedia:
    """The token ids and tensors of ``images`` and ``videos`` (at least one of them), placed as the original
    release code places them (images first); ``digest``: :func:`media_digest` of their files. Each kind needs
    its processor. ``pixel_dtype``: the dtype of the vision tower that reads the pixels (``None``: the processors'
    float32). The tower casts its pixels to its own dtype before anything else, so casting them here gives it the
    same values; a bfloat16 tower's pixels then take half the bytes wherever they travel."""
    if not images and not videos:
        raise ValueError("encode_media needs at least one image or video")
    start, end, image_pad, video_pad = (
        int(tokenizer.convert_tokens_to_ids(token)) for token in (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
    )
    tokens = _MediaTokens([], [])
    pixel_values = image_grid = None
    if images:
        if image_processor is None:
            raise ValueError("images need the image processor")
        processed = image_processor(images=list(images), return_tensors="pt")
        pixel_values, image_grid = processed["pixel_values"], processed["image_grid_thw"]
        if pixel_dtype is not None:
            pixel_values = pixel_values.to(pixel_dtype)
        for row in image_grid.tolist():
            tokens.add([start])
            tokens.add([image_pad] * ((row[0] * row[1] * row[2]) // image_processor.merge_size**2), IMAGE_TOKEN_TYPE)
            tokens.add([end])
    video_pixels = video_grid = None
    timestamps: list[tuple[float, ...]] = []
    runs: list[tuple[int, int]] = []
    if videos:
        if video_processor is None:
            raise ValueError("videos need the video processor")
        processed = video_processor(
            videos=[list(clip.frames) for clip in videos],
            video_metadata=[{"total_num_frames": len(clip.frames), "fps": clip.fps} for clip in videos],
            return_metadata=True,
            return_tensors="pt",
        )
        video_pixels, video_grid = processed["pixel_values_videos"], processed["video_grid_thw"]
        if pixel_dtype is not None:
            video_pixels = video_pixels.to(pixel_dtype)
        for row, metadata in zip(video_grid.tolist(), processed["video_metadata"], strict=True):
            indices = [int(index) for index in metadata.frames_indices]
            times = frame_timestamps(indices, float(metadata.fps), video_processor.temporal_patch_size)
            if len(times) != row[0]:
                raise AssertionError(f"{len(times)} frame pairs timed for a video of {row[0]}")
            timestamps.append(times)
            tokens.add([start])
            run_start = len(tokens.ids)
            for seconds in times:
                tokens.add(tokenizer(f"<{seconds:.1f} seconds>", add_special_tokens=False)["input_ids"])
                tokens.add([start])
                tokens.add([video_pad] * ((row[1] * row[2]) // video_processor.merge_size**2), VIDEO_TOKEN_TYPE)
                tokens.add([end])
            runs.append((run_start, len(tokens.ids)))
            tokens.add([end])
    tokens.add(tokenizer(MEDIA_SEPARATOR, add_special_tokens=False)["input_ids"])
    return EncodedMedia(
        token_ids=tokens.ids,
        token_type_ids=tokens.types,
        pixel_values=pixel_values,
        image_grid_thw=image_grid,
        pixel_values_videos=video_pixels,
        video_grid_thw=video_grid,
        video_timestamps=tuple(timestamps),
        video_runs=tuple(runs),
        digest=digest,
    )
