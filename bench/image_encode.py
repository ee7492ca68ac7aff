"""The encode stage's own work for one image body, phase by phase, and the same body through an encode worker.

    python -m bench.image_encode [--release DIR] [--image-size 1024x768] [--bodies 8] [--repeats 5] \\
        [--pixel-dtypes float32,bfloat16]

The bodies are System One requests of one PNG of noise each (``--image-size``, a seed per body, a base64 data URL in
``images``), as ``bench.vision_http`` sends them; the release is ``--release`` (default: the predictor's demo
release), its processor and its tokenizer as an encode worker loads it. Each phase is timed over every body, and
each figure is the median of ``--repeats`` passes, in milliseconds per body, for each of ``--pixel-dtypes`` (their
passes in turn):

- ``json``: parsing the body (orjson);
- ``base64``: decoding the data URL (``clef_head.assets``);
- ``png``: decoding the PNG (``clef_head.media.decode_image``);
- ``processor``: the release's image processor, the prompt's media tokens and the cast to the pixel dtype
  (``clef_head.media.encode_media``);
- ``prepare``: the whole preparation in this process (``predictor.serving.prepare.prepare_json``: the phases above,
  validation and the prompt's encoding);
- ``worker``: the same through an encode pool of one worker process, pixels sent back, as a ``--vision`` server's
  encode stage runs an image body.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.vision_http import MODEL_NAME, parse_size, png_data_url
from clef_head.assets import decode_base64
from clef_head.media import DEFAULT_MEDIA_LIMITS, decode_image, encode_media, release_image_processor
from clef_head.request import DEFAULT_LIMITS
from predictor.serving.prepare import PrepareSettings, ReleaseTokenizer, VisionSettings, prepare_json
from predictor.serving.request_policy import RequestPolicy

PHASES = ("json", "base64", "png", "processor", "prepare", "worker")


def image_bodies(count: int, width: int, height: int) -> list[bytes]:
    """``count`` JSON bodies of one noise PNG each (seeds 0 to count - 1)."""
    return [
        orjson.dumps(
            {
                "model": MODEL_NAME,
                "state": f"#{seed} the parcel on the doorstep",
                "questions": {"damaged": {"type": "noul", "instructions": "Is the parcel damaged?"}},
                "images": [png_data_url(width, height, seed)],
            }
        )
        for seed in range(count)
    ]


def per_body(run: Callable[[bytes], Any], bodies: list[bytes]) -> float:
    """Seconds ``run`` takes per body, over ``bodies``."""
    started = time.perf_counter()
    for body in bodies:
        run(body)
    return (time.perf_counter() - started) / len(bodies)


def measure(release: Path, bodies: list[bytes], repeats: int, pixel_dtypes: list[str]) -> dict[str, dict[str, float]]:
    """Every phase's milliseconds per body (:data:`PHASES`) for each pixel dtype (``float32``: the processor's), the
    dtypes' passes in turn so that the machine's drift reaches each alike."""
    import torch
    from transformers import AutoTokenizer

    from predictor.serving.encode_pool import EncodePool

    tokenizer = ReleaseTokenizer(release)
    processor = release_image_processor(str(release))
    where = ("images", 0)
    urls = {body: orjson.loads(body)["images"][0].split(",", 1)[1] for body in bodies}
    files = {body: decode_base64(urls[body], where, DEFAULT_MEDIA_LIMITS) for body in bodies}
    images = {body: decode_image(files[body], where) for body in bodies}
    pool = EncodePool(release, 1, AutoTokenizer.from_pretrained(release))
    loop = asyncio.new_event_loop()
    passes: dict[str, dict[str, list[float]]] = {name: {phase: [] for phase in PHASES} for name in pixel_dtypes}

    def one_pass(name: str) -> dict[str, float]:
        dtype = getattr(torch, name)
        settings = PrepareSettings(
            MODEL_NAME, DEFAULT_LIMITS, RequestPolicy(), 4096, VisionSettings(str(release), pixel_dtype=name)
        )
        return {
            "json": per_body(orjson.loads, bodies),
            "base64": per_body(lambda body: decode_base64(urls[body], where, DEFAULT_MEDIA_LIMITS), bodies),
            "png": per_body(lambda body: decode_image(files[body], where), bodies),
            "processor": per_body(
                lambda body: encode_media(tokenizer, [images[body]], [], b"", processor, pixel_dtype=dtype), bodies
            ),
            "prepare": per_body(lambda body: prepare_json(tokenizer, settings, body, "application/json"), bodies),
            "worker": per_body(
                lambda body: loop.run_until_complete(pool.run(prepare_json, settings, body, "application/json")), bodies
            ),
        }

    try:
        loop.run_until_complete(pool.start(PrepareSettings(MODEL_NAME, DEFAULT_LIMITS, RequestPolicy(), 4096)))
        for name in pixel_dtypes:
            one_pass(name)  # untimed: each worker's processor loaded, each path run once
        for _ in range(repeats):
            for name in pixel_dtypes:
                for phase, seconds in one_pass(name).items():
                    passes[name][phase].append(seconds)
    finally:
        pool.close()
        loop.close()
    return {
        name: {phase: round(1000 * statistics.median(values), 2) for phase, values in phases.items()}
        for name, phases in passes.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.image_encode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, help="a release with a vision tower (default: the demo release)")
    parser.add_argument("--image-size", type=parse_size, default=(1024, 768), help="WIDTHxHEIGHT")
    parser.add_argument("--bodies", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--pixel-dtypes",
        type=lambda text: text.split(","),
        default=["float32", "bfloat16"],
        help="the engine's pixel dtypes to compare (torch dtype names; float32: the processor's)",
    )
    args = parser.parse_args(argv)
    if args.bodies < 1 or args.repeats < 1:
        parser.error("--bodies and --repeats must be at least 1")
    import torch

    unknown = [name for name in args.pixel_dtypes if not isinstance(getattr(torch, name, None), torch.dtype)]
    if unknown:
        parser.error(f"--pixel-dtypes: {', '.join(unknown)} is not a torch dtype")
    if args.release is None:
        from predictor.demo import demo_release

        args.release = demo_release()
    width, height = args.image_size
    bodies = image_bodies(args.bodies, width, height)
    for name, figures in measure(args.release, bodies, args.repeats, args.pixel_dtypes).items():
        print(json.dumps({"image_size": [width, height], "body_bytes": len(bodies[0]), "pixel_dtype": name, **figures}))


if __name__ == "__main__":
    main()
