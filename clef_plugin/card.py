"""The FP8 model card's layout format, so that its clients run against this plugin unchanged.

The card's clients send a request's layout as ``PoolingParams.extra_kwargs["clef_questions"]``: a
list with one ``[type_id, [question_start, question_end], [[option_start, option_end], ...]]`` per
question, in prompt order (type ids as in :data:`clef_head.layout.QUESTION_TYPE_IDS`). It carries no
question or option ids: the engine only needs spans, and the caller maps the flat logits back to its
own questions. Importing this module imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

from clef_head.encoder import EncodedRequest
from clef_head.layout import LayoutError, RecordLayout


def schema_layout(encoded: Any) -> list[list[Any]]:
    """The card's layout list of one encoded prompt.

    ``encoded`` is a :class:`clef_head.EncodedRequest` (our encoder) or an ``EncodedRecord`` of the
    original release code's ``encode_record`` (questions with ``question_type``, ``question_span``
    and ``option_spans``).
    """
    if isinstance(encoded, EncodedRequest):
        questions = [(q.type_id, q.question_span, q.option_spans) for q in encoded.layout.questions]
    else:
        questions = [(q.question_type, q.question_span, q.option_spans) for q in encoded.questions]
    return [[int(type_id), list(span), [list(option) for option in options]] for type_id, span, options in questions]


def layout_from_questions(data: Any, prompt_length: int | None = None) -> RecordLayout:
    """A :class:`RecordLayout` from the card's layout list, checked like ours (types, spans, prompt length).

    Questions get ids ``"0"``, ``"1"``, ... and options ``"0"``, ``"1"``, ... in list order.
    """
    if not isinstance(data, list) or not data:
        raise LayoutError("clef_questions must be a non-empty list of [type, [start, end], [[start, end], ...]]")
    questions = []
    for index, item in enumerate(data):
        if not isinstance(item, (list, tuple)) or len(item) != 3 or not isinstance(item[2], (list, tuple)):
            raise LayoutError(f"clef_questions[{index}] must be [type, [start, end], [[start, end], ...]]")
        type_id, span, options = item
        questions.append(
            {
                "id": str(index),
                "type": type_id,
                "span": span,
                "option_spans": list(options),
                "option_ids": [str(option) for option in range(len(options))],
            }
        )
    return RecordLayout.from_wire({"questions": questions}, prompt_length)
