"""The vision case: the FP8 release's vLLM engine with its vision tower loaded (``engine_kwargs(vision=True)``).

On that one engine: text-only throughput over the same records as the text cases (the cost of having the tower
loaded, set against the text-only case of the same mode in the same invocation), then, per image set
(:data:`IMAGE_SETS`: 1 and 4 images of 448×448 and of 1024×768 per request), throughput over the first
``--vision-records`` records with those images and the latency of single requests. The images are seeded
random-noise RGB JPEG files (``reliability.image_files``); each set's files are decoded and preprocessed once
by the release's processor (``clef_head.media``), timed on their own, outside the engine's figures. Every
request's images are named anew (``multi_modal_uuids``), so vLLM's encoder and processor caches never serve an
image twice: the vision tower runs on every image of every request, as with distinct photos of the same size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.gpu_benchmark.engine_args import plugin_engine_kwargs, start_engine
from bench.gpu_benchmark.names import base_case
from bench.gpu_benchmark.timing import WARMUP_RECORDS, gpu_memory, percentiles, repeated_rates, spread, timed_passes
from bench.gpu_benchmark.workdir import load_encoded, write_json

if TYPE_CHECKING:
    from clef_head.encoder import EncodedRequest

IMAGE_FORMAT = "JPEG"
PREPROCESS_RUNS = 5
"""Timed preprocessing runs per image set (decode + release processor), after one untimed run."""
TEXT_TARGET = 0.98
"""Text-only throughput with the tower loaded, as a share of the text-only engine's: the 2 % target."""


@dataclass(frozen=True)
class ImageSet:
    """``count`` images of ``width`` × ``height`` pixels in each request."""

    count: int
    width: int
    height: int

    @property
    def name(self) -> str:
        return f"{self.count}x{self.width}x{self.height}"


IMAGE_SETS = (ImageSet(1, 448, 448), ImageSet(4, 448, 448), ImageSet(1, 1024, 768), ImageSet(4, 1024, 768))


def image_files(image_set: ImageSet, seed: int) -> list[bytes]:
    """The set's JPEG files of random-noise RGB pixels: image ``i`` drawn with seed ``seed * 16 + i``."""
    from reliability.image_files import image_file

    return [
        image_file(image_set.width, image_set.height, file_format=IMAGE_FORMAT, seed=seed * 16 + index)
        for index in range(image_set.count)
    ]


def renamed(encoded: EncodedRequest, tag: str) -> EncodedRequest:
    """``encoded`` with its images named anew by ``tag`` (the digest that ``engine_prompt`` names them by)."""
    if encoded.media is None:
        raise ValueError("renamed needs a request with images")
    digest = hashlib.sha256(encoded.media.digest + tag.encode()).digest()
    return replace(encoded, media=replace(encoded.media, digest=digest))


def pass_rates(records: int, tokens: int, seconds: list[float]) -> dict[str, Any]:
    """The median pass's rates with the spread of prompt tokens/s and of records/s over the passes."""
    result = repeated_rates(records, tokens, seconds)
    result["records_per_s_spread"] = spread([records / value for value in seconds])
    return result


def image_set_result(
    image_set: ImageSet,
    encoded: list[EncodedRequest],
    seconds: list[float],
    latencies_ms: list[float],
    preprocess_ms: list[float],
) -> dict[str, Any]:
    """One image set's figures: the passes' rates (image tokens counted), single-request latency, the prompts'
    make-up, and the preprocessing time per request and per image."""
    image_tokens = [sum(1 for kind in item.media.token_type_ids if kind) for item in encoded if item.media]
    if len(image_tokens) != len(encoded):
        raise ValueError("every request of an image set has images")
    tokens = sum(len(item.input_ids) for item in encoded)
    median_preprocess = spread(preprocess_ms)["median"]
    return {
        "images_per_request": image_set.count,
        "image_size": [image_set.width, image_set.height],
        "image_tokens_per_request": image_tokens[0],
        "mean_prompt_tokens": round(tokens / len(encoded), 1),
        "states_cut": sum(item.state_truncated for item in encoded),
        **pass_rates(len(encoded), tokens, seconds),
        "single_request_ms": percentiles(latencies_ms),
        "preprocess_ms_per_request": spread(preprocess_ms),
        "preprocess_ms_per_image": round(median_preprocess / image_set.count, 2),
    }


