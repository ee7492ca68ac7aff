"""bench.image_encode: its bodies, and one run of every phase on the demo release (small images)."""

from __future__ import annotations

import base64
import io
import json

import orjson
import pytest
from PIL import Image

from bench.image_encode import PHASES, image_bodies, main


def test_image_bodies_hold_one_png_of_the_size_each_with_a_state_of_its_own() -> None:
    bodies = [orjson.loads(body) for body in image_bodies(3, 64, 48)]
    assert len({body["state"] for body in bodies}) == 3
    for body in bodies:
        (url,) = body["images"]
        image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
        assert (image.format, image.size) == ("PNG", (64, 48))
    assert len({body["images"][0] for body in bodies}) == 3


def test_a_run_times_every_phase_for_each_pixel_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--image-size", "64x48", "--bodies", "2", "--repeats", "1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [line["pixel_dtype"] for line in lines] == ["float32", "bfloat16"]
    for line in lines:
        assert all(line[phase] > 0 for phase in PHASES)
        assert line["prepare"] >= line["png"]  # the whole preparation holds the decoding


def test_an_unknown_pixel_dtype_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--pixel-dtypes", "float32,bfloat17"])
    assert "--pixel-dtypes: bfloat17 is not a torch dtype" in capsys.readouterr().err
