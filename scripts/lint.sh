#!/usr/bin/env bash
# The lint, format and type gate, run before the tests: ruff's format check and lint over the whole tree, then
# mypy on the packages (the files, rules and per-library settings are in pyproject.toml). All three run; any
# finding fails the gate. To fix what ruff can fix by itself: .venv/bin/ruff check --fix . && .venv/bin/ruff format .
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
status=0
"$bin/ruff" format --check . || status=1
"$bin/ruff" check . || status=1
"$bin/mypy" || status=1
exit "$status"
