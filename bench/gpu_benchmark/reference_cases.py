"""The transformers reference engine and the head alone (each run in a case's own process)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

from bench.gpu_benchmark.timing import WARMUP_RECORDS, gpu_memory, rates, repeated_rates, spread, sync, timed_passes
from bench.gpu_benchmark.workdir import load_encoded, save_logits


def case_transformers(args: argparse.Namespace, work: Path, releases: dict[str, str]) -> dict[str, Any]:
    """The transformers reference engine in BF16: a first pass over all records in a fresh process, then
    ``--repeats`` steady-state passes (every batch shape already run once), and the backbone/head split."""
    import torch

    from clef_head.encoder import EncodedRequest
    from predictor.engines.reference import TransformersScorer

    ids, layouts = load_encoded(work)
    count = args.transformers_records or len(ids)
    ids, layouts = ids[:count], layouts[:count]
    encoded = [EncodedRequest(input_ids=i, layout=layout) for i, layout in zip(ids, layouts, strict=True)]
    tokens = sum(map(len, ids))
    result: dict[str, Any] = {"fla": importlib.util.find_spec("fla") is not None}
    started = time.perf_counter()
    scorer = TransformersScorer(
        releases["bf16"],
        device=args.device,
        dtype=torch.bfloat16,
        max_length=args.max_model_len,
        max_batch_tokens=args.transformers_batch_tokens,
    )
    sync(args.device)
    result["start_s"] = round(time.perf_counter() - started, 2)
    result["attention"] = getattr(scorer.backbone.config, "_attn_implementation", None)
    result["batching"] = f"length-sorted, right-padded, <= {args.transformers_batch_tokens} padded tokens per batch"
    started = time.perf_counter()
    scorer.score(encoded[:WARMUP_RECORDS])
    sync(args.device)
    result["warmup_s"] = round(time.perf_counter() - started, 2)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    # First pass: each new batch shape pays its one-off costs (Triton JIT and autotuning, kernel plans).
    first, logits = timed_passes(lambda: scorer.score(encoded), 1, args.device)
    result["first_pass"] = rates(len(encoded), tokens, first[0])
    save_logits(work, "transformers", logits)
    # Steady state: the same batches again, every shape warm.
    steady, _ = timed_passes(lambda: scorer.score(encoded), args.repeats, args.device)
    result.update(repeated_rates(len(encoded), tokens, steady))
    backbone, _ = timed_passes(lambda: scorer_hidden_states(scorer, encoded), args.repeats, args.device)
    result["backbone_only"] = repeated_rates(len(encoded), tokens, backbone)
    result["memory"] = gpu_memory(args.device)
    result["split"] = transformers_split(args, scorer, encoded)
    return result


def scorer_hidden_states(scorer: Any, encoded: list[Any]) -> None:
    """The backbone alone over the batches :meth:`TransformersScorer.score` forms (the head skipped)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].input_ids))
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(encoded[order[end]].input_ids) * (end - start + 1) <= scorer.max_batch_tokens:
            end += 1
        scorer.hidden_states([encoded[i] for i in order[start:end]])
        start = end


