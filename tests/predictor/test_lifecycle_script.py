"""A short sample of the lifecycle script: SIGTERM under load (transformers engine, tiny release)."""

from __future__ import annotations

import asyncio
from pathlib import Path


def test_sigterm_under_load_gets_no_500(tiny_release: Path, tmp_path: Path, predictor_env: None) -> None:
    from reliability.lifecycle import run

    result = asyncio.run(
        run(
            "sigterm",
            ["--model-dir", str(tiny_release), "--engine", "transformers", "--max-model-len", "512", "--max-batch", "4"],
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
