"""A request's images and videos, from where the caller put them to the order the model reads them.

Two forms are accepted, and may be mixed:

- ``images`` (the original release code's field): a list of images, each a ``data:image/png;base64,...`` or
  ``data:image/jpeg;base64,...`` URL or bare base64 text;
- ``assets`` (the hosted API's field, what the TypeSafe SDK's ``Image`` sends): placeholder → ``data_base64``
  and ``format``, or the ``part`` of a ``multipart/form-data`` body holding the bytes. Each placeholder must
  appear, as or inside a string, in the state, an instruction or a criterion (option or level description).

The original code puts every image ahead of the state, in ``images`` order, and has no placeholders. So the
model reads ``images`` first, then each asset in the order its placeholder first appears in the prompt (the
state as rendered, keys sorted; then each question's instructions and its options in prompt order); every
occurrence of a placeholder is replaced by ``[image N]``, N being the image's place in that order (from 1).
A request so resolved is the original's record ``{"images": [...], "state": ..., "questions": ...}`` with the
same texts: that is what parity is checked against. Object keys (state keys, choice labels) are not searched.

Videos (the original's ``videos``, each ``{"frames": [...], "fps": ...}``) come after the images, in order;
their frames are read as ``images`` reads an image, and their bytes count with the images'.

Refused, naming the field: more than ``max_images`` images, an asset whose placeholder appears nowhere, an
asset naming a part the body lacks, a part no asset claims or two assets claim, more than ``max_videos``
videos, a video of fewer than 2 or more than ``max_video_frames`` frames, more than ``max_total_frames``
frames in all, base64 that does not decode, and (checked before decoding) more bytes than allowed.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from clef_head.encoder import question_options
from clef_head.media import MIN_VIDEO_FRAMES, ImageSource, MediaLimits, VideoSource, check_image_bytes
from clef_head.request import (
    ChoiceQuestion,
    InvalidRequest,
    Location,
    NoulCriteria,
    NoulQuestion,
    Question,
    ScoreQuestion,
    SystemOneRequest,
)

DATA_URL = re.compile(r"data:image/(png|jpeg|jpg);base64,", re.IGNORECASE)
"""The prefix of an accepted data URL (the rest is base64)."""


@dataclass(frozen=True)
class ResolvedRequest:
    """A request whose placeholders are replaced (``images``, ``assets`` and ``videos`` dropped), its images
    in the order the model reads them, and its videos."""

    request: SystemOneRequest
    images: tuple[ImageSource, ...]
    videos: tuple[VideoSource, ...] = ()


def image_label(number: int) -> str:
    """What replaces a placeholder: the image's place (from 1) among the images ahead of the state."""
    return f"[image {number}]"


