"""bench.vision_http's request bodies: no body sent twice, images attached as data URLs, sizes parsed."""

from __future__ import annotations

import base64
import io

from PIL import Image

from bench.vision_http import Bodies, parse_size, png_data_url


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


def test_parse_size() -> None:
    assert parse_size("1024x768") == (1024, 768)
