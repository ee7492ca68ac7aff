"""The floor of the predictor: domain errors and the field paths they name, and the Prometheus metrics.

Imports nothing else of the predictor; every layer above may import it.
"""
