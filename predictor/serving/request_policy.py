"""What the server accepts beyond the request model's own rules: which model names it answers to and
what it does with a state longer than the prompt can hold."""

from __future__ import annotations

from dataclasses import dataclass

from clef_head.encoder import StateOverflow


@dataclass(frozen=True)
class RequestPolicy:
    """``aliases``: other names served as the same model (``--model-alias``); ``accept_any_name``: answer
    whatever model name a request gives (``--accept-any-model-name``); ``state_overflow``: ``truncate``
    an over-long state (the original release code's behaviour) or ``refuse`` it with a 413."""

    aliases: tuple[str, ...] = ()
    accept_any_name: bool = False
    state_overflow: StateOverflow = "truncate"

    def serves(self, served_name: str, requested: str) -> bool:
        """Whether a request for ``requested`` is answered by the model served as ``served_name``."""
        return self.accept_any_name or requested == served_name or requested in self.aliases


#: The policy when none is given: the served name only, over-long states cut.
DEFAULT_POLICY = RequestPolicy()
