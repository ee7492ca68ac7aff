"""The pooler: whole-prompt hidden states → the joint schema head → one logit per option.

vLLM's ``AllPool`` gathers each request's final hidden states over its whole prompt (chunked
prefill included). Every request whose prompt completes in a step goes through the head in one
batched forward pass, with the layout carried in its ``PoolingParams.extra_kwargs``.

A request whose layout is missing or malformed must not take the engine down (an exception in
the pooler kills vLLM's engine core). Such a request gets an *error record* instead of logits:
a 1-D ``uint8`` tensor holding the UTF-8 error message, which :func:`clef_plugin.option_logits`
turns into a :class:`clef_head.LayoutError` on the caller's side. Layouts are also validated
before submission (:func:`clef_plugin.pooling_params`), so this is the last line of defence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Set
from typing import Any

import torch

from clef_head.graphs import GraphedHead
from clef_head.head import JointSchemaHead
from clef_head.layout import LayoutError, RecordLayout
from clef_plugin.card import layout_from_questions
from clef_plugin.compat.hidden_states import AllPool, Pooler, PoolingMetadata, PoolingParamsUpdate, prompt_hidden_states
from clef_plugin.names import CARD_LAYOUT_KEY, LAYOUT_KEY, POOLING_TASK

logger = logging.getLogger(__name__)

ERROR_DTYPE = torch.uint8
"""dtype of an error record (logits are always floating point)."""


def error_record(message: str, device: torch.device) -> torch.Tensor:
    """An error record: ``message`` as UTF-8 bytes in a 1-D uint8 tensor."""
    return torch.tensor(list(message.encode("utf-8")), dtype=ERROR_DTYPE, device=device)


def read_error_record(output: torch.Tensor) -> str | None:
    """The message of an error record, or None when ``output`` holds logits."""
    if output.dtype != ERROR_DTYPE:
        return None
    return bytes(output.cpu().tolist()).decode("utf-8", errors="replace")


def request_layout(extra_kwargs: dict[str, Any] | None, prompt_length: int) -> RecordLayout:
    """The layout a request carries under :data:`LAYOUT_KEY` (ours) or :data:`CARD_LAYOUT_KEY` (the
    FP8 model card's format), checked against its prompt length."""
    if extra_kwargs and LAYOUT_KEY in extra_kwargs:
        return RecordLayout.from_wire(extra_kwargs[LAYOUT_KEY], prompt_length)
    if extra_kwargs and CARD_LAYOUT_KEY in extra_kwargs:
        return layout_from_questions(extra_kwargs[CARD_LAYOUT_KEY], prompt_length)
    raise LayoutError(
        f"the request has no layout: PoolingParams.extra_kwargs has neither {LAYOUT_KEY!r} nor {CARD_LAYOUT_KEY!r}"
    )


class JointSchemaPooler(Pooler):
    """Per-token pooling task whose output is each request's flat option-logit vector."""

    def __init__(self, lexical_table: Callable[[], torch.Tensor]) -> None:
        """``lexical_table()`` returns the full [vocab, hidden] lm_head weight (built after loading)."""
        super().__init__()
        self.collector = AllPool()
        self.lexical_table = lexical_table
        self.head: JointSchemaHead | GraphedHead | None = None  # set by the model once the release is loaded

    def get_supported_tasks(self) -> Set[str]:
        """Only the per-token embedding task: the head needs every prompt token."""
        return {POOLING_TASK}

    def get_pooling_updates(self, task: str) -> PoolingParamsUpdate:
        """The head reads the prompt's token ids (lexical option embeddings)."""
        return PoolingParamsUpdate(requires_token_ids=True)

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> list[torch.Tensor | None]:
        """Option logits (or an error record) per finished request, None for unfinished ones."""
        if self.head is None:
            raise RuntimeError("the joint schema head is not loaded yet")
        prompts = prompt_hidden_states(self.collector, hidden_states, pooling_metadata)
        outputs: list[torch.Tensor | None] = [None] * len(prompts)
        ready = [(index, states) for index, states in enumerate(prompts) if states is not None]
        if not ready:
            return outputs
        token_ids = pooling_metadata.get_prompt_token_ids_cpu()  # the head moves them to its device
        batch: list[tuple[int, torch.Tensor, RecordLayout]] = []
        for index, states in ready:
            params = pooling_metadata.pooling_params[index]
            try:
                layout = request_layout(params.extra_kwargs, len(states))
            except LayoutError as exc:
                if params.extra_kwargs:  # a missing layout is normal in vLLM's start-up dummy runs
                    logger.warning("rejected a request's layout: %s", exc)
                outputs[index] = error_record(str(exc), hidden_states.device)
                continue
            batch.append((index, states, layout))
        if batch:
            logits = self.head(
                [states for _, states, _ in batch],
                [token_ids[index] for index, _, _ in batch],
                [layout for _, _, layout in batch],
                self.lexical_table(),
            )
            for (index, _, _), values in zip(batch, logits, strict=True):
                outputs[index] = values.float()
        return outputs
