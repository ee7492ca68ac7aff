"""Model-side core of Clef-flash serving: requests, prompt encoding, the joint schema head, answers.

Nothing here serves HTTP or depends on vLLM; the plugin, the predictor and the benchmarks build on it.
"""

from importlib import import_module
from typing import Any

#: Where each name exported here lives. Imported on first use, so that ``import clef_head.request`` (or the
#: encoder) does not import torch: a process that only validates and tokenizes stays small.
_EXPORTS = {
    "answer_question": "answers",
    "build_response": "answers",
    "CheckpointError": "checkpoint",
    "HeadFiles": "checkpoint",
    "find_head_files": "checkpoint",
    "load_head": "checkpoint",
    "EncodedRequest": "encoder",
    "SchemaTooLong": "encoder",
    "encode_request": "encoder",
    "question_options": "encoder",
    "HeadConfig": "head",
    "JointSchemaHead": "head",
    "LayoutError": "layout",
    "QuestionLayout": "layout",
    "RecordLayout": "layout",
    "DEFAULT_LIMITS": "request",
    "InvalidRequest": "request",
    "RequestLimits": "request",
    "SystemOneRequest": "request",
    "parse_request": "request",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_LIMITS",
    "CheckpointError",
    "EncodedRequest",
    "HeadConfig",
    "HeadFiles",
    "InvalidRequest",
    "JointSchemaHead",
    "LayoutError",
    "QuestionLayout",
    "RecordLayout",
    "RequestLimits",
    "SchemaTooLong",
    "SystemOneRequest",
    "answer_question",
    "build_response",
    "encode_request",
    "find_head_files",
    "load_head",
    "parse_request",
    "question_options",
]
