"""KServe predictor for Clef-flash: System One over KServe's ModelServer, with vLLM or transformers engines.

Layers, each importing only those below it (``tests/packaging/test_import_boundaries.py``): :mod:`predictor.core`
← :mod:`predictor.engines` ← :mod:`predictor.serving` ← :mod:`predictor.http` ← the entry points in this folder
(:mod:`predictor.cli`, :mod:`predictor.systemone_cli`, :mod:`predictor.demo`, :mod:`predictor.model`).
"""
