"""How the service serves, as one frozen value, and the one factory that builds the service from it.

The server (:class:`predictor.model.ClefModel`) and the load tool's in-process mode (``python -m bench.load
--direct``) both build their :class:`~predictor.serving.service.SystemOneService` with :func:`build_service`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clef_head.request import DEFAULT_LIMITS, RequestLimits
from predictor.engines.base import Engine
from predictor.serving.body_limits import DEFAULT_MAX_BATCH_ITEMS, DEFAULT_MAX_QUEUE_WAIT_S
from predictor.serving.encode_pool import DEFAULT_INLINE_ENCODE_MAX_BYTES, EncodePool, InProcessPreparer, Preparer
from predictor.serving.lifecycle import Lifecycle
from predictor.serving.prepare import VisionSettings
from predictor.serving.request_policy import RequestPolicy
from predictor.serving.service import ModelCard, SystemOneService


@dataclass(frozen=True)
class ServingOptions:
    """How the model serves: warm-up, admission bounds (records queued, expected wait in seconds), answer
    cache, reaction to engine death, ``encode_processes`` worker processes that prepare bodies with the
    tokenizer of ``release_dir`` (0: a thread of the serving process) but for lone bodies of at most
    ``inline_encode_max_bytes`` (:meth:`SystemOneService.prepares_in_process`), and the most System One requests one
    V1/V2 body may hold (``max_batch_items``, as the batch route); ``policy``: the names served and what an
    over-long state gets; ``vision``: images are read (``None``: text only, images refused)."""

    warmup_rounds: int = 1
    warmup_max_batch: int = 16
    max_queued: int | None = None
    answer_cache_bytes: int = 0
    exit_on_engine_death: bool = True
    encode_processes: int = 0
    release_dir: Path | None = None
    inline_encode_max_bytes: int = DEFAULT_INLINE_ENCODE_MAX_BYTES
    max_batch_items: int = DEFAULT_MAX_BATCH_ITEMS
    max_queue_wait_s: float = DEFAULT_MAX_QUEUE_WAIT_S
    policy: RequestPolicy = RequestPolicy()
    vision: VisionSettings | None = None

    def __post_init__(self) -> None:
        if self.encode_processes < 0:
            raise ValueError("encode_processes must be 0 or more")
        if self.encode_processes and self.release_dir is None:
            raise ValueError("encode worker processes need the release directory (its tokenizer)")

    def preparer(self, engine: Engine) -> Preparer:
        """Where bodies are prepared: encode worker processes, or a thread of this process."""
        if self.encode_processes and self.release_dir is not None:
            return EncodePool(self.release_dir, self.encode_processes, engine.tokenizer)
        return InProcessPreparer(engine.tokenizer)


#: The options when none are given (each field's default).
DEFAULT_OPTIONS = ServingOptions()


def build_service(
    engine: Engine,
    card: ModelCard,
    lifecycle: Lifecycle,
    options: ServingOptions,
    limits: RequestLimits = DEFAULT_LIMITS,
    on_engine_failure: Callable[[], None] = lambda: None,
) -> SystemOneService:
    """The System One service over ``engine`` as ``options`` say (its preparer started here)."""
    return SystemOneService(
        engine,
        card,
        lifecycle,
        limits,
        max_queued=options.max_queued,
        answer_cache_bytes=options.answer_cache_bytes,
        on_engine_failure=on_engine_failure,
        preparer=options.preparer(engine),
        max_wait_s=options.max_queue_wait_s,
        policy=options.policy,
        vision=options.vision,
        inline_encode_max_bytes=options.inline_encode_max_bytes,
    )
