#!/usr/bin/env bash
# The test command: install everything into .venv/ (PyPI only), run the lint, format and type gate
# (scripts/lint.sh; a finding fails the command before any test runs), build the real cluster's binaries once
# (Go module proxy; cached outside the repository, see clef_cluster/), then run the whole test suite on three
# pytest-xdist workers, one more than a 2-core machine has cores: waiting tests (the real cluster, servers
# starting) leave a core idle on two, and tests that share a server or engine share a worker
# (tests/worker_groups.py). `-n 0` runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/lint.sh
bash scripts/install_container_tools.sh  # the images' and the real node's Debian packages (apt-get as root when missing)
.venv/bin/python -m clef_cluster build --keda  # with prometheus-adapter and KEDA (the autoscaling tests'), before
# the tests and their per-test timeout: KEDA's first build takes about 1,000 s of CPU; a no-op once built
# Keep the bytecode of the repository's own modules and of pytest's rewritten test modules in their (git-ignored)
# __pycache__/ folders: with PYTHONDONTWRITEBYTECODE set, as some machines set it, every worker and every server the
# tests start would compile them again.
unset PYTHONDONTWRITEBYTECODE
exec .venv/bin/python -m pytest -n 3 --dist loadscope --no-loadscope-reorder "$@"
