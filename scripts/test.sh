#!/usr/bin/env bash
# The test command: install everything into .venv/ (PyPI only), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" VLLM_ENABLE_V1_MULTIPROCESSING=0
exec .venv/bin/python -m pytest "$@"
