"""Starts of a ``--vision`` predictor, one after another, and the loads of the tokenizer and processor alone
(BENCHMARKS.md, R35).

    python -m bench.vision_start --release DIR --starts 3 --logs WORK [--loads] -- --enforce-eager ...

Each start runs ``python -m predictor --model-dir DIR --engine vllm --vision`` with the arguments after ``--`` and
prints one line: the seconds from the launch to the first 200 from ``/v1/models/clef-flash`` (polled every 0.25 s),
then, read from the start's log: vLLM's front end before its engine core (from vLLM's ``Resolved architecture``
line to the engine core's first line, one-second resolution) and the warm-up's image step (the engine's share).
The server is stopped once ready. With ``--loads``, first, in this process, one line each for the release's
``tokenizer.json`` read as JSON, as a ``tokenizers.Tokenizer``, ``AutoTokenizer`` twice, and Qwen3-VL's processor
from the release without and with that tokenizer and from its parts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import STDOUT
from typing import Any

from clef_tools.local_server import free_port, http_ok, start_and_wait, stop_process

MODEL_NAME = "clef-flash"
VLLM_CLOCK = re.compile(r"(\d\d):(\d\d):(\d\d)")
IMAGE_STEP = re.compile(r"warm-up image step: .*? scored by the engine in ([\d.]+)s")


def clock_seconds(line: str) -> int | None:
    """The seconds since midnight of the first ``HH:MM:SS`` in ``line`` (None without one)."""
    found = VLLM_CLOCK.search(line)
    if found is None:
        return None
    hours, minutes, seconds = (int(part) for part in found.groups())
    return hours * 3600 + minutes * 60 + seconds


def front_end_seconds(log: str) -> int | None:
    """From vLLM's ``Resolved architecture`` line to the engine core's first line, in whole seconds (None when the
    log lacks either)."""
    resolved = core = None
    for line in log.splitlines():
        if resolved is None and "Resolved architecture" in line:
            resolved = clock_seconds(line)
        elif resolved is not None and line.startswith("(EngineCore"):
            core = clock_seconds(line)
            break
    if resolved is None or core is None:
        return None
    return core - resolved


def image_step_seconds(log: str) -> float | None:
    """The engine's seconds for the warm-up's image step, from the predictor's log (None without one)."""
    found = IMAGE_STEP.search(log)
    return float(found.group(1)) if found else None


def start_once(release: Path, log_path: Path, extra: list[str], timeout: float) -> dict[str, Any]:
    """One start, stopped once ready: its seconds to ready and what its log says."""
    port = free_port()
    command = [sys.executable, "-m", "predictor", "--model-dir", str(release), "--model-name", MODEL_NAME]
    command += ["--engine", "vllm", "--vision", "--http_port", str(port), *extra]
    url = f"http://127.0.0.1:{port}/v1/models/{MODEL_NAME}"
    with log_path.open("w") as log:
        started = time.perf_counter()
        process = start_and_wait(
            command, lambda: http_ok(url), timeout, interval=0.25, what="the predictor", stdout=log, stderr=STDOUT
        )
        ready_s = time.perf_counter() - started
        stop_process(process)
    text = log_path.read_text()
    return {
        "ready_s": round(ready_s, 1),
        "front_end_s": front_end_seconds(text),
        "image_step_s": image_step_seconds(text),
    }


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """``call()``'s seconds and result."""
    started = time.perf_counter()
    result = call()
    return round(time.perf_counter() - started, 2), result


def loads(release: Path) -> dict[str, float]:
    """Seconds of each load of the release's tokenizer and Qwen3-VL processor, in this process, in order."""
    import tokenizers
    from transformers import AutoImageProcessor, AutoTokenizer, AutoVideoProcessor, Qwen3VLProcessor

    path = str(release)
    figures: dict[str, float] = {}
    figures["json.load(tokenizer.json)"], _ = timed(lambda: json.loads((release / "tokenizer.json").read_text()))
    figures["tokenizers.Tokenizer.from_file"], _ = timed(
        lambda: tokenizers.Tokenizer.from_file(str(release / "tokenizer.json"))
    )
    figures["AutoTokenizer.from_pretrained"], tokenizer = timed(lambda: AutoTokenizer.from_pretrained(path))
    figures["AutoTokenizer.from_pretrained, again"], _ = timed(lambda: AutoTokenizer.from_pretrained(path))
    figures["Qwen3VLProcessor.from_pretrained"], _ = timed(lambda: Qwen3VLProcessor.from_pretrained(path))
    figures["Qwen3VLProcessor.from_pretrained(tokenizer=...)"], _ = timed(
        lambda: Qwen3VLProcessor.from_pretrained(path, tokenizer=tokenizer)
    )
    figures["Qwen3VLProcessor(its parts, that tokenizer)"], _ = timed(
        lambda: Qwen3VLProcessor(
            image_processor=AutoImageProcessor.from_pretrained(path),
            video_processor=AutoVideoProcessor.from_pretrained(path),
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
        )
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.vision_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--logs", type=Path, required=True, help="folder for each start's log (start-N.log)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a start may take to be ready")
    parser.add_argument("--loads", action="store_true", help="time the tokenizer and processor loads first")
    parser.add_argument("predictor_args", nargs="*", help="more predictor arguments (after --)")
    args = parser.parse_args(argv)
    if args.loads:
        for name, seconds in loads(args.release).items():
            print(f"{name}: {seconds:.2f} s", flush=True)
    args.logs.mkdir(parents=True, exist_ok=True)
    for number in range(1, args.starts + 1):
        figures = start_once(args.release, args.logs / f"start-{number}.log", args.predictor_args, args.timeout)
        print(json.dumps({"start": number, **figures}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
