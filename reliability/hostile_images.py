"""Hostile images against a ``--vision`` predictor: ``python -m reliability.hostile_images --url URL``.

The family: PNG decompression bombs (100,000 × 100,000 and 2,000,000 × 1 pixels in a few kilobytes), truncated
PNG and JPEG files, a PNG behind a JPEG signature, a GIF, an empty file, a signature alone, an aspect ratio over
the processor's, base64 that does not decode, thousands of tiny images (JSON and multipart), an asset naming a
missing part and a part no asset claims; and videos: a bomb frame, a truncated frame, frames of two sizes,
too many frames, a video of one frame. Each is sent alone and must be answered 4xx within ``--bound-s``
(0.5 s); then a valid image request must still be answered 200 (the server unharmed), with the same answer
as before the family. Prints JSON; exit status 1 if a body missed its bound, got anything but a 4xx, or the
valid request changed or failed.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from typing import Any

import httpx

from reliability.common import MODEL_NAME, loopback_url
from reliability.image_files import gif_file, image_file, png_bomb, truncated, wrong_signature

QUESTIONS: dict[str, Any] = {
    "damaged": {"type": "noul", "instructions": "Is the parcel damaged?"},
    "kind": {"type": "choice", "criteria": {"box": None, "envelope": None}},
}
Case = tuple[dict[str, str], bytes]
"""Headers and the body."""


def _json(model: str, **fields: Any) -> Case:
    body = {"model": model, "state": "Parcel <p>.", "questions": QUESTIONS, **fields}
    return {"content-type": "application/json"}, json.dumps(body).encode()


def _image(model: str, data: bytes) -> Case:
    return _json(model, images=[base64.b64encode(data).decode()])


def _multipart(model: str, assets: dict[str, Any], parts: dict[str, bytes]) -> Case:
    boundary = "hostile-images-boundary"
    request = {"model": model, "state": "Parcel <p>.", "questions": QUESTIONS, "assets": assets}
    chunks = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="request"\r\n'
        f"Content-Type: application/json\r\n\r\n{json.dumps(request)}\r\n".encode()
    ]
    for name, data in parts.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}"\r\n\r\n'
        chunks.append(head.encode() + data + b"\r\n")
    chunks.append(f"--{boundary}--\r\n".encode())
    return {"content-type": f"multipart/form-data; boundary={boundary}"}, b"".join(chunks)


def _video(model: str, *frames: bytes) -> Case:
    return _json(model, videos=[{"frames": [base64.b64encode(frame).decode() for frame in frames]}])


def family(model: str) -> dict[str, Case]:
    """The hostile bodies by name."""
    tiny = image_file(1, 1)
    frame = image_file(64, 48)
    return {
        "bomb 100000x100000": _image(model, png_bomb()),
        "bomb 2000000x1": _image(model, png_bomb(width=2_000_000, height=1)),
        "truncated PNG": _image(model, truncated(image_file(600, 600))),
        "truncated JPEG": _image(model, truncated(image_file(600, 600, file_format="JPEG"))),
        "PNG behind a JPEG signature": _image(model, wrong_signature(image_file(64, 64))),
        "GIF": _image(model, gif_file()),
        "empty file": _image(model, b""),
        "signature only": _image(model, b"\x89PNG\r\n\x1a\n"),
        "aspect ratio 1000:1": _image(model, image_file(1000, 1)),
        "bad base64": _json(model, images=["not base64 !!"]),
        "5000 tiny images (JSON)": _json(model, images=[base64.b64encode(tiny).decode()] * 5000),
        "5000 tiny images (multipart)": _multipart(
            model, {"<p>": {"part": "asset-0"}}, {f"asset-{i}": tiny for i in range(5000)}
        ),
        "missing part": _multipart(model, {"<p>": {"part": "asset-7"}}, {"asset-0": tiny}),
        "unclaimed part": _multipart(model, {"<p>": {"part": "asset-0"}}, {"asset-0": tiny, "asset-1": tiny}),
        "unreferenced asset": _json(
            model, assets={"<q>": {"format": "png", "data_base64": base64.b64encode(tiny).decode()}}
        ),
        "box question": _json(model, questions={"where": {"type": "box"}}),
        "video with a bomb frame": _video(model, frame, png_bomb()),
        "video with a truncated frame": _video(model, frame, truncated(image_file(64, 48, seed=3))),
        "video frames of two sizes": _video(model, frame, image_file(48, 64)),
        "video of 5000 frames": _video(model, *[tiny] * 5000),
        "video of one frame": _video(model, frame),
    }


def _valid(model: str) -> Case:
    photo = base64.b64encode(image_file(448, 448, seed=1)).decode()
    return _json(model, assets={"<p>": {"type": "image", "format": "png", "data_base64": photo}})


def run(url: str, model: str, bound_s: float) -> dict[str, Any]:
    """Send the valid request, the family one body at a time, then the valid request again."""
    results: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=120) as http:
        headers, body = _valid(model)
        before = http.post("/v1/systemone", content=body, headers=headers)
        for name, (case_headers, case_body) in family(model).items():
            started = time.perf_counter()
            response = http.post("/v1/systemone", content=case_body, headers=case_headers)
            elapsed = time.perf_counter() - started
            param = response.json().get("error", {}).get("param") if response.status_code < 500 else None
            results[name] = {
                "status": response.status_code,
                "param": param,
                "seconds": round(elapsed, 4),
                "wire_bytes": len(case_body),
                "ok": 400 <= response.status_code < 500 and elapsed < bound_s,
            }
        after = http.post("/v1/systemone", content=body, headers=headers)
    unharmed = before.status_code == after.status_code == 200 and before.json()["answers"] == after.json()["answers"]
    return {"bound_s": bound_s, "cases": results, "valid_request_unharmed": unharmed}


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m reliability.hostile_images", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="a --vision predictor's base URL (loopback)")
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument("--bound-s", type=float, default=0.5, help="the most a refused body may take")
    args = parser.parse_args(argv)
    result = run(loopback_url(args.url), args.model, args.bound_s)
    print(json.dumps(result, indent=2))
    if not result["valid_request_unharmed"] or not all(case["ok"] for case in result["cases"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
