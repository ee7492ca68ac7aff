"""The encode stage's own work: reading, validating and encoding one System One body, as the predictor does it.

    python -m bench.encode_benchmark [--records 200] [--tokens 512] [--repeats 5]

The bodies are the GPU benchmark's sized records (``clef_tools.sized_records``, seed 0), the tokenizer is
Qwen3.5's vocabulary run by the ``tokenizers`` library, as in the predictor's encode workers
(:class:`predictor.serving.prepare.ReleaseTokenizer`). Prints one JSON line: milliseconds per body (median of the
timed passes, each over every record, after one untimed pass that counts the prompt tokens) and the tokenizer
calls per body, then a summary.
No worker hop and no HTTP: the part of the predictor's encode stage that runs in a worker.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from clef_head.request import DEFAULT_LIMITS
from clef_tools.sized_records import make_records
from clef_tools.tiny import build_tokenizer
from predictor.serving.prepare import TOKENIZER_FILE, PrepareSettings, ReleaseTokenizer, prepare_json
from predictor.serving.request_policy import RequestPolicy

MAX_LENGTH = 2048
SETTINGS = PrepareSettings("clef-flash", DEFAULT_LIMITS, RequestPolicy(), MAX_LENGTH)
"""How the encode benchmarks prepare a body: the default limits and name policy, prompts up to MAX_LENGTH."""


def sized_bodies(records: int, tokens: int) -> tuple[Any, list[bytes]]:
    """Qwen3.5's vocabulary (a transformers tokenizer) and ``records`` of the GPU benchmark's sized records of about
    ``tokens`` prompt tokens each (seed 0), as JSON bodies."""
    vocabulary = build_tokenizer()
    return vocabulary, [orjson.dumps(body) for body in make_records(vocabulary, records, seed=0, tokens=tokens)]


def release_tokenizer(vocabulary: Any, folder: Path) -> ReleaseTokenizer:
    """``vocabulary`` saved as a release's ``tokenizer.json`` in ``folder``, loaded as an encode worker loads it."""
    vocabulary.backend_tokenizer.save(str(folder / TOKENIZER_FILE))
    return ReleaseTokenizer(folder)


class CallCounter:
    """A tokenizer that counts its calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        self.calls += 1
        return self.inner(text, add_special_tokens=add_special_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=512, help="prompt tokens per record, about")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    vocabulary, bodies = sized_bodies(args.records, args.tokens)
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = release_tokenizer(vocabulary, Path(folder))

    def one_pass(encoder: Any) -> float:
        started = time.perf_counter()
        for body in bodies:
            prepare_json(encoder, SETTINGS, body, "application/json")
        return (time.perf_counter() - started) / len(bodies)

    lengths = [len(prepare_json(tokenizer, SETTINGS, body, "application/json")[1].input_ids) for body in bodies]
    passes = [one_pass(tokenizer) for _ in range(args.repeats)]
    counter = CallCounter(tokenizer)
    one_pass(counter)  # a tokenizer object seen for the first time: it pays for the template's pieces once
    counter.calls = 0
    one_pass(counter)
    result = {
        "records": len(bodies),
        "prompt_tokens_mean": round(statistics.mean(lengths), 1),
        "ms_per_body": round(1000 * statistics.median(passes), 3),
        "ms_per_body_min_max": [round(1000 * min(passes), 3), round(1000 * max(passes), 3)],
        "tokenizer_calls_per_body": round(counter.calls / len(bodies), 2),
    }
    print(json.dumps(result))
    print(
        f"{result['ms_per_body']} ms per body (median of {args.repeats} passes over {len(bodies)} records of "
        f"{result['prompt_tokens_mean']} tokens), {result['tokenizer_calls_per_body']} tokenizer calls per body"
    )


if __name__ == "__main__":
    main()
