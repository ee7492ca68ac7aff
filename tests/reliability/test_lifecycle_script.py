"""A short sample of the lifecycle script: SIGTERM under load (transformers engine, tiny release)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.predictor.conftest import tiny_server_args


def test_sigterm_under_load_gets_no_500(toy_release: Path, tmp_path: Path, predictor_env: None) -> None:
    from reliability.lifecycle import run

    result = asyncio.run(
        run(
            "sigterm",
            [
                *tiny_server_args(toy_release),
            ],
            clients=4,
            load_seconds=3,
            exit_timeout=120,
            engine_name="EngineCore",
            startup_timeout=900,
            log_path=tmp_path / "predictor.log",
        )
    )
    assert result["ok"], (result, (tmp_path / "predictor.log").read_text()[-3000:])
    assert result["statuses"].get("200", 0) > 0 and result["exit_code"] == 0, result


def test_sigterm_with_256_clients_in_flight_past_the_drain(
    toy_release: Path, tmp_path: Path, predictor_env: None
) -> None:
    """More work in flight than the drain allows: what is unanswered then gets 503 + Retry-After (uvicorn's own
    timeout would cancel it into a 500), and the process is gone within its delay + drain + a few seconds.

    256 requests admitted, each a forward pass (no answer cache, no shedding by expected wait): on an idle 2-core
    machine the tiny release answers ~30 a second, so 64 in flight could all finish within delay + drain (3 s)
    and the drain's cut would not be exercised."""
    from predictor.serving.lifecycle import EXIT_AFTER_DRAIN_S
    from reliability.lifecycle import run

    delay, drain = 1, 2
    log = tmp_path / "predictor.log"
    result = asyncio.run(
        run(
            "sigterm",
            [
                *tiny_server_args(toy_release),
                "--max-queued-requests",
                "256",
                "--max-queue-wait-s",
                "600",
                "--answer-cache-bytes",
                "0",
                "--shutdown-delay",
                str(delay),
                "--drain-timeout",
                str(drain),
            ],
            clients=256,
            load_seconds=3,
            exit_timeout=delay + drain + EXIT_AFTER_DRAIN_S,
            engine_name="EngineCore",
            startup_timeout=900,
            log_path=log,
        )
    )
    text = log.read_text()
    assert result["ok"] and result["exit_code"] == 0, (result, text[-3000:])
    assert "500" not in result["statuses"] and result["503_without_retry_after"] == 0, result
    assert "answered 503 with Retry-After" in text and "timeout graceful shutdown exceeded" not in text, text[-3000:]
