"""``clef-systemone``: the FP8 model card's command, flags and routes, on the predictor (CPU vLLM, tiny release)."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
import tomllib

import httpx
import pytest

from predictor import cli
from predictor.systemone_cli import build_parser, predictor_argv
from tests.predictor.conftest import REPO, Predictor

# The card's curl example, sent as curl sends it: the JSON text with a JSON content type.
CARD_CURL_BODY = """{
  "model": "clef-flash",
  "state": "Checkout has been failing since this morning and customers cannot place orders.",
  "questions": {
    "team": {"type": "choice", "instructions": "Which team should take this?",
             "criteria": {"payments": "Charges, refunds, invoices", "platform": "Errors, outages, bugs"}},
    "urgency": {"type": "score", "criteria": ["Can wait", "This week", "Today"]},
    "outage": {"type": "noul", "instructions": "Is a service down?"}}}"""


def _translate(*card_args: str, parser: argparse.ArgumentParser | None = None) -> list[str]:
    args, rest = build_parser().parse_known_args(["--model", "/models/clef", *card_args])
    return predictor_argv(args, rest, parser or cli.build_parser())


def _pairs(argv: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in itertools.pairwise(argv) if flag.startswith("--")}


def test_card_flags_become_predictor_flags() -> None:
    argv = _translate("--served-model-name", "clef", "--dp", "2", "--max-model-len", "8192", "--enforce-eager")
    assert _pairs(argv) | {"--enforce-eager": "ok"} == {
        "--model-dir": "/models/clef",
        "--model-name": "clef",
        "--http_port": "8000",
        "--dp": "2",
        "--max-model-len": "8192",
        "--engine": "vllm",
        "--enforce-eager": "ok",
    }
    assert argv[-1] == "--enforce-eager"  # passed through unchanged
    assert _pairs(_translate("--engine", "transformers"))["--engine"] == "transformers"
    assert "--tensor-parallel-size" not in _translate("--tp", "1")


def _fake_predictor_parser(*flags: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    for flag in flags:
        parser.add_argument(flag)
    return parser


def test_host_and_tp_go_through_when_the_predictor_has_them() -> None:
    parser = _fake_predictor_parser("--host", "--tensor-parallel-size", "--engine")
    pairs = _pairs(_translate("--host", "127.0.0.1", "--tp", "2", parser=parser))
    assert pairs["--host"] == "127.0.0.1" and pairs["--tensor-parallel-size"] == "2"


@pytest.mark.parametrize(
    "card_args, flag", [(("--host", "127.0.0.1"), "--host"), (("--tp", "2"), "--tensor-parallel-size")]
)
def test_host_and_tp_are_refused_when_the_predictor_lacks_them(card_args: tuple[str, str], flag: str) -> None:
    with pytest.raises(ValueError, match=f"{card_args[0]} {card_args[1]}: this predictor has no {flag} flag"):
        _translate(*card_args, parser=_fake_predictor_parser("--engine"))


def test_tp_is_refused_when_the_card_chooses_the_transformers_engine() -> None:
    """The card's command reads its flags with the parser of the engine that will serve (no vLLM flags here)."""
    transformers = cli.build_parser(["--engine", "transformers"])
    with pytest.raises(ValueError, match="--tp 2: this predictor has no --tensor-parallel-size flag"):
        _translate("--tp", "2", "--engine", "transformers", parser=transformers)
    assert _pairs(_translate("--engine", "transformers", parser=transformers))["--engine"] == "transformers"


def test_console_script_is_declared() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["clef-systemone"] == "predictor.systemone_cli:main"


def test_model_is_required() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "predictor.systemone_cli", "--port", "1"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2 and "--model" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def card_server(vllm_server: Predictor) -> Predictor:
    """``clef-systemone`` on the tiny release (CPU vLLM), started the card's way
    (shared: tests/predictor/conftest.py)."""
    return vllm_server


@pytest.mark.vllm
def test_card_command_starts_offline_with_vllms_cache_sized_for_its_sequences(card_server: Predictor) -> None:
    """No hub look-up, an engine core process of its own, and a KV cache sized by the predictor that holds
    vLLM's 128 sequences of --max-model-len tokens (vLLM's own default wanted 0.92 of the machine)."""
    log = card_server.stdout() + card_server.log()  # vLLM logs on stdout
    assert "EngineCore pid=" in log
    counted = re.search(r"vLLM CPU KV cache: 0\.\d\d GiB per engine \(attention blocks of (\d+) tokens", log)
    assert counted is not None, log[-3000:]
    # vLLM lays its pages out as predictor.engines.cpu_kv_cache counted on this CPU (384 tokens with AVX-512 BF16,
    # whose GDN path keeps the recurrent state in FP32; 256 without)
    assert f"Setting attention block size to {counted.group(1)} tokens" in log, log[-3000:]
    concurrency = re.search(r"Maximum concurrency for 512 tokens per request: ([\d.]+)x", log)
    assert concurrency is not None and 128 <= float(concurrency.group(1)) < 130, log[-3000:]


@pytest.mark.vllm
def test_card_routes_answer_after_warm_up(card_server: Predictor) -> None:
    assert "engine: vllm" in card_server.log()
    assert "warm-up finished" in card_server.log_at_first_ready  # /health said 200 only after warm-up
    assert all(item["/health"] in (200, 503) for item in card_server.rounds)
    with httpx.Client(base_url=card_server.url, timeout=300) as client:
        response = client.post("/v1/systemone", content=CARD_CURL_BODY, headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == "clef-flash" and body["usage"]["output_tokens"] == 0
        assert body["answers"]["team"]["choice"] in ("payments", "platform")
        assert set(body["answers"]["urgency"]["probabilities"]) == {"0", "1", "2"}
        assert 0 <= body["answers"]["outage"]["noul"] <= 1
        listed = client.get("/v1/models").json()  # the card's OpenAI-style list, beside the hosted API's
        assert listed["object"] == "list" and (listed["data"][0]["id"], listed["data"][0]["object"]) == (
            "clef-flash",
            "model",
        )
        assert listed == client.get("/jev/v1/models").json() and listed["models"][0]["name"] == "clef-flash"
        assert client.get("/health").status_code == 200
        refused = client.post("/v1/systemone", json={**json.loads(CARD_CURL_BODY), "model": "other"})
        assert refused.status_code == 404 and refused.json()["error"]["param"] == "model"


def test_help_states_the_true_host_default() -> None:
    from predictor.http.server import HttpLimits
    from predictor.systemone_cli import DEFAULT_HOST

    assert DEFAULT_HOST == HttpLimits().host == cli.build_parser().parse_args([]).host
    help_text = " ".join(build_parser().format_help().split())
    assert f"--host HOST address to listen on (default: {DEFAULT_HOST}, this machine only" in help_text
    assert "all interfaces" not in help_text and "(default: None)" not in help_text.split("--host", 1)[1][:120]


def test_predictor_help_lists_the_api_flags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    monkeypatch.setattr(FlexibleArgumentParser, "_search_keyword", None)  # --help=KEYWORD is kept on the class
    with pytest.raises(SystemExit) as done:
        cli.build_parser().parse_args(["--help=predictor"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for flag in ("--model-dir", "--api-key-file", "--model-alias", "--host", "--max-batch-items", "--encode-processes"):
        assert flag in shown, flag
