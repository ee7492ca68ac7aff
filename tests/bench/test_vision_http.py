"""bench.vision_http's request bodies (no body sent twice, images attached as data URLs, sizes parsed) and its
comparison of two runs' answers."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest
from PIL import Image

from bench.vision_http import Bodies, compare_answers, parse_size, png_data_url, timed_post


def test_bodies_never_repeat_a_state_and_carry_the_images() -> None:
    records = [{"model": "m", "state": "a", "questions": {}}, {"model": "m", "state": "b", "questions": {}}]
    bodies = Bodies(records)
    sent = [bodies.next(["data:image/png;base64,AA=="]), bodies.next(), bodies.next()]
    assert [body["state"] for body in sent] == ["#v0 a", "#v1 b", "#v2 a"]
    assert sent[0]["images"] == ["data:image/png;base64,AA=="]
    assert "images" not in sent[1] and "images" not in sent[2]
    assert records[0] == {"model": "m", "state": "a", "questions": {}}  # the records themselves are not changed


def test_png_data_url_is_a_png_of_the_size_and_differs_by_seed() -> None:
    url = png_data_url(64, 48, seed=1)
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    image = Image.open(io.BytesIO(base64.b64decode(url[len(prefix) :])))
    assert (image.format, image.size) == ("PNG", (64, 48))
    assert png_data_url(64, 48, seed=2) != url


class FakeResponse:
    def __init__(self, status_code: int, payload: dict[str, Any]) -> None:
        self.status_code = status_code
        self.payload = payload
        self.text = json.dumps(payload)

    def json(self) -> dict[str, Any]:
        return self.payload


class RecordingClient:
    """Records each post; answers with ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[tuple[str, dict[str, Any]]] = []

    def post(self, url: str, **kwargs: Any) -> FakeResponse:
        self.posts.append((url, kwargs))
        return FakeResponse(self.status, {"answers": {"q": {"type": "noul", "noul": 0.5}}})


def test_timed_post_sends_the_body_as_encoded_json_bytes() -> None:
    client = RecordingClient()
    body = {"model": "m", "state": "é", "images": ["data:image/png;base64,AA=="]}
    elapsed, answers = timed_post(client, "http://server", body)
    assert answers == {"q": {"type": "noul", "noul": 0.5}} and elapsed >= 0
    ((url, sent),) = client.posts
    assert url == "http://server/v1/systemone"
    assert set(sent) == {"content", "headers"} and isinstance(sent["content"], bytes)
    assert json.loads(sent["content"]) == body and sent["headers"] == {"content-type": "application/json"}


def test_timed_post_sends_a_request_id_when_given_one() -> None:
    client = RecordingClient()
    timed_post(client, "http://server", {"model": "m"}, request_id="r-1")
    ((_url, sent),) = client.posts
    assert sent["headers"] == {"content-type": "application/json", "x-request-id": "r-1"}


def test_timed_post_raises_on_an_error_status() -> None:
    with pytest.raises(RuntimeError, match="HTTP 422"):
        timed_post(RecordingClient(status=422), "http://server", {"model": "m"})


def test_parse_size() -> None:
    assert parse_size("1024x768") == (1024, 768)


def answered(phase: str, noul: float, choice: dict[str, float]) -> dict[str, object]:
    best = max(choice, key=choice.__getitem__)
    return {
        "phase": phase,
        "answers": {
            "q1": {"type": "noul", "noul": noul},
            "q2": {"type": "choice", "choice": best, "confidence": choice[best], "probabilities": choice},
        },
    }


def test_two_runs_answers_are_compared_per_phase_by_largest_difference_and_top_answer() -> None:
    ours = [answered("text", 0.7, {"a": 0.6, "b": 0.4}), answered("text", 0.2, {"a": 0.1, "b": 0.9})]
    theirs = [answered("text", 0.4, {"a": 0.62, "b": 0.38}), answered("text", 0.2, {"a": 0.1, "b": 0.9})]
    ours.append(answered("one_image", 0.5, {"a": 0.5, "b": 0.5}))
    theirs.append(answered("one_image", 0.5, {"a": 0.5, "b": 0.5}))
    figures = compare_answers(ours, theirs)
    assert figures["text"] == {"questions": 4, "max_abs_diff": 0.3, "top_agreement": 0.75}
    assert figures["one_image"] == {"questions": 2, "max_abs_diff": 0.0, "top_agreement": 1.0}


def test_runs_that_sent_other_requests_are_not_compared() -> None:
    one = [answered("text", 0.7, {"a": 0.6, "b": 0.4})]
    with pytest.raises(ValueError, match="--seed"):
        compare_answers(one, [answered("one_image", 0.7, {"a": 0.6, "b": 0.4})])
    with pytest.raises(ValueError, match="--seed"):
        compare_answers(one, one + one)
    other = [{"phase": "text", "answers": {"q9": {"type": "noul", "noul": 0.5}}}]
    with pytest.raises(ValueError, match="questions differ"):
        compare_answers(one, other)
