"""The answering pipeline: admit, read and validate, encode (in process or in encode workers), score, cache.

Raises domain errors (:mod:`predictor.core.errors`) and knows no HTTP; may import :mod:`predictor.core` and
:mod:`predictor.engines`.
"""
