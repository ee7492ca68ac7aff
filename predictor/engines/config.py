"""Which engine serves a release and how, as one frozen value (built from the command line by
:func:`predictor.config.config_from_args`, or directly by a test or a tool)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

ENGINE_CHOICES = ("auto", "vllm", "transformers")
DEFAULT_MAX_MODEL_LEN = 16384
SHARED_VLLM_FIELDS = ("data_parallel_size", "max_model_len", "dtype")
"""vLLM's engine arguments that the transformers engine reads too: fields of their own, never in ``vllm_flags``."""


@dataclass(frozen=True)
class EngineConfig:
    """The engine for the release in ``release_dir``: ``kind`` is one of :data:`ENGINE_CHOICES` (``auto``:
    :func:`predictor.engines.choose_engine` decides); ``data_parallel_size`` engines, prompts up to
    ``max_model_len`` tokens, weights in ``dtype`` (vLLM's names; ``auto``: the engine's choice). The transformers
    engine runs up to ``max_batch`` records per forward pass, waiting ``batch_wait_s`` to fill one; ``vision``: the
    engine loads the vision tower and runs it for requests with images (either engine).
    ``vllm_flags``: vLLM's own engine arguments (``AsyncEngineArgs`` field names) that differ from vLLM's defaults,
    besides the three above; the vLLM engine builds its arguments from them
    (:func:`predictor.engines.engine_args.vllm_engine_args`)."""

    release_dir: Path
    kind: str = "auto"
    data_parallel_size: int = 1
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    dtype: str = "auto"
    max_batch: int = 32
    batch_wait_s: float = 0.005
    vision: bool = False
    vllm_flags: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ENGINE_CHOICES:
            raise ValueError(f"engine must be one of {', '.join(ENGINE_CHOICES)}, got {self.kind!r}")
        shared = sorted(set(self.vllm_flags) & set(SHARED_VLLM_FIELDS))
        if shared:
            raise ValueError(f"{shared} are fields of EngineConfig itself, not vllm_flags")
        object.__setattr__(self, "vllm_flags", MappingProxyType(dict(self.vllm_flags)))
