"""Reference scorer on plain transformers: Qwen3.5 backbone + the joint schema head.

Text only unless ``vision`` is asked for: then the vision tower is kept and a prompt with images or videos runs
through the whole multimodal model (vision tower, then the language model), alone in its forward pass, as the
original release code runs it; without ``vision`` the tower is dropped at load.

This is the path Clef's own code takes. It runs on the CPU (tiny releases) and on a GPU in BF16,
and is the baseline the vLLM path must match and beat.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from clef_head.answers import build_response
from clef_head.checkpoint import load_head
from clef_head.encoder import DEFAULT_MAX_LENGTH, EncodedRequest, encode_request
from clef_head.media import EncodedMedia
from clef_head.request import SystemOneRequest


def _media_tensors(media: EncodedMedia) -> dict[str, torch.Tensor]:
    """The processors' tensors of a prompt's media, by the multimodal model's argument names."""
    tensors = {
        "pixel_values": media.pixel_values,
        "image_grid_thw": media.image_grid_thw,
        "pixel_values_videos": media.pixel_values_videos,
        "video_grid_thw": media.video_grid_thw,
    }
    return {name: tensor for name, tensor in tensors.items() if tensor is not None}


class TransformersScorer:
    """Scores encoded requests with a transformers backbone and our head, in padded batches."""

    def __init__(
        self,
        model_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        max_length: int = DEFAULT_MAX_LENGTH,
        max_batch_tokens: int = 16384,
        vision: bool = False,
    ) -> None:
        from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_length = max_length
        self.max_batch_tokens = max_batch_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        model = Qwen3_5ForConditionalGeneration.from_pretrained(
            self.model_dir, dtype=dtype, device_map={"": str(self.device)}
        )
        model.config.use_cache = False
        compressor = getattr(getattr(model, "hf_quantizer", None), "compressor", None)
        if compressor is not None and hasattr(model, "ct_decompress_hook"):
            # A compressed-tensors (FP8) release: its weights are decompressed by a hook on the full
            # model's forward, which this scorer bypasses (it calls the language model directly).
            # Decompress now; the Linear layers keep quantizing their inputs per token on the fly.
            compressor.decompress_model(model)
        self.multimodal = model.model.eval() if vision else None
        if not vision:
            del model.model.visual  # text and JSON only: the vision tower is never used
        self.backbone = model.model.language_model.eval()
        self.lm_head_weight = model.lm_head.weight.detach()
        self.head = load_head(self.model_dir, device=self.device, dtype=dtype)
        self.pad_token_id = int(self.tokenizer.pad_token_id)

    @property
    def pixel_dtype(self) -> torch.dtype | None:
        """The vision tower's dtype (it casts its pixels to it first); ``None`` without the tower."""
        return None if self.multimodal is None else self.multimodal.visual.dtype

    def encode(self, request: SystemOneRequest) -> EncodedRequest:
        """Prompt ids and layout of one request (state cut to ``max_length``)."""
        return encode_request(self.tokenizer, request, max_length=self.max_length)

    @torch.inference_mode()
    def hidden_states(self, batch: Sequence[EncodedRequest]) -> list[torch.Tensor]:
        """Final hidden states [L_i, hidden] of each prompt, from one right-padded forward pass (a prompt with
        images: alone, through the vision tower too)."""
        if any(item.media is not None for item in batch):
            if len(batch) != 1:
                raise ValueError("a prompt with images is scored alone")
            return [self._with_images(batch[0])]
        longest = max(len(item.input_ids) for item in batch)
        input_ids = torch.full((len(batch), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, item in enumerate(batch):
            input_ids[row, : len(item.input_ids)] = torch.tensor(item.input_ids)
            attention_mask[row, : len(item.input_ids)] = 1
        output = self.backbone(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            use_cache=False,
            return_dict=True,
        )
        return [output.last_hidden_state[row, : len(item.input_ids)] for row, item in enumerate(batch)]

    def _with_images(self, item: EncodedRequest) -> torch.Tensor:
        media = item.media
        if media is None or self.multimodal is None:
            raise ValueError("this scorer was loaded without its vision tower (vision=False)")
        length = len(item.input_ids)
        token_types = torch.zeros((1, length), dtype=torch.long)
        start = item.media_offset
        token_types[0, start : start + len(media.token_type_ids)] = torch.tensor(media.token_type_ids)
        output = self.multimodal(
            input_ids=torch.tensor([item.input_ids], device=self.device),
            attention_mask=torch.ones((1, length), dtype=torch.long, device=self.device),
            **{name: tensor.to(self.device) for name, tensor in _media_tensors(media).items()},
            mm_token_type_ids=token_types.to(self.device),
            use_cache=False,
            return_dict=True,
        )
        return output.last_hidden_state[0]

    @torch.inference_mode()
    def score(self, encoded: Sequence[EncodedRequest]) -> list[torch.Tensor]:
        """Flat option logits per request; prompts are grouped by length into token-bounded batches (a prompt
        with images is a batch of its own)."""
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].input_ids))
        results: list[Any] = [None] * len(encoded)
        start = 0
        while start < len(order):
            end = start + 1
            while (
                end < len(order)
                and encoded[order[start]].media is None
                and encoded[order[end]].media is None
                and len(encoded[order[end]].input_ids) * (end - start + 1) <= self.max_batch_tokens
            ):
                end += 1
            batch = [encoded[i] for i in order[start:end]]
            hidden = self.hidden_states(batch)
            logits = self.head(
                hidden,
                [torch.tensor(item.input_ids, device=self.device) for item in batch],
                [item.layout for item in batch],
                self.lm_head_weight,
            )
            for i, value in zip(order[start:end], logits, strict=True):
                results[i] = value.float().cpu()
            start = end
        return results

    def answer(self, requests: Sequence[SystemOneRequest]) -> list[dict[str, Any]]:
        """System One responses for validated requests."""
        encoded = [self.encode(request) for request in requests]
        logits = self.score(encoded)
        return [
            build_response(request, item.layout, value, len(item.input_ids))
            for request, item, value in zip(requests, encoded, logits, strict=True)
        ]
