"""The FP8 model card's client names and offline snippet against this plugin (only the import line changed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import clef_plugin
from clef_head.encoder import encode_request
from clef_head.layout import LayoutError
from clef_head.request import parse_request
from clef_plugin.card import layout_from_questions
from clef_tools.sample_requests import make_requests
from tests.conftest import REFERENCE_MODULE
from tests.plugin.conftest import MAX_MODEL_LEN, TOLERANCE, reference_scores

REPO = Path(__file__).resolve().parents[2]

# The card's curl body: one question of each type about a short text state.
CARD_REQUEST = {
    "model": "clef-flash",
    "state": "Checkout has been failing since this morning and customers cannot place orders.",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should take this?",
            "criteria": {"payments": "Charges, refunds, invoices", "platform": "Errors, outages, bugs"},
        },
        "urgency": {"type": "score", "criteria": ["Can wait", "This week", "Today"]},
        "outage": {"type": "noul", "instructions": "Is a service down?"},
    },
}

# The card's offline snippet. The import of the card's plugin package is the only line changed, to
# ``from clef_plugin import ...``; ``enforce_eager=True`` is added to keep the CPU engine's start cheap.
CARD_SNIPPET = """
import json, sys
from transformers import AutoTokenizer
from vllm import LLM, PoolingParams

from clef_plugin import ARCHITECTURE, TASK, schema_layout
from joint_schema_model import encode_record

model_dir, record = sys.argv[1], json.loads(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(model_dir)
llm = LLM(
    model=model_dir,
    runner="pooling",
    hf_overrides={"architectures": [ARCHITECTURE]},
    enable_prefix_caching=False,
    language_model_only=True,
    max_model_len=%(max_model_len)d,
    enforce_eager=True,
)
encoded = encode_record(tokenizer, record, %(max_model_len)d)
params = PoolingParams(task=TASK, extra_kwargs={"clef_questions": schema_layout(encoded)})
(output,) = llm.encode([{"prompt_token_ids": list(encoded.input_ids)}], pooling_params=params, pooling_task=TASK)
logits = output.outputs.data.float()
print("LOGITS " + json.dumps(logits.tolist()))
"""


def test_card_names_are_exported() -> None:
    assert clef_plugin.CARD_ARCHITECTURE == "ClefFlashForDecision"
    assert clef_plugin.TASK == clef_plugin.POOLING_TASK
    assert callable(clef_plugin.schema_layout)


def test_schema_layout_is_the_same_from_either_encoder(tiny_release: Path, reference: ModuleType) -> None:
    from transformers import AutoTokenizer

    from clef_plugin.pooler import request_layout  # imports vLLM: here, not while the suite is collected

    tokenizer = AutoTokenizer.from_pretrained(tiny_release)
    for body in make_requests(seed=11, count=20) + [CARD_REQUEST]:
        ours = encode_request(tokenizer, parse_request(body))
        theirs = reference.encode_record(tokenizer, body)
        layout = clef_plugin.schema_layout(ours)
        assert layout == clef_plugin.schema_layout(theirs)
        json.dumps(layout)  # plain data: it travels through msgpack to the engine
        rebuilt = request_layout({"clef_questions": layout}, len(ours.input_ids))
        assert [(q.type_id, q.question_span, q.option_spans) for q in rebuilt.questions] == [
            (q.type_id, q.question_span, q.option_spans) for q in ours.layout.questions
        ]


@pytest.mark.parametrize(
    "layout, message",
    [
        ([], "non-empty list"),
        ({"questions": []}, "non-empty list"),
        ([[0, [1, 2]]], r"clef_questions\[0\] must be"),
        ([[0, [1, 2], [[3, 4], [4, 5]]], [7, [1, 2], [[3, 4]]]], r"questions\[1\]\.type"),
        ([[1, [1, 2], [[3, 40]]]], "past the prompt"),
        ([[2, [1, 2], []]], "option_spans must be a non-empty list"),
    ],
)
def test_bad_card_layouts_are_refused(layout: object, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        layout_from_questions(layout, prompt_length=30)


def test_a_request_without_either_layout_key_is_refused() -> None:
    from clef_plugin.pooler import request_layout  # imports vLLM: here, not while the suite is collected

    with pytest.raises(LayoutError, match="neither 'clef_layout' nor 'clef_questions'"):
        request_layout({"other": 1}, 30)


@pytest.mark.vllm
def test_register_adds_the_card_architecture() -> None:
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from clef_plugin.engine_config import ClefEngineConfig

    clef_plugin.register()
    for name in (clef_plugin.ARCHITECTURE, clef_plugin.CARD_ARCHITECTURE):
        assert name in ModelRegistry.get_supported_archs()
        assert MODELS_CONFIG_MAP[name] is ClefEngineConfig


@pytest.mark.vllm
def test_card_offline_snippet_runs_with_only_its_import_changed(
    toy_release: Path, reference: ModuleType, tmp_path: Path
) -> None:
    """On the toy-vocabulary release: the snippet's tokens are the reference's own (``encode_record``), so this checks
    the engine's answers; the layout test above checks the encoders agree on Qwen3.5's vocabulary."""
    snippet = tmp_path / "card_snippet.py"
    snippet.write_text(CARD_SNIPPET % {"max_model_len": MAX_MODEL_LEN})
    release_code = Path(reference.__file__).parent
    assert str(release_code).endswith(str(Path(REFERENCE_MODULE).parent))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(release_code)]),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    result = subprocess.run(
        [sys.executable, str(snippet), str(toy_release), json.dumps(CARD_REQUEST)],
        capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("LOGITS ")]
    engine = torch.tensor(json.loads(line.removeprefix("LOGITS ")))
    expected = reference_scores(toy_release, [CARD_REQUEST])
    (want,) = expected.logits
    assert engine.shape == want.shape == (expected.encoded[0].layout.option_count,)
    offset = 0
    for question in expected.encoded[0].layout.questions:  # per question, as probabilities
        count = len(question.option_spans)
        got, ref = engine[offset : offset + count].softmax(-1), want[offset : offset + count].softmax(-1)
        assert (got - ref).abs().max() <= TOLERANCE, (question.question_id, got, ref)
        offset += count
