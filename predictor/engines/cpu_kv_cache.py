"""The default KV cache of vLLM's CPU engine: what the engine's sequences can use, capped by what the machine has.

vLLM's CPU build (0.32) reserves ``--gpu-memory-utilization`` (0.92) of the machine's total memory and gives
the KV cache all of it the model does not use; it refuses to start when that much is not free, which a
machine running anything else never has. Unless ``--kv-cache-memory-bytes``, ``--gpu-memory-utilization`` or
``VLLM_CPU_KVCACHE_SPACE`` says otherwise, the predictor passes ``kv_cache_memory_bytes`` instead (vLLM's
own engine argument): ``--max-num-seqs`` prompts of ``--max-model-len`` tokens, counted as vLLM lays the
cache out for Qwen3.5's hybrid layers, at most :data:`KV_SHARE_OF_FREE` of the memory left free after the
weights, and never less than one prompt of ``--max-model-len`` tokens (else :class:`InsufficientMemory`).

vLLM's layout: each full-attention layer stores K and V per token in blocks; each Gated DeltaNet layer keeps
one state per sequence (a convolution window and a recurrent state). vLLM makes every page the same size: an
attention block holds as many tokens as a DeltaNet state needs bytes, rounded up to
:data:`BLOCK_ALIGNMENT` tokens (``Platform.update_block_size_for_backend``), and a sequence takes
``ceil(tokens / block)`` pages per attention layer plus one page per DeltaNet layer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from predictor.engines.memory import GIB, InsufficientMemory, available_bytes

KV_SHARE_OF_FREE = 0.5
"""Most of the memory left free after the weights that the KV cache takes by default; the rest stays for
activations and for the machine's other programs."""
BLOCK_ALIGNMENT = 128
"""Tokens an attention block is rounded up to on the CPU (vLLM's CPU block size)."""
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class KvLayout:
    """Bytes vLLM's CPU engine keeps per sequence for a release's text model."""

    attention_layers: int
    delta_net_layers: int
    attention_bytes_per_token: int
    """K and V of one token in one full-attention layer."""
    delta_net_state_bytes: int
    """Convolution window and recurrent state of one sequence in one DeltaNet layer."""

    @property
    def block_tokens(self) -> int:
        """Tokens per attention block: a block is as large as a DeltaNet state (vLLM pads to equal pages)."""
        needed = math.ceil(self.delta_net_state_bytes / self.attention_bytes_per_token)
        return BLOCK_ALIGNMENT * math.ceil(needed / BLOCK_ALIGNMENT)

    @property
    def page_bytes(self) -> int:
        """One page: an attention block of one layer, or one DeltaNet layer's state padded to it."""
        return self.block_tokens * self.attention_bytes_per_token

    def sequence_bytes(self, tokens: int) -> int:
        """Cache a sequence of ``tokens`` tokens takes."""
        pages = self.attention_layers * math.ceil(tokens / self.block_tokens) + self.delta_net_layers
        return pages * self.page_bytes


def recurrent_state_bytes(model_bytes: int, ssm_cache_dtype: str, avx512_bf16: bool) -> int:
    """Bytes per element of the DeltaNet recurrent state in vLLM's CPU engine (0.32,
    ``CpuPlatform.check_and_update_config``): on a CPU with AVX-512 BF16 instructions its accelerated GDN path
    keeps the state in float32 unless ``--mamba-ssm-cache-dtype`` names a 16-bit type; elsewhere ``auto`` is the
    model's dtype."""
    if ssm_cache_dtype in DTYPE_BYTES:
        return DTYPE_BYTES[ssm_cache_dtype]
    return DTYPE_BYTES["float32"] if avx512_bf16 else model_bytes


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU has AVX-512 BF16 instructions, asked as vLLM's CPU platform asks (torch's private
    ``torch.cpu._is_avx512_bf16_supported``; tests/predictor/test_cpu_kv_cache.py pins it)."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported())


def kv_layout(model_dir: Path, dtype: str, kv_cache_dtype: str, ssm_cache_dtype: str = "auto") -> KvLayout:
    """The cache layout of the release's text model for the engine's ``dtype``, ``kv_cache_dtype`` and
    ``mamba_ssm_cache_dtype`` on this CPU."""
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config", config)
    model_bytes = DTYPE_BYTES.get(dtype, DTYPE_BYTES.get(str(text.get("dtype", "bfloat16")), 2))
    state_bytes = recurrent_state_bytes(model_bytes, ssm_cache_dtype, cpu_has_avx512_bf16())
    kv_bytes = 1 if kv_cache_dtype.startswith("fp8") else model_bytes
    layer_types = text["layer_types"]
    conv_channels = (
        text["linear_key_head_dim"] * text["linear_num_key_heads"] * 2
        + text["linear_value_head_dim"] * text["linear_num_value_heads"]
    )
    recurrent = text["linear_num_value_heads"] * text["linear_key_head_dim"] * text["linear_value_head_dim"]
    return KvLayout(
        attention_layers=layer_types.count("full_attention"),
        delta_net_layers=layer_types.count("linear_attention"),
        attention_bytes_per_token=2 * text["num_key_value_heads"] * text["head_dim"] * kv_bytes,
        delta_net_state_bytes=conv_channels * (text["linear_conv_kernel_dim"] - 1) * model_bytes
        + recurrent * state_bytes,
    )


def weights_bytes(model_dir: Path) -> int:
    """Bytes of the release's ``*.safetensors`` files (what loading the weights takes)."""
    return sum(path.stat().st_size for path in model_dir.rglob("*.safetensors"))


def default_kv_cache_bytes(
    layout: KvLayout,
    max_model_len: int,
    max_num_seqs: int,
    weights: int,
    engines: int = 1,
    available: int | None = None,
) -> int:
    """KV cache bytes per engine: ``max_num_seqs`` prompts of ``max_model_len`` tokens, capped by
    :data:`KV_SHARE_OF_FREE` of the memory free after ``engines`` copies of the weights, at least one prompt
    of ``max_model_len`` tokens; either plus a page per layer (vLLM keeps one block unused). Raises
    :class:`InsufficientMemory`."""
    longest = layout.sequence_bytes(max_model_len)
    slack = (layout.attention_layers + layout.delta_net_layers) * layout.page_bytes
    smallest = longest + slack
    free = available_bytes() if available is None else available
    fits = int((free - engines * weights) * KV_SHARE_OF_FREE / engines)
    if smallest > fits:
        raise InsufficientMemory(
            f"vLLM's CPU engine needs {smallest / GIB:.2f} GiB of KV cache per engine for one prompt of "
            f"--max-model-len {max_model_len} tokens; {free / GIB:.1f} GiB are free, {engines} engine(s) of "
            f"{weights / GIB:.1f} GiB of weights leave {fits / GIB:.2f} GiB for it: lower --max-model-len or --dp, "
            "or size the cache with --kv-cache-memory-bytes"
        )
    return max(smallest, min(max_num_seqs * longest + slack, fits))
