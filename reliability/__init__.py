"""Reliability checks against a running predictor on this machine: fuzz, soak, overload and lifecycle.

Each is a script (``python -m reliability.<name> --help``) that talks to loopback addresses only and is
bounded in requests and time; ``tests/predictor/test_reliability_scripts.py`` runs a short sample of each.
"""