def decode_base64(text: str, where: Location, limits: MediaLimits) -> bytes:
    """The bytes of base64 ``text`` (its length checked against the byte limit before decoding)."""
    check_image_bytes(len(text) // 4 * 3 - 2, where, limits)  # at most 2 of them are padding
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(where, "is not valid base64", "base64") from None


def _image_field(text: str, where: Location, limits: MediaLimits) -> bytes:
    prefix = DATA_URL.match(text)
    if prefix is None and text.startswith("data:"):
        raise InvalidRequest(where, "a data URL must start data:image/png;base64, or data:image/jpeg;base64,", "url")
    return decode_base64(text[prefix.end() :] if prefix else text, where, limits)


def resolve_media(request: SystemOneRequest, parts: Mapping[str, bytes], limits: MediaLimits) -> ResolvedRequest:
    """The request with its placeholders replaced and its images in model order (module docstring);
    ``parts``: the multipart body's parts other than ``request`` (empty for a JSON body)."""
    images = request.images or []
    assets = request.assets or {}
    if len(images) + len(assets) > limits.max_images:
        where: Location = ("assets",) if assets else ("images",)
        raise InvalidRequest(
            where,
            f"{len(images) + len(assets)} images were sent; at most {limits.max_images} are allowed per request",
            "too_many_images",
        )
    _check_parts(assets, parts)
    _check_video_counts(request, limits)
    total = 0
    sources: list[ImageSource] = []
    for index, text in enumerate(images):
        sources.append(ImageSource(_image_field(text, ("images", index), limits), ("images", index)))
    order = _first_references(request, list(assets))
    for placeholder in assets:
        if placeholder not in order:
            raise InvalidRequest(
                ("assets", placeholder),
                "is not referenced: its placeholder appears in no string of the state, instructions or criteria",
                "asset_unreferenced",
            )
    labels: dict[str, str] = {}
    for placeholder in order:
        asset = assets[placeholder]
        if asset.part is not None:
            at: Location = ("assets", placeholder, "part")
            data = parts[asset.part]
        else:
            at = ("assets", placeholder, "data_base64")
            data = decode_base64(asset.data_base64 or "", at, limits)
        sources.append(ImageSource(data, at))
        labels[placeholder] = image_label(len(sources))
    videos = tuple(
        VideoSource(
            tuple(
                ImageSource(
                    _image_field(text, ("videos", index, "frames", number), limits), ("videos", index, "frames", number)
                )
                for number, text in enumerate(video.frames)
            ),
            video.fps,
            ("videos", index),
        )
        for index, video in enumerate(request.videos or [])
    )
    for source in [*sources, *(frame for video in videos for frame in video.frames)]:
        check_image_bytes(len(source.data), source.where, limits)
        total += len(source.data)
    if total > limits.max_total_bytes:
        raise InvalidRequest(
            ("videos",) if videos else ("assets",) if assets else ("images",),
            f"the images and video frames have {total} bytes in all, more than the {limits.max_total_bytes} "
            "allowed per request",
            "image_too_large",
        )
    resolved = _replaced(request, labels) if labels else request
    return ResolvedRequest(
        resolved.model_copy(update={"images": None, "assets": None, "videos": None}), tuple(sources), videos
    )


def _check_video_counts(request: SystemOneRequest, limits: MediaLimits) -> None:
    videos = request.videos or []
    if len(videos) > limits.max_videos:
        raise InvalidRequest(
            ("videos",),
            f"{len(videos)} videos were sent; at most {limits.max_videos} are allowed per request",
            "too_many_videos",
        )
    for index, video in enumerate(videos):
        if not MIN_VIDEO_FRAMES <= len(video.frames) <= limits.max_video_frames:
            raise InvalidRequest(
                ("videos", index, "frames"),
                f"the video has {len(video.frames)} frames; a video needs {MIN_VIDEO_FRAMES} to "
                f"{limits.max_video_frames}",
                "video_frames",
            )
    frames = sum(len(video.frames) for video in videos)
    if frames > limits.max_total_frames:
        raise InvalidRequest(
            ("videos",),
            f"the videos have {frames} frames in all; at most {limits.max_total_frames} are allowed per request",
            "too_many_frames",
        )


def _check_parts(assets: Mapping[str, Any], parts: Mapping[str, bytes]) -> None:
    claimed: dict[str, str] = {}
    for placeholder, asset in assets.items():
        if asset.part is None:
            continue
        if asset.part not in parts:
            raise InvalidRequest(
                ("assets", placeholder, "part"),
                f"names part {asset.part!r}, which the body does not have"
                + ("" if parts else " (send the body as multipart/form-data with that part)"),
                "asset_part_missing",
            )
        if asset.part in claimed:
            raise InvalidRequest(
                ("assets", placeholder, "part"),
                f"part {asset.part!r} is already claimed by asset {claimed[asset.part]!r}; each part holds one asset",
                "asset_part_claimed",
            )
        claimed[asset.part] = placeholder
    for name in parts:
        if name not in claimed:
            raise InvalidRequest(
                ("assets",), f"part {name!r} of the body is claimed by no asset", "asset_part_unclaimed"
            )


def _texts(request: SystemOneRequest) -> list[Any]:
    """The values searched for placeholders, in prompt order."""
    values: list[Any] = [request.state]
    for question in request.questions.values():
        values.append(question.instructions)
        values.extend(description for _, description in question_options(question))
    return values


def _first_references(request: SystemOneRequest, placeholders: list[str]) -> list[str]:
    """The placeholders that appear, in the order they first appear."""
    if not placeholders:
        return []
    pattern = _pattern(placeholders)
    found: dict[str, None] = {}
    for value in _texts(request):
        _map_strings(value, lambda text: _note(pattern, text, found))
        if len(found) == len(placeholders):
            break
    return list(found)


def _pattern(placeholders: list[str]) -> re.Pattern[str]:
    """One pattern for all placeholders, longer first (a placeholder inside another is not found in it)."""
    return re.compile("|".join(re.escape(p) for p in sorted(placeholders, key=len, reverse=True)))


def _note(pattern: re.Pattern[str], text: str, found: dict[str, None]) -> str:
    for match in pattern.finditer(text):
        found.setdefault(match[0])
    return text


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    """``value`` with every string value (not object keys) passed through ``change``, in rendered order
    (object keys sorted, as :func:`clef_head.encoder.render_json` writes them)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {key: _map_strings(value[key], change) for key in sorted(value)}
    if isinstance(value, list):
        return [_map_strings(child, change) for child in value]
    return value


def _replaced(request: SystemOneRequest, labels: dict[str, str]) -> SystemOneRequest:
    pattern = _pattern(list(labels))

    def replace(value: Any) -> Any:
        return _map_strings(value, lambda text: pattern.sub(lambda match: labels[match[0]], text))

    questions = {question_id: _replaced_question(q, replace) for question_id, q in request.questions.items()}
    return request.model_copy(update={"state": replace(request.state), "questions": questions})


def _replaced_question(question: Question, replace: Callable[[Any], Any]) -> Question:
    update: dict[str, Any] = {"instructions": replace(question.instructions)}
    if isinstance(question, NoulQuestion) and question.criteria is not None:
        criteria: NoulCriteria = question.criteria
        update["criteria"] = criteria.model_copy(
            update={key: replace(getattr(criteria, key)) for key in criteria.model_fields_set}
        )
    elif isinstance(question, ChoiceQuestion):
        update["criteria"] = {label: replace(description) for label, description in question.criteria.items()}
    elif isinstance(question, ScoreQuestion):
        update["criteria"] = [replace(description) for description in question.criteria]
    return question.model_copy(update=update)
