"""Release tooling: tiny and full-size random Clef releases, FP8 quantization, synthetic requests.

None of this runs while serving, except :func:`clef_tools.tiny.build_tiny_release`, which the predictor
calls (through ``predictor.demo``) to build its demo release once.
"""
