"""The HTTP (and gRPC) surface: the server (:mod:`predictor.http.server`), its assembly (:mod:`predictor.http.app`),
the API flags (:mod:`predictor.http.api_args`), middleware, routes, and the one mapping of domain errors to status
codes (:mod:`predictor.http.errors`).

May import :mod:`predictor.core`, :mod:`predictor.engines` and :mod:`predictor.serving`; the entry points
(:mod:`predictor.cli`, :mod:`predictor.model`) sit above it.
"""