def transformers_split(args: argparse.Namespace, scorer: Any, encoded: list[Any]) -> dict[str, Any]:
    """Backbone vs head time on length-sorted batches of a subset, first pass and again (steady)."""
    import torch

    subset = sorted(encoded[: min(len(encoded), 256)], key=lambda item: len(item.input_ids))
    per_batch = max(1, args.transformers_batch_tokens // max(len(item.input_ids) for item in subset))
    split: dict[str, Any] = {"records": len(subset), "records_per_batch": per_batch}
    for label in ("first_pass", "steady"):
        backbone_s = head_s = 0.0
        for start in range(0, len(subset), per_batch):
            batch = subset[start : start + per_batch]
            sync(args.device)
            t0 = time.perf_counter()
            hidden = scorer.hidden_states(batch)
            sync(args.device)
            t1 = time.perf_counter()
            with torch.inference_mode():
                scorer.head(
                    hidden,
                    [torch.tensor(item.input_ids, device=scorer.device) for item in batch],
                    [item.layout for item in batch],
                    scorer.lm_head_weight,
                )
            sync(args.device)
            backbone_s, head_s = backbone_s + t1 - t0, head_s + time.perf_counter() - t1
        split[label] = {
            "backbone_ms_per_record": round(1000 * backbone_s / len(subset), 3),
            "head_ms_per_record": round(1000 * head_s / len(subset), 3),
            "head_share": round(head_s / (head_s + backbone_s), 4),
        }
    split["head_share"] = split["steady"]["head_share"]
    return split


def case_head(args: argparse.Namespace, work: Path, releases: dict[str, str]) -> dict[str, Any]:
    """The head alone on random hidden states: ms per record at several batch sizes."""
    import torch
    from safetensors import safe_open

    from clef_head.checkpoint import load_head

    ids, layouts = load_encoded(work)
    dtype = torch.bfloat16
    head = load_head(releases["bf16"], device=args.device, dtype=dtype)
    release = Path(releases["bf16"])
    index = release / "model.safetensors.index.json"
    shard = json.loads(index.read_text())["weight_map"]["lm_head.weight"] if index.is_file() else "model.safetensors"
    with safe_open(str(release / shard), framework="pt", device=args.device) as handle:
        lm_head = handle.get_tensor("lm_head.weight").to(dtype)
    generator = torch.Generator(device=args.device).manual_seed(0)

    def run(inputs: list[tuple[Any, Any, Any]], size: int) -> None:
        """The inputs through the head, ``size`` records a call."""
        with torch.inference_mode():
            for start in range(0, len(inputs), size):
                chunk = inputs[start : start + size]
                head([r[0] for r in chunk], [r[1] for r in chunk], [r[2] for r in chunk], lm_head)

    result: dict[str, Any] = {"dtype": "bfloat16"}
    for batch in (1, 16, 64):
        count = min(len(ids), max(batch, 64 if args.device.startswith("cuda") else batch))
        records = [
            (
                torch.randn(len(ids[i]), head.config.hidden_size, generator=generator, device=args.device, dtype=dtype),
                torch.tensor(ids[i], device=args.device),
                layouts[i],
            )
            for i in range(count)
        ]

        run(records, batch)
        sync(args.device)
        started = time.perf_counter()
        run(records, batch)
        sync(args.device)
        result[f"batch_{batch}_ms_per_record"] = round(1000 * (time.perf_counter() - started) / count, 3)
        if batch == 1:
            result["one_record"] = one_record_head(head, records, lm_head, args.device, args.repeats)
    result["memory"] = gpu_memory(args.device)
    return result


def one_record_head(
    head: Any, records: list[tuple[Any, Any, Any]], lm_head: Any, device: str, repeats: int
) -> dict[str, Any]:
    """A lone record through the head: the dynamic forward, the static bucketed pass run eagerly, and (on
    CUDA) its CUDA-graph replay; ms per record (median of ``repeats`` passes over the records, each pass
    after one that captured every bucket), whether replays equal the eager static pass exactly, and the
    largest difference to the dynamic forward."""
    import torch

    from clef_head.graphs import GraphedHead

    paths = {"dynamic": head, "static_eager": GraphedHead(head, graphs=False)}
    if device.startswith("cuda"):
        paths["graphs"] = GraphedHead(head, graphs=True)
    outputs: dict[str, list[Any]] = {}
    result: dict[str, Any] = {"records": len(records)}
    for name, path in paths.items():

        def run(path: Any = path) -> list[Any]:
            with torch.inference_mode():
                return [path([hidden], [ids], [layout], lm_head)[0] for hidden, ids, layout in records]

        outputs[name] = run()  # first pass: captures every bucket's graph
        seconds, _ = timed_passes(run, repeats, device)
        result[f"{name}_ms_per_record"] = spread([1000 * value / len(records) for value in seconds])
    if "graphs" in outputs:
        result["graphs_captured"] = paths["graphs"].captures
        result["graphs_equal_static_eager"] = all(
            torch.equal(a, b) for a, b in zip(outputs["graphs"], outputs["static_eager"], strict=True)
        )
    result["static_max_abs_diff_vs_dynamic"] = max(
        float((a.float() - b.float()).abs().max())
        for a, b in zip(outputs["static_eager"], outputs["dynamic"], strict=True)
    )
    return result
