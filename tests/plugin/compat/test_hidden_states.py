"""Each request's prompt hidden states from vLLM's ``AllPool`` (clef_plugin.compat.hidden_states)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm


def test_vllm_cursor_says_which_requests_finish_their_prompt() -> None:
    from vllm.v1.pool.metadata import PoolingCursor

    assert hasattr(PoolingCursor, "get_finished_mask") or hasattr(PoolingCursor, "is_finished")


def _metadata(finished: list[bool]) -> Any:
    cursor = SimpleNamespace(get_finished_mask=lambda: finished)
    return SimpleNamespace(get_pooling_cursor=lambda: cursor)


class Collector:
    """``AllPool`` as vLLM before 0.27 built it: chunks kept as views, no ``clone_finished``."""

    enable_chunked_prefill = True

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def __call__(self, hidden_states: torch.Tensor, pooling_metadata: Any) -> list[torch.Tensor | None]:
        self.seen.append(hidden_states)
        return [hidden_states]


def test_a_step_with_a_request_mid_prefill_is_copied_before_the_collector_keeps_it() -> None:
    from clef_plugin.compat.hidden_states import finished_mask, prompt_hidden_states

    hidden = torch.ones(3, 2)
    collector = Collector()
    assert finished_mask(_metadata([True, False])) == [True, False]
    prompt_hidden_states(collector, hidden, _metadata([True, False]))
    assert collector.seen[-1] is not hidden and torch.equal(collector.seen[-1], hidden)
    prompt_hidden_states(collector, hidden, _metadata([True, True]))
    assert collector.seen[-1] is hidden


def test_a_collector_that_owns_its_chunks_gets_the_step_as_it_is() -> None:
    from clef_plugin.compat.hidden_states import prompt_hidden_states

    hidden = torch.ones(3, 2)
    collector = Collector()
    collector.clone_finished = False
    prompt_hidden_states(collector, hidden, _metadata([False]))
    assert collector.seen[-1] is hidden
