"""The request contract for images and videos: ``assets`` (JSON and multipart parts), ``images``,
placeholders, ``videos`` and their frames, limits, hostile files refused before decoding, and ``box`` questions
refused by name."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from clef_head.assets import resolve_media
from clef_head.media import ImageSource, MediaLimits, VideoSource, decode_image, decode_videos, media_digest
from clef_head.request import InvalidRequest, parse_request
from reliability.image_files import gif_file, image_file, png_bomb, truncated, wrong_signature

PNG = image_file(40, 30)
JPEG = image_file(50, 20, file_format="JPEG")
B64 = base64.b64encode(PNG).decode()
LIMITS = MediaLimits()


def _body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "clef-flash",
        "state": {"photo": "<P1>", "note": "see <P2> and <P1>"},
        "questions": {
            "damaged": {"type": "noul", "instructions": "Is the item in <P3> damaged?"},
            "kind": {"type": "choice", "criteria": {"a": "like <P4>", "b": None}},
            "size": {"type": "score", "criteria": ["small", {"example": "<P5>"}]},
        },
    }
    body.update(fields)
    return body


def _assets(*names: str, part: bool = False) -> dict[str, Any]:
    return {
        name: ({"type": "image", "part": f"asset-{i}"} if part else {"format": "png", "data_base64": B64})
        for i, name in enumerate(names)
    }


def test_placeholders_are_replaced_in_prompt_order_after_the_images() -> None:
    body = _body(images=[f"data:image/jpeg;base64,{base64.b64encode(JPEG).decode()}"])
    body["assets"] = _assets("<P5>", "<P4>", "<P3>", "<P2>", "<P1>")
    resolved = resolve_media(parse_request(body), {}, LIMITS)
    request = resolved.request
    # The state renders keys sorted: "note" (P2, then P1) comes before "photo".
    assert request.state == {"photo": "[image 3]", "note": "see [image 2] and [image 3]"}
    assert request.questions["damaged"].instructions == "Is the item in [image 4] damaged?"
    assert request.questions["kind"].criteria == {"a": "like [image 5]", "b": None}
    assert request.questions["size"].criteria == ["small", {"example": "[image 6]"}]
    assert [source.data for source in resolved.images] == [JPEG] + [PNG] * 5
    assert [source.where for source in resolved.images][:2] == [("images", 0), ("assets", "<P2>", "data_base64")]
    assert request.images is None and request.assets is None


def test_multipart_parts_are_claimed_by_their_assets() -> None:
    body = _body(assets=_assets("<P1>", "<P2>", "<P3>", "<P4>", "<P5>", part=True))
    parts = {f"asset-{i}": image_file(8 + i, 8, seed=i) for i in range(5)}
    resolved = resolve_media(parse_request(body), parts, LIMITS)
    assert [source.data for source in resolved.images] == [parts[f"asset-{i}"] for i in (1, 0, 2, 3, 4)]


def test_a_placeholder_inside_another_is_not_found_in_it() -> None:
    body = _body(state="<P1> <P11>", questions={"q": {"type": "noul"}}, assets=_assets("<P1>", "<P11>"))
    assert resolve_media(parse_request(body), {}, LIMITS).request.state == "[image 1] [image 2]"


def test_object_keys_are_not_searched() -> None:
    body = _body(state={"<P1>": 1}, questions={"q": {"type": "noul"}}, assets=_assets("<P1>"))
    _refused(body, "assets.<P1>", "not referenced")


def _refused(
    body: dict[str, Any], param: str, rule: str, parts: dict[str, bytes] | None = None, limits: MediaLimits = LIMITS
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        resolve_media(parse_request(body), parts or {}, limits)
    assert caught.value.param == param
    assert rule in caught.value.message


FIVE = ("<P1>", "<P2>", "<P3>", "<P4>", "<P5>")


def test_contract_refusals() -> None:
    _refused(_body(assets=_assets(*FIVE, "<unused>")), "assets.<unused>", "not referenced")
    _refused(_body(assets=_assets(*FIVE, part=True)), "assets.<P1>.part", "does not have", {"asset-9": PNG})
    parts = {f"asset-{i}": PNG for i in range(6)}
    _refused(_body(assets=_assets(*FIVE, part=True)), "assets", "'asset-5' of the body is claimed by no asset", parts)
    twice = _assets(*FIVE, part=True)
    twice["<P2>"] = {"part": "asset-0"}
    _refused(_body(assets=twice), "assets.<P2>.part", "already claimed", {f"asset-{i}": PNG for i in (0, 2, 3, 4)})
    _refused(_body(assets=_assets(*FIVE)), "assets", "at most 4", limits=MediaLimits(max_images=4))
    _refused(_body(images=["aGk=", "aGk="]), "images", "at most 1", limits=MediaLimits(max_images=1))
    bad = _assets(*FIVE)
    bad["<P3>"]["data_base64"] = "not base64!"
    _refused(_body(assets=bad), "assets.<P3>.data_base64", "not valid base64")
    _refused(_body(images=["data:image/gif;base64,R0lG"]), "images.0", "data:image/png;base64,")
    _refused(_body(images=[B64]), "images.0", "more than the 100 allowed", limits=MediaLimits(max_image_bytes=100))
    _refused(_body(images=[B64, B64]), "images", "in all", limits=MediaLimits(max_total_bytes=len(PNG) + 1))


@pytest.mark.parametrize(
    ("asset", "param", "rule"),
    [
        ({"type": "image"}, "assets.x", "data_base64 is missing"),
        ({"data_base64": B64}, "assets.x", "format is missing"),
        ({"data_base64": B64, "format": "gif"}, "assets.x.format", "'png', 'jpg' or 'jpeg'"),
        ({"part": ""}, "assets.x.part", "must not be empty"),
    ],
)
def test_asset_fields_are_checked(asset: dict[str, Any], param: str, rule: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(_body(assets={"x": asset}))
    assert (caught.value.param, rule in caught.value.message) == (param, True)


def test_box_questions_are_refused_by_name() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(_body(questions={"where": {"type": "box", "instructions": "the dent"}}))
    assert caught.value.param == "questions.where.type"
    assert "box questions are not supported by this model" in caught.value.message


def _video(*frames: bytes, fps: float | None = None) -> dict[str, Any]:
    video: dict[str, Any] = {"frames": [base64.b64encode(frame).decode() for frame in frames]}
    return video if fps is None else {**video, "fps": fps}


def test_videos_follow_the_images_with_their_frames_in_order() -> None:
    frames = [image_file(16, 16, seed=i) for i in range(3)]
    body = _body(
        images=[B64],
        videos=[_video(*frames, fps=12.5), {"frames": [f"data:image/png;base64,{base64.b64encode(PNG).decode()}"] * 2}],
    )
    resolved = resolve_media(parse_request(body), {}, LIMITS)
    assert [source.data for source in resolved.images] == [PNG]
    first, second = resolved.videos
    assert [frame.data for frame in first.frames] == frames and first.fps == 12.5 and first.where == ("videos", 0)
    assert [frame.where for frame in second.frames] == [("videos", 1, "frames", 0), ("videos", 1, "frames", 1)]
    assert second.fps is None and resolved.request.videos is None


def test_video_refusals() -> None:
    _refused(_body(videos=[_video(PNG, PNG)] * 3), "videos", "at most 2", limits=MediaLimits(max_videos=2))
    _refused(_body(videos=[_video(PNG, PNG), {"frames": []}]), "videos.1.frames", "needs 2 to 64")
    _refused(_body(videos=[_video(PNG)]), "videos.0.frames", "has 1 frames")
    _refused(
        _body(videos=[_video(*[PNG] * 5)]), "videos.0.frames", "needs 2 to 4", limits=MediaLimits(max_video_frames=4)
    )
    _refused(
        _body(videos=[_video(*[PNG] * 3)] * 2), "videos", "6 frames in all", limits=MediaLimits(max_total_frames=5)
    )
    _refused(_body(videos=[{"frames": [B64, "not base64!"]}]), "videos.0.frames.1", "not valid base64")
    _refused(_body(videos=[{"frames": [B64, "data:video/mp4;base64,AAAA"]}]), "videos.0.frames.1", "data URL")
    tiny = image_file(1, 1)
    small = MediaLimits(max_image_bytes=len(tiny) + 10)
    _refused(_body(videos=[_video(tiny, PNG)]), "videos.0.frames.1", f"more than the {len(tiny) + 10}", limits=small)
    budget = MediaLimits(max_total_bytes=3 * len(PNG))
    _refused(_body(images=[B64, B64], videos=[_video(PNG, PNG)]), "videos", "images and video frames", limits=budget)


def _decoded(*videos: list[bytes], limits: MediaLimits = LIMITS) -> list[Any]:
    sources = [
        VideoSource(
            tuple(ImageSource(data, ("videos", i, "frames", j)) for j, data in enumerate(frames)), None, ("videos", i)
        )
        for i, frames in enumerate(videos)
    ]
    return decode_videos(sources, limits)


def _frame_refused(*videos: list[bytes], param: str, rule: str, limits: MediaLimits = LIMITS) -> None:
    started = time.perf_counter()
    with pytest.raises(InvalidRequest) as caught:
        _decoded(*videos, limits=limits)
    assert (caught.value.param, rule in caught.value.message) == (param, True), caught.value
    assert time.perf_counter() - started < 0.5


def test_video_frames_are_refused_before_decoding() -> None:
    _frame_refused([PNG, png_bomb()], param="videos.0.frames.1", rule="100000×100000 pixels")
    _frame_refused(
        [PNG, PNG], [PNG, truncated(image_file(40, 30, seed=5))], param="videos.1.frames.1", rule="does not decode"
    )
    _frame_refused([PNG, gif_file()], param="videos.0.frames.1", rule="not a PNG or JPEG")
    _frame_refused([PNG, PNG, image_file(30, 40)], param="videos.0.frames.2", rule="the frame is 30×40 pixels")
    limits = MediaLimits(max_video_pixels=3 * 40 * 30)
    _frame_refused([PNG, PNG], [PNG, PNG], param="videos.1", rule="more than 3600 pixels", limits=limits)


def test_media_digest_tells_apart_what_the_token_ids_do_not() -> None:
    """The answer cache's key: other frames, a frame moved to the next video, another fps, a video's frames
    sent as images give other digests; the same media the same."""
    a, b, c = (ImageSource(image_file(8, 8, seed=seed), ("x",)) for seed in range(3))

    def video(*frames: ImageSource, fps: float | None = None) -> VideoSource:
        return VideoSource(frames, fps, ("videos", 0))

    digests = [
        media_digest([], [video(a, b), video(c, c)]),
        media_digest([], [video(a, b, c), video(c)]),
        media_digest([], [video(a, b), video(c, c, fps=24.0)]),
        media_digest([], [video(a, c), video(c, c)]),
        media_digest([a, b], [video(c, c)]),
        media_digest([a, b, c, c]),
    ]
    assert len(set(digests)) == len(digests)
    assert media_digest([], [video(a, b), video(c, c)]) == digests[0]


def test_video_frames_decode_to_rgb() -> None:
    (clip,) = _decoded([image_file(20, 10, "RGBA"), image_file(20, 10, "L", "JPEG"), image_file(20, 10, "P")])
    assert [(frame.mode, frame.size) for frame in clip.frames] == [("RGB", (20, 10))] * 3


HOSTILE = [
    ("bomb", png_bomb(), "100000×100000 pixels"),
    ("wide bomb", png_bomb(width=2_000_000, height=1), "2000000×1 pixels"),
    ("aspect ratio", image_file(1000, 4), "200 times"),
    ("truncated PNG", truncated(image_file(300, 300)), "does not decode"),
    ("truncated JPEG", truncated(image_file(300, 300, file_format="JPEG")), "does not decode"),
    ("PNG behind a JPEG signature", wrong_signature(PNG), "cannot be read"),
    ("GIF", gif_file(), "not a PNG or JPEG"),
    ("empty", b"", "not a PNG or JPEG"),
    ("signature only", b"\x89PNG\r\n\x1a\n", "cannot be read"),
]


@pytest.mark.parametrize(("data", "rule"), [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_hostile_files_are_refused_before_decoding(data: bytes, rule: str) -> None:
    started = time.perf_counter()
    with pytest.raises(InvalidRequest) as caught:
        decode_image(data, ("images", 0))
    assert caught.value.param == "images.0"
    assert rule in caught.value.message
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("file_format", ["PNG", "JPEG"])
def test_valid_files_decode(file_format: str) -> None:
    assert decode_image(image_file(33, 17, file_format=file_format), ("images", 0)).size == (33, 17)
