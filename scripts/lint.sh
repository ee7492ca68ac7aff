#!/usr/bin/env bash
# The lint, format and type gate, run before the tests: ruff's format check and lint over the whole tree, then
# mypy on the packages (the files, rules and per-library settings are in pyproject.toml). Any finding fails it.
# To fix what ruff can fix by itself: .venv/bin/ruff check --fix . && .venv/bin/ruff format .
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
"$bin/ruff" format --check .
"$bin/ruff" check .
"$bin/mypy"
