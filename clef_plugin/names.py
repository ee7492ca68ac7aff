"""Names other components use to reach the plugin; importing this module imports nothing heavy."""

ARCHITECTURE: str = "ClefQwen3_5ForJointSchema"
"""Architecture name the plugin registers with vLLM (select it with ``hf_overrides``)."""

MODEL_CLASS: str = "clef_plugin.model:ClefQwen3_5ForJointSchema"
"""Lazy ``module:Class`` reference: the model module is imported only by processes that build it."""

POOLING_TASK: str = "token_embed"
"""vLLM's per-token pooling task (same name in vLLM 0.26 and 0.32); the engine serves only this one."""

LAYOUT_KEY: str = "clef_layout"
"""Key of a request's wire layout inside ``PoolingParams.extra_kwargs``."""

CARD_ARCHITECTURE: str = "ClefFlashForDecision"
"""Architecture name of the FP8 model card's plugin: registered too, for the same model class, so that
``hf_overrides={"architectures": ["ClefFlashForDecision"]}`` (or a release whose config names it) works."""

CARD_LAYOUT_KEY: str = "clef_questions"
"""Key under which the FP8 model card's clients put a request's layout (:mod:`clef_plugin.card` format)."""