def text_ratio(vision: dict[str, Any], cases: dict[str, Any], work: Path | None = None) -> dict[str, Any] | None:
    """The vision engine's text-only throughput against the text-only case of its mode (``vllm-fp8-<mode>``): that
    case's result in ``cases`` (the same invocation), else its result file in ``work`` (an earlier invocation on
    the same folder; ``same_invocation`` says which). ``None`` when neither has figures over the same records."""
    reference = f"vllm-fp8-{vision.get('mode')}"
    mine = vision.get("text_only", {})
    text = cases.get(reference) or {}
    same_invocation = "prompt_tokens_per_s" in text
    stored = work / "results" / f"{reference}.json" if work is not None else None
    if not same_invocation and stored is not None and stored.is_file():
        text = json.loads(stored.read_text())
    if "prompt_tokens_per_s" not in text or "prompt_tokens_per_s" not in mine:
        return None
    if (text.get("records"), text.get("prompt_tokens")) != (mine.get("records"), mine.get("prompt_tokens")):
        return None  # other records: no comparison
    ratio = mine["prompt_tokens_per_s"] / text["prompt_tokens_per_s"]
    return {
        "case": reference,
        "same_invocation": same_invocation,
        "case_prompt_tokens_per_s": text["prompt_tokens_per_s"],
        "ratio": round(ratio, 4),
        "target": TEXT_TARGET,
        "met": ratio >= TEXT_TARGET,
    }


def attach_text_ratios(cases: dict[str, Any], work: Path | None = None) -> None:
    """Add :func:`text_ratio` to each vision case's ``text_only`` figures in ``cases`` (the summary's)."""
    for key, found in cases.items():
        result = found if "text_only" in (found or {}) else (found or {}).get("partial") or {}
        if base_case(key) == "vision" and "text_only" in result:
            ratio = text_ratio(result, cases, work)
            if ratio is not None:
                result["text_only"]["ratio_to_text_case"] = ratio


def time_preprocessing(tokenizer: Any, processor: Any, files: list[bytes]) -> list[float]:
    """Milliseconds per request to decode ``files`` and run the release's processor on them (one run untimed)."""
    from clef_head.media import decode_image, encode_media, files_digest

    times = []
    for run in range(PREPROCESS_RUNS + 1):
        started = time.perf_counter()
        images = [decode_image(data, ("images", index)) for index, data in enumerate(files)]
        encode_media(tokenizer, images, [], files_digest(files), image_processor=processor)
        if run:
            times.append(1000 * (time.perf_counter() - started))
    return times


def time_image_set(
    encode: Callable[[list[dict[str, Any]], list[Any], list[int]], None],
    encoded: list[EncodedRequest],
    pads: tuple[int, int],
    repeats: int,
    single_requests: int,
) -> tuple[list[float], list[float]]:
    """Seconds of ``repeats`` passes over ``encoded`` (after a warm-up on its first records) and milliseconds of
    ``single_requests`` lone requests; each request's images named anew (:func:`renamed`). ``pads``: the image
    and video pad token ids."""
    import clef_plugin

    params = [clef_plugin.pooling_params(item.layout, len(item.input_ids)) for item in encoded]
    lengths = [len(item.input_ids) for item in encoded]

    def prompts(tag: str, items: list[EncodedRequest]) -> list[dict[str, Any]]:
        return [clef_plugin.engine_prompt(renamed(item, f"{tag}:{n}"), *pads) for n, item in enumerate(items)]

    warm = min(WARMUP_RECORDS, len(encoded))
    encode(prompts("warm-up", encoded[:warm]), params[:warm], lengths[:warm])
    batches = iter([prompts(f"pass {number}", encoded) for number in range(repeats)])
    seconds, _ = timed_passes(lambda: encode(next(batches), params, lengths), repeats, "cpu")
    latencies = []
    for number in range(single_requests):
        index = number % len(encoded)
        one = prompts(f"single {number}", [encoded[index]])
        started = time.perf_counter()
        encode(one, [params[index]], [lengths[index]])
        latencies.append(1000 * (time.perf_counter() - started))
    return seconds, latencies


