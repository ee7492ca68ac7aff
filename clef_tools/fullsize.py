"""Build a random-weight Clef release with Clef-flash's full shape, on the GPU, in seconds.

    python -m clef_tools.fullsize OUT [--dtype bf16] [--device cuda] [--scale full|tiny] [--fp8 DIR]

``full``: the Qwen3.5-9B text shape (vocab 248320, hidden 4096, 32 layers: 3 Gated DeltaNet + 1
full attention repeating, 16 heads / 4 KV heads of dim 256, linear attention 16 key / 32 value heads
of dim 128, intermediate 12288, partial rotary 0.25, interleaved mrope), Qwen3.5-9B's vision tower
(27 blocks of hidden 1152, intermediate 4304, 16 heads, 2,304 position embeddings, 16-pixel patches merged
2×2, its output projected to 4096: about 0.46 B parameters, kept BF16 by ``clef_tools.quantize``) and a head
of clef-flash's shape (hidden 4096, width 1024, 2 routing layers, 4 layers, 16 heads, feed-forward 4096).
``tiny``: the same architecture at CPU-test size (a one-block vision tower of hidden size 32). The model
is created on the ``meta`` device, materialised on ``--device`` and initialised there with the model's own
initialisers, then saved as safetensors shards.

The tokenizer is Qwen3.5's own (``clef_tools.qwen_vocab``), so benchmark records have the real
token counts and tokenizer cost. Random weights measure speed, never accuracy: a marker
file says so. ``--fp8 DIR`` also writes the FP8_DYNAMIC copy (``clef_tools.quantize``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from clef_head.checkpoint import RANDOM_MARKER
from clef_head.head import HeadConfig
from clef_tools.qwen_vocab import MODEL_VOCAB_SIZE
from clef_tools.tiny import (
    SPECIAL_TOKENS,
    TINY_HEAD,
    TINY_TEXT_SHAPE,
    TINY_VISION_SHAPE,
    backbone_config,
    build_tokenizer,
    random_head,
    save_head,
    save_processor,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FULL_TEXT: dict[str, Any] = dict(
    vocab_size=MODEL_VOCAB_SIZE,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=32,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    max_position_embeddings=262144,
    mrope_section=[11, 11, 10],
)
FULL_VISION: dict[str, Any] = dict(
    depth=27,
    hidden_size=1152,
    intermediate_size=4304,
    num_heads=16,
    num_position_embeddings=2304,
)
"""Qwen3.5-9B's vision tower (transformers' ``Qwen3_5VisionConfig`` defaults)."""
FULL_HEAD = HeadConfig(hidden_size=4096, width=1024, routing_layers=2, layers=4, heads=16, feedforward=4096)
SCALES: dict[str, tuple[dict[str, Any], dict[str, Any], HeadConfig, str]] = {
    "full": (FULL_TEXT, FULL_VISION, FULL_HEAD, "5GB"),
    # small shards: the sharded layout is exercised on the CPU too
    "tiny": (TINY_TEXT_SHAPE, TINY_VISION_SHAPE, TINY_HEAD, "1MB"),
}
DTYPES = {"bf16": torch.bfloat16}


def model_config(scale: str, token_id: dict[str, int]) -> Any:
    """The ``Qwen3_5Config`` of ``scale`` (the text and vision shapes above)."""
    text, vision, _, _ = SCALES[scale]
    return backbone_config(text, vision, token_id)


def random_backbone(config: Any, device: torch.device, dtype: torch.dtype, seed: int) -> PreTrainedModel:
    """The backbone built on ``meta``, materialised on ``device`` and initialised there."""
    from transformers import Qwen3_5ForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration._from_config(config, dtype=dtype)
    model = model.to_empty(device=device)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():  # any parameter the initialisers miss stays NaN and is caught
            parameter.fill_(float("nan"))
        model.apply(model._init_weights)
        for name, parameter in model.named_parameters():
            if not torch.isfinite(parameter).all():
                raise RuntimeError(f"initialisation left {name} unset or non-finite")
    return model.eval()


def build_release(
    out: str | Path, scale: str = "full", device: str = "cuda", dtype: str = "bf16", seed: int = 0
) -> dict[str, Any]:
    """Write the random release to ``out`` and return timings and sizes."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for but CUDA is not available")
    path = Path(out)
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} exists and is not empty")
    path.mkdir(parents=True, exist_ok=True)
    _, _, head_config, shard_size = SCALES[scale]
    started = time.perf_counter()
    tokenizer = build_tokenizer()
    token_id = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    model = random_backbone(model_config(scale, token_id), target, DTYPES[dtype], seed)
    parameters = sum(p.numel() for p in model.parameters())
    if target.type == "cuda":
        torch.cuda.synchronize()
    built = time.perf_counter()
    model.save_pretrained(path, max_shard_size=shard_size)
    del model
    if target.type == "cuda":
        torch.cuda.empty_cache()
    saved = time.perf_counter()
    save_processor(path, tokenizer)
    save_head(random_head(head_config, seed), path)
    (path / RANDOM_MARKER).write_text(
        f"Random weights (seed {seed}, {scale} shape), built by clef_tools.fullsize for speed "
        "measurements. Not a trained Clef model: its answers carry no meaning.\n"
    )
    return {
        "path": str(path),
        "scale": scale,
        "dtype": dtype,
        "device": str(target),
        "parameters": parameters,
        "bytes": sum(item.stat().st_size for item in path.iterdir() if item.is_file()),
        "build_s": round(built - started, 2),
        "save_s": round(saved - built, 2),
        "total_s": round(time.perf_counter() - started, 2),
    }


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring); prints a JSON summary."""
    parser = argparse.ArgumentParser(prog="python -m clef_tools.fullsize", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="new folder for the BF16 release")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--device", default="cuda", help="where weights are created: cuda, cuda:N or cpu")
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fp8", type=Path, default=None, help="also write the FP8_DYNAMIC release here")
    args = parser.parse_args(argv)
    try:
        summary: dict[str, Any] = {"bf16": build_release(args.out, args.scale, args.device, args.dtype, args.seed)}
        if args.fp8 is not None:
            from clef_tools.quantize import quantize_release

            summary["fp8"] = quantize_release(args.out, args.fp8, device=args.device).to_json()
    except (ValueError, RuntimeError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
