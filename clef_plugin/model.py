"""Qwen3.5 + Clef's joint schema head as a vLLM pooling model.

The backbone is vLLM's own Qwen3.5 (hybrid Gated DeltaNet + full attention; BF16, or FP8 W8A8
through vLLM's compressed-tensors support), with the vision tower left out unless the engine
runs with ``language_model_only=False`` (``engine_kwargs(vision=True)``); images then arrive as
the release processor's pixels (:func:`~clef_plugin.compat.processed_images.register_processed_images`). The head
comes from the release via :func:`clef_head.load_head` (either release layout), never through vLLM's
weight loader. ``lm_head`` stays unquantized: the head reads its rows as lexical embeddings of
the option tokens.

Tensor parallelism: vLLM shards ``lm_head`` by vocabulary rows. The head looks up arbitrary
token ids, so after loading, each rank all-gathers the shards once (vLLM's
``tensor_model_parallel_all_gather``) into a full [vocab, hidden] copy it keeps for the head;
this costs ``vocab × hidden`` extra elements per rank (about 2 GiB in BF16 for Qwen3.5-9B). With
one rank the shard is the full table and nothing is copied. Pipeline parallelism is refused.

CUDA graphs: unless the engine runs eagerly (``enforce_eager``), a step that completes one request on
a GPU runs the head as a CUDA graph captured for that request's bucketed shape
(:class:`clef_head.graphs.GraphedHead`); steps completing several requests run the batched forward.
Every bucket's graph is captured right after loading, so no request pays for a capture. A step that runs one to
a few prompts replays a CUDA graph of the whole backbone instead of vLLM's piecewise graphs
(:mod:`clef_plugin.prompt_graphs`, which says when; ``additional_config={"clef_prompt_graphs": false}`` turns them
off).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_gather
from vllm.model_executor.models.interfaces_base import VllmModelForPooling
from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration
from vllm.sequence import IntermediateTensors

from clef_head.checkpoint import HEAD_CONFIG_FILE, HEAD_SUBFOLDER, HEAD_WEIGHTS_FILE, find_head_files, load_head
from clef_head.graphs import GraphedHead
from clef_plugin.compat.cpu_fp8 import row_wise_fp8_on_cpu
from clef_plugin.compat.processed_images import register_processed_images
from clef_plugin.compat.router_gemm import skip_router_gemm_warmup
from clef_plugin.pooler import JointSchemaPooler

logger = logging.getLogger(__name__)

HEAD_PREFIX = "joint_head."
"""Checkpoint names under this prefix belong to the head, never to the backbone."""
UNQUANTIZED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def release_dir(model: str, revision: str | None) -> Path:
    """The release folder: ``model`` itself, or the Hub snapshot holding its head files."""
    path = Path(model)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    names = (HEAD_CONFIG_FILE, HEAD_WEIGHTS_FILE)
    patterns = [*names, *(f"{HEAD_SUBFOLDER}/{name}" for name in names)]
    return Path(snapshot_download(model, revision=revision, allow_patterns=patterns))


def head_weight_names(model_dir: Path) -> set[str]:
    """Tensor names stored in the release's head file."""
    with safe_open(str(find_head_files(model_dir).weights), framework="pt") as handle:
        return set(handle.keys())


class ClefQwen3_5ForJointSchema(Qwen3_5ForConditionalGeneration, VllmModelForPooling):
    """vLLM pooling model: one logit per option of every question of each request."""

    is_pooling_model = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "model") -> None:
        """Build the backbone (language model only) and an empty pooler; the head loads with the weights."""
        if vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise ValueError("Clef does not support pipeline parallelism; use tensor parallelism")
        row_wise_fp8_on_cpu()  # before the layers choose their FP8 kernels
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        model_config = vllm_config.model_config
        self.release_dir = release_dir(model_config.model, model_config.revision)
        self.head_dtype = model_config.dtype
        self.head_graphs = not model_config.enforce_eager
        self.vocab_size = int(self.config.get_text_config().vocab_size)
        self._gathered_lm_head: torch.Tensor | None = None  # tensor parallelism only
        self.pooler = JointSchemaPooler(self.lexical_table)
        skip_router_gemm_warmup(self)  # a dense backbone: no MoE router to warm up GEMMs for
        # imported here, in the engine's process: it imports vLLM's attention backends, which the front end never needs
        from clef_plugin.prompt_graphs import whole_forward_graphs

        self.prompt_graphs = whole_forward_graphs(vllm_config, self.backbone)

    def backbone(self, inputs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """vLLM's Qwen3.5 forward on token ids [N] or input embeddings [N, hidden]: the final hidden states."""
        if inputs.is_floating_point():
            hidden_states = super().forward(None, positions, inputs_embeds=inputs)
        else:
            hidden_states = super().forward(inputs, positions)
        assert isinstance(hidden_states, torch.Tensor)
        return hidden_states

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor | IntermediateTensors:
        """A step of a few prompts (token ids, or a vision engine's input embeddings) replays a whole-forward graph;
        any other runs vLLM's forward."""
        if self.prompt_graphs is not None and not kwargs:
            inputs = input_ids if inputs_embeds is None else inputs_embeds
            hidden_states = self.prompt_graphs.forward(inputs, positions)
            if hidden_states is not None:
                return hidden_states
        return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)

    def lexical_table(self) -> torch.Tensor:
        """The full, unquantized [vocab, hidden] lm_head weight the head gathers option rows from."""
        if self._gathered_lm_head is not None:
            return self._gathered_lm_head
        return self.language_model.lm_head.weight[: self.vocab_size]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load the backbone through vLLM, then the head from the release.

        vLLM reads every ``*.safetensors`` at a local release's root, ``joint_head.safetensors``
        included; those tensors (and any ``joint_head.*`` names) are dropped here, before vLLM's
        loader could try to place them in the backbone.
        """
        head_names = head_weight_names(self.release_dir)
        backbone = (
            (name, tensor) for name, tensor in weights if not name.startswith(HEAD_PREFIX) and name not in head_names
        )
        loaded = super().load_weights(backbone)
        lm_head = self.language_model.lm_head.weight
        if lm_head.dtype not in UNQUANTIZED_DTYPES:
            raise ValueError(
                f"lm_head is quantized ({lm_head.dtype}); Clef's head needs it unquantized: "
                "list 'lm_head' in the quantization config's ignore list"
            )
        if get_tensor_model_parallel_world_size() > 1:
            self._gathered_lm_head = tensor_model_parallel_all_gather(lm_head.data, dim=0)[: self.vocab_size]
        head = load_head(self.release_dir, device=lm_head.device, dtype=self.head_dtype)
        if head.config.hidden_size != lm_head.shape[1]:
            raise ValueError(
                f"the head expects hidden size {head.config.hidden_size}, the backbone has {lm_head.shape[1]}"
            )
        if self.head_graphs and lm_head.device.type == "cuda":
            self.pooler.head = graphed = GraphedHead(head)
            started = time.perf_counter()
            count = graphed.warm_up(head.config.hidden_size, self.lexical_table())
            logger.info("captured the head's %d CUDA graphs in %.2f s", count, time.perf_counter() - started)
        else:
            self.pooler.head = head
        return loaded | {name for name, _ in head.named_parameters(prefix="pooler.head")}


register_processed_images(ClefQwen3_5ForJointSchema)
