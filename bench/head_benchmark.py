"""Joint schema head throughput: one record at a time vs one batched call.

    python -m bench.head_benchmark [--shape clef-flash|tiny] [--records 64] [--repeats 5] [--dtype float32]
        [--device cuda]

Random hidden states and weights (speed only). Records come from the test generator with 1–8
questions each; prompt lengths are those of the encoded records. Prints records/s for both paths and
the largest logit difference between them. On a GPU it also splits a one-record forward pass into
wall time and GPU kernel time (torch.profiler): the difference is host time, which capturing the head
in a CUDA graph would remove.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from clef_head.encoder import encode_request
from clef_head.head import JointSchemaHead
from clef_head.request import parse_request
from clef_tools.fullsize import FULL_HEAD
from clef_tools.qwen_vocab import MODEL_VOCAB_SIZE
from clef_tools.sample_requests import make_request
from clef_tools.tiny import TINY_HEAD, build_tokenizer

SHAPES = {
    "tiny": TINY_HEAD,
    "clef-flash": FULL_HEAD,
}


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gpu_split(forward: Callable[[], object], repeats: int) -> tuple[float, float, int]:
    """(median wall ms, GPU kernel ms, kernel count) of one ``forward`` call on a CUDA device."""
    from torch.profiler import ProfilerActivity, profile

    forward()
    torch.cuda.synchronize()
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward()
        torch.cuda.synchronize()
        walls.append(1000 * (time.perf_counter() - start))
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        forward()
        torch.cuda.synchronize()
    kernels = [event for event in trace.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    return statistics.median(walls), sum(event.time_range.elapsed_us() for event in kernels) / 1000, len(kernels)


def main() -> None:
    """Run the benchmark and print a small table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="clef-flash")
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument(
        "--vocab", type=int, default=MODEL_VOCAB_SIZE, help="rows of the random lm_head (only gathered rows matter)"
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    config = SHAPES[args.shape]
    device = torch.device(args.device)
    head = JointSchemaHead.from_config(config).to(device=device, dtype=dtype).eval()
    tokenizer = build_tokenizer()
    rng = random.Random(0)
    encoded = [
        encode_request(tokenizer, parse_request(make_request(rng, questions=rng.randint(1, 8))))
        for _ in range(args.records)
    ]
    lm_head = torch.randn(args.vocab, config.hidden_size, dtype=dtype, device=device)
    hidden = [torch.randn(len(e.input_ids), config.hidden_size, dtype=dtype, device=device) for e in encoded]
    ids = [torch.tensor(e.input_ids) for e in encoded]
    layouts = [e.layout for e in encoded]

    with torch.inference_mode():
        one_by_one = lambda: [head([h], [i], [lay], lm_head) for h, i, lay in zip(hidden, ids, layouts, strict=True)]  # noqa: E731
        batched = lambda: head(hidden, ids, layouts, lm_head)  # noqa: E731
        single_s = _timed(one_by_one, args.repeats)
        batch_s = _timed(batched, args.repeats)
        difference = max((a[0] - b).abs().max().item() for a, b in zip(one_by_one(), batched(), strict=True))
        split = (
            gpu_split(lambda: head(hidden[:1], ids[:1], layouts[:1], lm_head), 20) if device.type == "cuda" else None
        )

    tokens = sum(len(e.input_ids) for e in encoded)
    questions = sum(len(e.layout.questions) for e in encoded)
    print(
        f"head {args.shape} ({args.dtype}, {args.device}, {args.threads} threads): {args.records} records, "
        f"{questions} questions, {tokens} prompt tokens"
    )
    print(f"{'path':<22}{'seconds':>10}{'records/s':>12}")
    print(f"{'one record per call':<22}{single_s:>10.3f}{args.records / single_s:>12.1f}")
    print(f"{'one batched call':<22}{batch_s:>10.3f}{args.records / batch_s:>12.1f}")
    print(f"speed-up {single_s / batch_s:.2f}x; max |Δ logit| between paths {difference:.2e}")
    if split is not None:
        wall, kernel, count = split
        print(f"one record ({len(ids[0])} tokens): wall {wall:.2f} ms, GPU kernels {kernel:.2f} ms in {count} kernels")


if __name__ == "__main__":
    main()
