"""bench.vision_start: what it reads from a start's log, and its loads on a release of our own."""

from __future__ import annotations

from pathlib import Path

from bench.vision_start import clock_seconds, front_end_seconds, image_step_seconds, loads

LOG = """\
2026-12-06 18:31:53.468 1913 predictor.engines INFO [__init__.py:build_engine():163] engine: vllm
INFO 12-06 18:31:53 [model.py:623] Resolved architecture: ClefQwen3_5ForJointSchema
INFO 12-06 18:31:53 [model.py:1788] Using max model len 4096
(EngineCore pid=1985) INFO 12-06 18:32:01 [core.py:116] Initializing a V1 LLM engine (v0.26.0)
(EngineCore pid=1985) INFO 12-06 18:32:02 [gpu_model_runner.py:5250] Starting to load model /tmp/tiny...
2026-12-06 18:32:09.3 1913 predictor.serving.warmup INFO [warmup.py:run_image_warmup():215] warm-up image step: \
one 32 x 32 PNG (90 of 250 prompt tokens) prepared in 0.01s, scored by the engine in 0.06s
"""


def test_the_front_end_runs_from_the_resolved_architecture_to_the_engine_cores_first_line() -> None:
    assert clock_seconds("INFO 12-06 18:31:53 [model.py:623]") == 18 * 3600 + 31 * 60 + 53
    assert clock_seconds("no clock here") is None
    assert front_end_seconds(LOG) == 8
    assert front_end_seconds(LOG.replace("Resolved architecture", "Resolved")) is None
    assert front_end_seconds(LOG.replace("(EngineCore", "(Engine")) is None


def test_the_image_step_is_the_engines_share_of_the_warm_ups_image_step() -> None:
    assert image_step_seconds(LOG) == 0.06
    assert image_step_seconds("warm-up finished in 1.0s") is None


def test_every_load_is_timed_on_a_release(toy_release: Path) -> None:
    figures = loads(toy_release)
    assert list(figures) == [
        "json.load(tokenizer.json)",
        "tokenizers.Tokenizer.from_file",
        "AutoTokenizer.from_pretrained",
        "AutoTokenizer.from_pretrained, again",
        "Qwen3VLProcessor.from_pretrained",
        "Qwen3VLProcessor.from_pretrained(tokenizer=...)",
        "Qwen3VLProcessor(its parts, that tokenizer)",
    ]
    assert all(seconds >= 0 for seconds in figures.values())