def case_vision(args: argparse.Namespace, work: Path, releases: dict[str, str]) -> dict[str, Any]:
    """The vision case on the FP8 release (module docstring); compile + CUDA graphs on CUDA, eager on the CPU."""
    import vllm
    from transformers import AutoTokenizer

    import clef_plugin
    from clef_head.encoder import encode_request
    from clef_head.media import IMAGE_PAD, VIDEO_PAD, decode_image, encode_media, files_digest, release_image_processor
    from clef_head.request import parse_request

    key = args.result_key or "vision"
    release = releases["fp8"]
    mode = "graphs" if args.device.startswith("cuda") else "eager"
    max_model_len = max(args.max_model_len, args.vision_max_model_len)
    tokenizer: Any = AutoTokenizer.from_pretrained(release)  # its ids are read as clef_head.media reads them
    processor = release_image_processor(release)
    ids, layouts = load_encoded(work)
    bodies = json.loads((work / "records.json").read_text())[: args.vision_records]
    requests = [parse_request(body) for body in bodies]
    sets: list[tuple[ImageSet, list[EncodedRequest], list[float]]] = []
    for index, image_set in enumerate(IMAGE_SETS):
        files = image_files(image_set, args.seed * len(IMAGE_SETS) + index)
        preprocess = time_preprocessing(tokenizer, processor, files)
        images = [decode_image(data, ("images", number)) for number, data in enumerate(files)]
        media = encode_media(tokenizer, images, [], files_digest(files), image_processor=processor)
        encoded = [encode_request(tokenizer, request, max_length=max_model_len, media=media) for request in requests]
        sets.append((image_set, encoded, preprocess))

    kwargs = plugin_engine_kwargs(args, release, mode, max_model_len=max_model_len, vision=True)
    result: dict[str, Any] = {
        "vllm": vllm.__version__,
        "mode": mode,
        "release": release,
        "max_model_len": max_model_len,
        "image_format": IMAGE_FORMAT,
        "engine_kwargs": {key: str(value) for key, value in kwargs.items()},
    }
    llm, figures = start_engine(kwargs)
    result.update(figures)
    pads = (int(tokenizer.convert_tokens_to_ids(IMAGE_PAD)), int(tokenizer.convert_tokens_to_ids(VIDEO_PAD)))

    def encode(prompts: list[dict[str, Any]], params: list[Any], lengths: list[int]) -> None:
        outputs = llm.encode(prompts, pooling_params=params, pooling_task=clef_plugin.POOLING_TASK, use_tqdm=False)
        ran = [len(output.prompt_token_ids) for output in outputs]
        if ran != lengths:  # the engine must run the prompts as encoded (each image's pads expanded back)
            raise RuntimeError(f"the engine ran prompts of {ran[:4]}... tokens, encoded {lengths[:4]}...")
        for output in outputs:
            clef_plugin.option_logits(output)  # raises on a refused layout or an empty answer

    text_prompts = [{"prompt_token_ids": item} for item in ids]
    text_params = [clef_plugin.pooling_params(layout, len(item)) for item, layout in zip(ids, layouts, strict=True)]
    text_lengths = [len(item) for item in ids]
    warm = min(WARMUP_RECORDS, len(ids))
    started = time.perf_counter()
    encode(text_prompts[:warm], text_params[:warm], text_lengths[:warm])
    warmup_s = round(time.perf_counter() - started, 2)
    seconds, _ = timed_passes(lambda: encode(text_prompts, text_params, text_lengths), args.repeats, "cpu")
    result["text_only"] = {"warmup_s": warmup_s, **pass_rates(len(ids), sum(text_lengths), seconds)}
    write_json(work / "results" / f"{key}.json", {**result, "case": key, "partial": True})  # kept past the budget

    result["images"] = {}
    for image_set, encoded, preprocess in sets:
        seconds, latencies = time_image_set(encode, encoded, pads, args.repeats, args.vision_latency_requests)
        result["images"][image_set.name] = image_set_result(image_set, encoded, seconds, latencies, preprocess)
        write_json(work / "results" / f"{key}.json", {**result, "case": key, "partial": True})
    result["memory"] = gpu_memory(args.device)
    return result
