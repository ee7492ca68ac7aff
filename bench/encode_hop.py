"""The encode stage's round trip for lone bodies: where the predictor prepares a body, timed as the service's
encode stage times it (``clef_stage_seconds{stage="encode"}``: from handing the job to the preparer to its result).

    python -m bench.encode_hop [--records 200] [--tokens 512] [--repeats 3] [--processes 1,4]

Each body is sent alone, with a short pause after it (one client: the preparer idle when a body arrives), to:
a thread of this process with the transformers tokenizer (``--encode-processes 0`` on a vLLM engine, whose
tokenizer is a transformers one), a thread with the release's ``tokenizer.json`` run by the ``tokenizers`` library
(what a worker runs, without the hop), and encode pools of N worker processes
(:class:`predictor.serving.encode_pool.EncodePool`, ``--encode-processes N``). The bodies are the GPU benchmark's
sized records with Qwen3.5's vocabulary, as :mod:`bench.encode_benchmark` builds them. Prints one JSON line: for each
preparer, the median milliseconds per body of each timed pass (after one untimed pass), then a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.encode_benchmark import SETTINGS, release_tokenizer, sized_bodies
from predictor.serving import prepare
from predictor.serving.encode_pool import EncodePool, InProcessPreparer, Preparer
from predictor.serving.prepare import PrepareSettings

PAUSE_S = 0.002
"""Between two bodies: the preparer (and each worker) idle when the next one arrives, as with one client."""


async def lone_bodies_ms(run: Callable[[bytes], Awaitable[Any]], bodies: list[bytes]) -> float:
    """The median milliseconds of ``run(body)`` over ``bodies``, one at a time."""
    times = []
    for raw in bodies:
        started = time.perf_counter()
        await run(raw)
        times.append(time.perf_counter() - started)
        await asyncio.sleep(PAUSE_S)
    return 1000 * statistics.median(times)


async def passes_ms(preparer: Preparer, settings: PrepareSettings, bodies: list[bytes], repeats: int) -> list[float]:
    """One untimed pass, then ``repeats`` timed passes of :func:`lone_bodies_ms` through ``preparer``."""

    async def run(raw: bytes) -> Any:
        return await preparer.run(prepare.prepare_json, settings, raw, "application/json")

    await lone_bodies_ms(run, bodies)
    return [round(await lone_bodies_ms(run, bodies), 3) for _ in range(repeats)]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    vocabulary, bodies = sized_bodies(args.records, args.tokens)
    result: dict[str, Any] = {"records": len(bodies), "ms_per_body": {}}
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = release_tokenizer(vocabulary, Path(folder))  # the pool's workers load it from the folder too
        timed = result["ms_per_body"]
        timed["thread, transformers tokenizer"] = await passes_ms(
            InProcessPreparer(vocabulary), SETTINGS, bodies, args.repeats
        )
        timed["thread, release tokenizer"] = await passes_ms(
            InProcessPreparer(tokenizer), SETTINGS, bodies, args.repeats
        )
        for processes in args.processes:
            pool = EncodePool(Path(folder), processes, tokenizer)
            try:
                await pool.start(SETTINGS)
                timed[f"{processes} worker process(es)"] = await passes_ms(pool, SETTINGS, bodies, args.repeats)
            finally:
                pool.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=512, help="prompt tokens per record, about")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--processes", type=lambda text: [int(n) for n in text.split(",")], default=[1, 4], help="pool sizes"
    )
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    print(json.dumps(result))
    for preparer, passes in result["ms_per_body"].items():
        print(f"{preparer}: {statistics.median(passes):.3f} ms per lone body (median of {len(passes)} passes {passes})")


if __name__ == "__main__":
    main()
