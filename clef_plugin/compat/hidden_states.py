"""Each request's prompt hidden states from vLLM's ``AllPool``, whichever vLLM keeps the prefill's chunks."""

from __future__ import annotations

import torch

from clef_plugin.compat.cuda_probes import cuda_left_uninitialised

with cuda_left_uninitialised():
    from vllm.model_executor.layers.pooler import PoolingParamsUpdate
    from vllm.model_executor.layers.pooler.abstract import Pooler
    from vllm.model_executor.layers.pooler.tokwise.methods import AllPool
    from vllm.v1.pool.metadata import PoolingMetadata

__all__ = ["AllPool", "Pooler", "PoolingMetadata", "PoolingParamsUpdate", "finished_mask", "prompt_hidden_states"]


def finished_mask(pooling_metadata: PoolingMetadata) -> list[bool]:
    """Per scheduled request: True when this step completes its prompt."""
    cursor = pooling_metadata.get_pooling_cursor()
    if hasattr(cursor, "get_finished_mask"):  # vLLM >= 0.27
        return list(cursor.get_finished_mask())
    return cursor.is_finished().tolist()


def prompt_hidden_states(
    collector: AllPool, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
) -> list[torch.Tensor | None]:
    """Each request's full [prompt_len, hidden] states once its prefill is complete, else None.

    vLLM's ``AllPool`` keeps the chunks of a chunked prefill across steps. Before vLLM 0.27 it
    kept views into the step's output buffer, which the next step (a CUDA graph replay, for
    instance) may overwrite; there the step's states are copied first whenever a request is
    still mid-prefill.
    """
    owns_chunks = hasattr(collector, "clone_finished")
    if not owns_chunks and collector.enable_chunked_prefill and not all(finished_mask(pooling_metadata)):
        hidden_states = hidden_states.clone()
    return collector(hidden_states, pooling_metadata)
