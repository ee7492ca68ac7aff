#!/usr/bin/env bash
# The test command: install everything into .venv/ (PyPI only), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
