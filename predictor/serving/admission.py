"""The measured service rate admission sheds by: prompt tokens the engine answers per second of busy time.

A record is busy from its encoding to its answer (``SystemOneService.holding``); the server is busy while any
record is. Over the last
``window_s`` busy seconds, the rate is the prompt tokens answered divided by the busy seconds: idle time does not
dilute it, and a burst of answers from one batch is averaged with the wait that came before it. Tokens, not
records: a 16,384-token prompt holds the engine about as long as 160 prompts of 100 tokens, so the wait ahead of a
request is the tokens ahead of it at this rate, whatever the mix of lengths.

Until ``min_busy_s`` busy seconds are seen, the rate is the start value (the warm-up's measured throughput:
:func:`predictor.serving.warmup.run_warmup`), or unknown without one (admission then uses the queue length alone).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 30.0
MIN_BUSY_S = 1.0


class ServiceRate:
    """Prompt tokens answered per busy second, over a sliding window of busy time."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        min_busy_s: float = MIN_BUSY_S,
        clock: Callable[[], float] = time.monotonic,
        start_per_second: float | None = None,
    ) -> None:
        self.window_s = window_s
        self.min_busy_s = min_busy_s
        self.start_per_second = start_per_second
        self._clock = clock
        self._in_flight = 0
        self._busy_total = 0.0
        self._busy_since = 0.0
        self._tokens_total = 0
        # (busy seconds so far, tokens answered so far) at each answer, oldest first.
        self._samples: deque[tuple[float, int]] = deque([(0.0, 0)])

    def _busy_now(self) -> float:
        if self._in_flight:
            return self._busy_total + self._clock() - self._busy_since
        return self._busy_total

    def enter(self, records: int) -> None:
        """``records`` were admitted."""
        if not self._in_flight:
            self._busy_since = self._clock()
        self._in_flight += records

    def leave(self, records: int) -> None:
        """``records`` left (answered or not)."""
        if self._in_flight and self._in_flight <= records:
            self._busy_total += self._clock() - self._busy_since
        self._in_flight = max(0, self._in_flight - records)

    def answered(self, tokens: int) -> None:
        """A record of ``tokens`` prompt tokens was answered by the engine."""
        self._tokens_total += tokens
        busy = self._busy_now()
        self._samples.append((busy, self._tokens_total))
        while len(self._samples) > 2 and busy - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def per_second(self) -> float | None:
        """Prompt tokens answered per busy second: measured once ``min_busy_s`` busy seconds are seen, the start
        value before (None: unknown)."""
        busy, tokens = self._samples[-1]
        first_busy, first_tokens = self._samples[0]
        if busy - first_busy < self.min_busy_s or tokens == first_tokens:
            return self.start_per_second
        return (tokens - first_tokens) / (busy - first_busy)

    def expected_wait_s(self, tokens_ahead: float) -> float | None:
        """Seconds until ``tokens_ahead`` prompt tokens now admitted are answered, at the rate (None: unknown)."""
        rate = self.per_second()
        return None if rate is None else tokens_ahead / rate


def retry_after_s(expected_wait_s: float, max_wait_s: float) -> int:
    """Whole seconds until the expected wait is back under the bound (at least 1)."""
    return max(1, math.ceil(expected_wait_s - max_wait_s))
