"""What one request has cost so far, carried by a context variable: the pipeline adds the prompt tokens it
scores, the HTTP layer's observer (:mod:`predictor.http.observe`) opens the record and reports it."""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """What is known about one request while it runs."""

    request_id: str
    route: str
    started: float = field(default_factory=time.perf_counter)
    input_tokens: int = 0
    records: int = 0


current_record: ContextVar[RequestRecord | None] = ContextVar("clef_request", default=None)


def record_tokens(tokens: int) -> None:
    """Add one scored record of ``tokens`` prompt tokens to the current request, if any."""
    record = current_record.get()
    if record is not None:
        record.input_tokens += tokens
        record.records += 1
