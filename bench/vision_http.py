"""One ``--vision`` predictor over HTTP, one client: its ready time, the first image request after ready, then
steady image requests and text requests on the same server (BENCHMARKS.md, R32).

    python -m bench.vision_http --release DIR --records WORK/records.json --out WORK/vision-http.json \\
        --log WORK/vision-predictor.log -- --max-model-len 16384 --gdn-prefill-backend triton

Arguments after ``--`` go to ``python -m predictor`` after ``--vision``. The order of the requests, all from one
client, one at a time: one image of ``--image-size`` (the first image after ready), a second one of that size, one
of :data:`OTHER_SIZE` (the first of another size), ``--image-requests`` more of ``--image-size``, ``--four-requests``
with four images of that size each (none unless asked), then ``--text-requests`` text requests. Every image is PNG
noise drawn with a seed of its own and every body has a state of its own, so neither the answer cache nor vLLM's
caches serve one twice. Each phase records the client's latencies and the server's stage timers (``/metrics``) over it;
the result also holds the warm-up's time and its image step's (``/metrics`` at ready).

``--answers FILE`` keeps every response's answers, one JSON line per request in the order sent; ``--against FILE``
sets them beside an earlier run's (the same ``--seed``, records and request counts send the same bodies): the result's
``against`` holds, per phase, the largest difference of any probability and the share of questions whose top answer
is the same (two servers of one release that differ in how they run it should agree within the engine's tolerance).
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.gpu_benchmark.metrics import count_changes, encode_bodies, metric_samples, scrape_timers, timer_means
from bench.gpu_benchmark.timing import percentiles
from clef_tools.local_server import NotReady, free_port, http_ok, stop_process, wait_until_ready

Answered = dict[str, Any]
"""One response's answers as ``--answers`` keeps them: ``{"phase": ..., "answers": {question id: answer}}``."""

MODEL_NAME = "clef-flash"
JSON_HEADERS = {"content-type": "application/json"}
OTHER_SIZE = (448, 448)
WARMUP_GAUGES = {"clef_warmup_seconds": "warmup_s", "clef_warmup_image_seconds": "warmup_image_step_s"}
"""The predictor's warm-up gauges and the result's names for them."""


def png_data_url(width: int, height: int, seed: int) -> str:
    """A ``data:image/png;base64,`` URL of random RGB noise of this size."""
    from reliability.image_files import image_file

    data = image_file(width, height, file_format="PNG", seed=seed)
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


class Bodies:
    """Request bodies from the records, in order, each state marked with its index (no body sent twice)."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self.sent = 0

    def next(self, images: list[str] | None = None) -> dict[str, Any]:
        record = self.records[self.sent % len(self.records)]
        body = {**record, "state": f"#v{self.sent} {record['state']}"}
        self.sent += 1
        if images:
            body["images"] = images
        return body


def timed_post(
    client: Any, url: str, body: dict[str, Any], request_id: str | None = None
) -> tuple[float, dict[str, Any]]:
    """Milliseconds and answers of one ``POST /v1/systemone`` (with ``request_id`` as its ``x-request-id``); a
    status other than 200 raises, naming it and the answer. The body is encoded before the clock starts: a 1024 x 768
    PNG of noise makes a 3.1 MB JSON text, and encoding it in the client took about 8 ms on a 2-core machine
    (BENCHMARKS.md, R37), no part of the server's latency."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    headers = JSON_HEADERS if request_id is None else {**JSON_HEADERS, "x-request-id": request_id}
    started = time.perf_counter()
    response = client.post(f"{url}/v1/systemone", content=payload, headers=headers)
    elapsed = 1000 * (time.perf_counter() - started)
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")
    return elapsed, response.json()["answers"]


def phase(client: Any, url: str, name: str, bodies: list[dict[str, Any]], answered: list[Answered]) -> dict[str, Any]:
    """Send ``bodies`` one at a time: the client's latencies, the server's stage timers and where it prepared the
    bodies (``encode_bodies``); each response's answers appended to ``answered`` under the phase's ``name``."""
    before, prepared = scrape_timers(url), encode_bodies(url)
    latencies = []
    for body in bodies:
        elapsed, answers = timed_post(client, url, body)
        latencies.append(elapsed)
        answered.append({"phase": name, "answers": answers})
    result: dict[str, Any] = {
        "requests": len(bodies),
        "server_ms_mean": timer_means(before, scrape_timers(url)),
        "encode_bodies": count_changes(prepared, encode_bodies(url)),
    }
    if len(latencies) == 1:
        result["ms"] = round(latencies[0], 2)
    else:
        result["client_ms"] = percentiles(latencies)
    return result


def probabilities(answer: dict[str, Any]) -> list[float]:
    """An answer's probabilities: a choice's or a score's per option, a noul's probability of true and of false."""
    if answer["type"] == "noul":
        return [answer["noul"], 1.0 - answer["noul"]]
    return list(answer["probabilities"].values())


