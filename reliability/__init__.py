"""Reliability checks against a running predictor on this machine: fuzz, soak, overload and lifecycle.

Each is a script (``python -m reliability.<name> --help``) that talks to loopback addresses only and is
bounded in requests and time. Short samples: lifecycle's in ``tests/reliability/``, fuzz's, soak's and overload's
in ``tests/predictor/test_server_transformers.py`` (on that module's running server).
"""
