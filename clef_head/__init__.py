"""Model-side core of Clef-flash serving: requests, prompt encoding, the joint schema head, answers.

Nothing here serves HTTP or depends on vLLM; the plugin, the predictor and the benchmarks build on it.
"""

from clef_head.answers import answer_question, build_response
from clef_head.checkpoint import CheckpointError, HeadFiles, find_head_files, load_head
from clef_head.encoder import EncodedRequest, SchemaTooLong, encode_request, question_options
from clef_head.head import HeadConfig, JointSchemaHead
from clef_head.layout import LayoutError, QuestionLayout, RecordLayout
from clef_head.request import DEFAULT_LIMITS, InvalidRequest, RequestLimits, SystemOneRequest, parse_request

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