def compare_answers(ours: list[Answered], theirs: list[Answered]) -> dict[str, dict[str, Any]]:
    """Per phase: questions compared, the largest |Δ probability| and the share of questions whose most probable
    option is the same. ValueError when the two runs did not answer the same requests and questions."""
    if [item["phase"] for item in ours] != [item["phase"] for item in theirs]:
        raise ValueError("the runs sent different requests: use the same --seed, records and request counts")
    figures: dict[str, dict[str, Any]] = {}
    for mine, other in zip(ours, theirs, strict=True):
        if mine["answers"].keys() != other["answers"].keys():
            raise ValueError(f"a {mine['phase']} request's questions differ between the runs")
        phase_figures = figures.setdefault(mine["phase"], {"questions": 0, "max_abs_diff": 0.0, "same_top": 0})
        for question, answer in mine["answers"].items():
            p, q = probabilities(answer), probabilities(other["answers"][question])
            phase_figures["questions"] += 1
            differences = [abs(a - b) for a, b in zip(p, q, strict=True)]
            phase_figures["max_abs_diff"] = max(phase_figures["max_abs_diff"], *differences)
            phase_figures["same_top"] += p.index(max(p)) == q.index(max(q))
    for phase_figures in figures.values():
        phase_figures["max_abs_diff"] = round(phase_figures["max_abs_diff"], 4)
        phase_figures["top_agreement"] = round(phase_figures.pop("same_top") / phase_figures["questions"], 4)
    return figures


def warmup_figures(url: str) -> dict[str, float]:
    """The warm-up's seconds and its image step's, from the server's ``/metrics``."""
    return {
        WARMUP_GAUGES[sample.name]: round(sample.value, 2)
        for sample in metric_samples(url)
        if sample.name in WARMUP_GAUGES
    }


def parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    return int(width), int(height)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vision_http", description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", required=True, help="the FP8 release folder")
    parser.add_argument("--records", type=Path, required=True, help="records.json of bench.gpu_benchmark's prepare")
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    parser.add_argument("--log", type=Path, required=True, help="the predictor's log")
    parser.add_argument("--image-size", type=parse_size, default=(1024, 768), help="WIDTHxHEIGHT")
    parser.add_argument("--image-requests", type=int, default=50)
    parser.add_argument(
        "--four-requests",
        type=int,
        default=0,
        help="requests of four images each (four PNG noise images of 1024x768 exceed the default 8 MiB body limit)",
    )
    parser.add_argument("--text-requests", type=int, default=100)
    parser.add_argument("--engine", default="vllm", help="the predictor's --engine (transformers: a CPU smoke run)")
    parser.add_argument("--ready-timeout", type=float, default=420.0)
    parser.add_argument("--seed", type=int, default=0, help="first image seed (each start should use its own)")
    parser.add_argument("--answers", type=Path, help="write every response's answers here (JSON lines)")
    parser.add_argument("--against", type=Path, help="an earlier run's --answers file to set these answers beside")
    parser.add_argument("predictor_args", nargs="*", help="more predictor arguments (after --)")
    args = parser.parse_args(argv)
    import httpx

    width, height = args.image_size
    seed = iter(range(args.seed * 10_000, (args.seed + 1) * 10_000))
    # drawn before the server starts, so the client's PNG encoding is in no timed figure
    first = [png_data_url(width, height, next(seed)) for _ in range(2)]
    other = png_data_url(*OTHER_SIZE, next(seed))
    steady = [png_data_url(width, height, next(seed)) for _ in range(args.image_requests)]
    four = [[png_data_url(width, height, next(seed)) for _ in range(4)] for _ in range(args.four_requests)]
    bodies = Bodies(json.loads(args.records.read_text()))
    theirs = [json.loads(line) for line in args.against.read_text().splitlines()] if args.against else None
    answered: list[Answered] = []

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "predictor",
        "--model-dir",
        args.release,
        "--model-name",
        MODEL_NAME,
        "--engine",
        args.engine,
        "--http_port",
        str(port),
        "--vision",
        *args.predictor_args,
    ]
    result: dict[str, Any] = {"command": " ".join(command), "image_size": [width, height]}
    with args.log.open("w") as log_file:
        started = time.perf_counter()
        server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            try:
                wait_until_ready(
                    server, lambda: http_ok(f"{url}/v1/models/{MODEL_NAME}"), args.ready_timeout, interval=0.5
                )
            except NotReady as exc:
                raise SystemExit(f"{exc}; see {args.log}") from None
            result["ready_s"] = round(time.perf_counter() - started, 1)
            result.update(warmup_figures(url))
            with httpx.Client(timeout=600) as client:
                for name, phase_bodies in (
                    ("first_image", [bodies.next([first[0]])]),
                    ("second_image", [bodies.next([first[1]])]),
                    ("first_other_size", [bodies.next([other])]),
                    ("one_image", [bodies.next([image]) for image in steady]),
                    ("four_images", [bodies.next(images) for images in four]),
                    ("text", [bodies.next() for _ in range(args.text_requests)]),
                ):
                    if phase_bodies:
                        result[name] = phase(client, url, name, phase_bodies, answered)
                result["first_other_size"]["size"] = list(OTHER_SIZE)
            if theirs is not None:
                result["against"] = {"answers": str(args.against), **compare_answers(answered, theirs)}
        finally:
            if args.answers:
                args.answers.write_text("".join(json.dumps(item) + "\n" for item in answered))
            args.out.write_text(json.dumps(result, indent=1))
            stop_process(server)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
