"""The CPU work before scoring: read a body (JSON), validate it (clef_head's request model and the served
names) and encode it (the tokenizer), for one body, a batch body or parsed KServe instances.

Every function here is top level and takes the tokenizer and :class:`PrepareSettings` as arguments, so the
same code runs in the serving process (``--encode-processes 0``, with the engine's tokenizer) and in the
worker processes of :class:`predictor.serving.encode_pool.EncodePool` (with :class:`ReleaseTokenizer`, checked
against the engine's when the pool starts): errors, ``loc`` paths, truncation and prompts are the same
either way. Nothing here imports torch, transformers or an engine, except on a server that reads images and
videos (``PrepareSettings.vision``): its first image (video) loads the release's image (video) processor
(transformers) in that process.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from clef_head.assets import resolve_media
from clef_head.encoder import EncodedRequest, SchemaTooLong, StateTooLong, encode_request
from clef_head.media import (
    DEFAULT_MEDIA_LIMITS,
    EncodedMedia,
    MediaLimits,
    decode_image,
    decode_videos,
    encode_media,
    media_digest,
    release_image_processor,
    release_video_processor,
)
from clef_head.request import InvalidRequest, RequestLimits, SystemOneRequest, parse_request
from predictor.core.errors import BadInput, ModelNotServed, ServiceError, TooLarge, Unreadable, parse_param, quoted
from predictor.serving.multipart_body import is_multipart, read_multipart
from predictor.serving.request_policy import RequestPolicy

Prepared = tuple[SystemOneRequest, EncodedRequest]
T = TypeVar("T")


@dataclass(frozen=True)
class PrepareSettings:
    """What validation and encoding depend on besides the tokenizer: the served name, the request limits,
    the name and state-overflow policy, the engine's longest prompt, and whether images and videos are read
    (``vision``: where the release's processors are and the media limits; ``None``: text only, media refused)."""

    served_name: str
    limits: RequestLimits
    policy: RequestPolicy
    max_length: int
    vision: VisionSettings | None = None


@dataclass(frozen=True)
class VisionSettings:
    """Images and videos are read: the release whose processors encode them, and their limits; ``videos``:
    whether the engine answers videos (without, ``videos`` are refused naming the field); ``media_here``: whether
    they are read where this preparation runs (without, a body with any raises :class:`MediaElsewhere` once
    validated, before any is read); ``pixel_dtype``: the name of the torch dtype the engine's vision tower reads
    pixels in, which the pixels are cast to where they are made (``None``: the processors' float32)."""

    release_dir: str
    limits: MediaLimits = DEFAULT_MEDIA_LIMITS
    videos: bool = True
    media_here: bool = True
    pixel_dtype: str | None = None


class MediaElsewhere(Exception):
    """A body with images or videos (or a multipart body) met by a preparation that does not read them
    (:attr:`VisionSettings.media_here` false: a vision server's lone small body in its serving process); an encode
    worker prepares it instead. Not a :class:`ServiceError`: no client ever sees it."""


TEXT_ONLY_MEDIA = (
    "images and videos are not supported by this server: it serves text and JSON only (started without --vision)"
)


ENGINE_WITHOUT_VIDEOS = (
    "videos are not supported by this server's engine: its vLLM release cannot take the processed videos the "
    "predictor sends (no frame times in its Qwen3-VL video items); images are read, and the transformers engine "
    "reads videos"
)


def refuse_media(body: Any, where: tuple[int | str, ...]) -> None:
    """On a text-only server, refuse a body that sends images or videos (before any other check, as the model
    card says)."""
    if isinstance(body, dict):
        for field in ("assets", "images", "videos"):
            if body.get(field):
                raise BadInput(TEXT_ONLY_MEDIA, (*where, field))


def validate(settings: PrepareSettings, body: Any, prefix: str = "") -> SystemOneRequest:
    """A validated request; :class:`BadInput` (or :class:`ModelNotServed`) names the field under ``prefix``."""
    where = parse_param(prefix)
    if settings.vision is None:
        refuse_media(body, where)
    try:
        request = parse_request(body, settings.limits)
    except InvalidRequest as exc:
        raise BadInput(exc.message, (*where, *exc.loc), exc.kind) from None
    policy = settings.policy
    if not policy.serves(settings.served_name, request.model):
        served = ", ".join(map(repr, (settings.served_name, *policy.aliases)))
        raise ModelNotServed(
            f"model {quoted(request.model)} is not served here; this server serves {served} (--model-alias serves "
            "more names)",
            (*where, "model"),
        )
    return request


def encode(
    tokenizer: Any,
    settings: PrepareSettings,
    request: SystemOneRequest,
    prefix: str = "",
    media: EncodedMedia | None = None,
) -> EncodedRequest:
    """The prompt; :class:`BadInput` with the token counts when the schema (and images) alone exceed the maximum
    (:class:`TooLarge` when the state does not fit and the policy refuses over-long states)."""
    where = parse_param(prefix)
    try:
        return encode_request(
            tokenizer, request, max_length=settings.max_length, overflow=settings.policy.state_overflow, media=media
        )
    except SchemaTooLong as exc:
        what = "questions and images" if media is not None else "questions"
        raise BadInput(
            f"the {what} need {exc.required} tokens before any state, more than the maximum prompt "
            f"length of {exc.maximum} tokens (--max-model-len); send fewer or shorter questions"
            + (" or fewer or smaller images" if media is not None else ""),
            (*where, "questions"),
        ) from None
    except StateTooLong as exc:
        raise TooLarge(
            f"{exc} (--max-model-len {exc.maximum}); send a shorter state or fewer questions", (*where, "state")
        ) from None


def read_media(
    tokenizer: Any, vision: VisionSettings, request: SystemOneRequest, parts: Mapping[str, bytes]
) -> tuple[SystemOneRequest, EncodedMedia | None]:
    """The request with its placeholders resolved, and its images and videos decoded and encoded (``None``: it
    has neither); :class:`InvalidRequest` names the field of a refused image, video or frame."""
    if request.videos and not vision.videos:
        raise InvalidRequest(("videos",), ENGINE_WITHOUT_VIDEOS, "videos_unsupported")
    resolved = resolve_media(request, parts, vision.limits)
    if not resolved.images and not resolved.videos:
        return resolved.request, None
    import torch

    images = [decode_image(source.data, source.where, vision.limits) for source in resolved.images]
    videos = decode_videos(resolved.videos, vision.limits)
    return resolved.request, encode_media(
        tokenizer,
        images,
        videos,
        media_digest(resolved.images, resolved.videos),
        image_processor=release_image_processor(vision.release_dir) if images else None,
        video_processor=release_video_processor(vision.release_dir) if videos else None,
        pixel_dtype=None if vision.pixel_dtype is None else getattr(torch, vision.pixel_dtype),
    )


def prepare(
    tokenizer: Any, settings: PrepareSettings, body: Any, prefix: str = "", parts: Mapping[str, bytes] | None = None
) -> Prepared:
    """Validate and encode one parsed body (``parts``: a multipart body's image parts)."""
    request = validate(settings, body, prefix)
    media = None
    if settings.vision is not None and (request.has_media or parts):
        if not settings.vision.media_here:
            raise MediaElsewhere
        try:
            request, media = read_media(tokenizer, settings.vision, request, parts or {})
        except InvalidRequest as exc:
            raise BadInput(exc.message, (*parse_param(prefix), *exc.loc), exc.kind) from None
    return request, encode(tokenizer, settings, request, prefix, media)


def prepare_all(
    tokenizer: Any, settings: PrepareSettings, bodies: Sequence[Any], prefixes: Sequence[str]
) -> list[Prepared]:
    """Every body prepared; the first failure raises (KServe V1/V2: one error answers the request)."""
    return [prepare(tokenizer, settings, body, prefix) for body, prefix in zip(bodies, prefixes, strict=True)]


def prepare_each(
    tokenizer: Any, settings: PrepareSettings, bodies: Sequence[Any], prefixes: Sequence[str]
) -> list[Prepared | ServiceError]:
    """One prepared body or one domain error per body (the batch route answers each item)."""
    results: list[Prepared | ServiceError] = []
    for body, prefix in zip(bodies, prefixes, strict=True):
        try:
            results.append(prepare(tokenizer, settings, body, prefix))
        except ServiceError as error:
            results.append(error)
    return results


def decode_json_body(raw: bytes, content_type: str) -> Any:
    """Parse a JSON request body (any Content-Type but multipart); :class:`Unreadable` when it is not JSON.

    A multipart body is how the TypeSafe SDK sends images: :class:`Unreadable` naming ``assets`` (a server that
    reads images reads it with :func:`prepare_json`).
    """
    if is_multipart(content_type):
        raise Unreadable(
            "images are not supported here: send application/json (a server started with --vision reads the "
            "TypeSafe SDK's multipart bodies at POST /v1/systemone)",
            ("assets",),
        )
    if not raw.strip():
        raise Unreadable("the request body is empty; send a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Unreadable(f"the request body is not valid JSON: {exc}") from None


def prepare_json(tokenizer: Any, settings: PrepareSettings, raw: bytes, content_type: str) -> Prepared:
    """``POST /v1/systemone``: read the raw body (JSON, or multipart with images on a server that reads them),
    validate and encode it."""
    if settings.vision is not None and is_multipart(content_type):
        if not settings.vision.media_here:
            raise MediaElsewhere
        body = read_multipart(raw, content_type, settings.vision.limits.max_images)
        return prepare(tokenizer, settings, decode_json_body(body.request, "application/json"), parts=body.parts)
    return prepare(tokenizer, settings, decode_json_body(raw, content_type))


def read_batch(raw: bytes, content_type: str, max_items: int) -> list[Any]:
    """The bodies of a ``POST /v1/systemone/batch`` body: a JSON array of 1 to ``max_items`` requests."""
    bodies = decode_json_body(raw, content_type)
    if not isinstance(bodies, list) or not 1 <= len(bodies) <= max_items:
        got = f"{len(bodies)} items" if isinstance(bodies, list) else f"a JSON {type(bodies).__name__}"
        raise BadInput(
            f"the body must be a JSON array of 1 to {max_items} System One requests (--max-batch-items), got {got}",
            (),
            "list_type",
        )
    return bodies


def prepare_batch_json(
    tokenizer: Any, settings: PrepareSettings, raw: bytes, content_type: str, max_items: int
) -> list[Prepared | ServiceError]:
    """``POST /v1/systemone/batch``: read the array, then prepare each item (its ``loc`` starts ``[i]``)."""
    bodies = read_batch(raw, content_type, max_items)
    return prepare_each(tokenizer, settings, bodies, [f"[{index}]" for index in range(len(bodies))])


# The worker side of predictor.serving.encode_pool: each worker process loads the release's tokenizer once.
_worker_tokenizer: Any = None
_worker_job_deadline_s = 0
TOKENIZER_FILE = "tokenizer.json"


class ReleaseTokenizer:
    """The release's ``tokenizer.json`` run by the ``tokenizers`` library, the library transformers' fast
    tokenizers run, called as the encoder calls a transformers tokenizer. Loading it imports neither
    transformers nor torch, so a worker holds the vocabulary and little else. The pool checks at start
    that it encodes exactly as the engine's tokenizer does."""

    def __init__(self, release_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(release_dir) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: encode worker processes need the release's {TOKENIZER_FILE}")
        self._tokenizer = Tokenizer.from_file(str(path))

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """``{"input_ids": [...]}`` of ``text``, as a transformers tokenizer answers."""
        return {"input_ids": self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}

    def convert_tokens_to_ids(self, token: str) -> int:
        """The id of a token of the vocabulary (the media markers); :class:`KeyError` when it has none."""
        index = self._tokenizer.token_to_id(token)
        if index is None:
            raise KeyError(f"{token!r} is not in the release's vocabulary")
        return int(index)


def init_worker(release_dir: str, job_deadline_s: int) -> None:
    """Process-pool initializer: load the tokenizer this worker encodes with, and set the deadline of each
    job (whole seconds; 0: none). A job still running at its deadline ends the worker by ``SIGALRM``'s
    default action, wherever it is stuck (a Python handler would wait for the interpreter): the pool then
    answers it as a dead worker."""
    global _worker_tokenizer, _worker_job_deadline_s
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    _worker_tokenizer = ReleaseTokenizer(release_dir)
    _worker_job_deadline_s = job_deadline_s


def run_in_worker(job: Callable[..., T], *args: Any) -> T:
    """Run ``job(tokenizer, *args)`` with this worker's tokenizer, within the worker's job deadline."""
    if _worker_tokenizer is None:
        raise RuntimeError("the encode worker has no tokenizer (init_worker did not run)")
    signal.alarm(_worker_job_deadline_s)
    try:
        return job(_worker_tokenizer, *args)
    finally:
        signal.alarm(0)


def worker_probe(tokenizer: Any, settings: PrepareSettings, body: Any) -> tuple[int, list[int]]:
    """The worker's process id and the prompt of ``body``: a started worker's check against the engine's tokenizer."""
    import os

    return os.getpid(), prepare(tokenizer, settings, body)[1].input_ids
