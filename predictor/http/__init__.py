"""The HTTP (and gRPC) surface: middleware, routes, API flags, server limits, and the one mapping of domain
errors to status codes (:mod:`predictor.http.errors`).

May import :mod:`predictor.core`, :mod:`predictor.engines` and :mod:`predictor.serving`; the entry points
(:mod:`predictor.cli`, :mod:`predictor.model`) sit above it.
"""
