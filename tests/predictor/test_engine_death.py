"""A killed vLLM engine core (multiprocess mode, as served) ends the predictor with code 3 within 5 s."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from predictor.serving.lifecycle import ENGINE_DEAD_EXIT_CODE
from tests.predictor.conftest import start_predictor, stop

pytestmark = pytest.mark.vllm


def test_killing_the_engine_core_ends_the_process(toy_release: Path, tmp_path: Path, predictor_env: None) -> None:
    server = start_predictor(
        tmp_path,
        "--model-dir",
        str(toy_release),
        "--engine",
        "vllm",
        "--max-model-len",
        "512",
        "--kv-cache-memory-bytes",
        "1G",
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    family = psutil.Process(server.process.pid).children(recursive=True)
    try:
        (core,) = [
            child for child in family if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name()
        ]
        killed = time.monotonic()
        core.kill()
        code = server.process.wait(timeout=5)
        elapsed = time.monotonic() - killed
    finally:
        stop(server)
        for process in family:  # the engine core's own workers, orphaned by the kill
            if process.is_running():
                process.kill()
    assert code == ENGINE_DEAD_EXIT_CODE, server.log()[-3000:]
    assert elapsed < 5
    log = server.log()
    assert log.count("engine died:") == 1 and "exiting with code 3" in log
