#!/usr/bin/env bash
# The README's run command: start the demo predictor (the tiny RANDOM release, built once and cached),
# wait until it has warmed up, send one System One request, then keep serving until Ctrl-C.
#   PORT=8080 ENGINE=transformers bash scripts/demo.sh [more python -m predictor flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
port="${PORT:-8080}"
engine="${ENGINE:-transformers}"

.venv/bin/python -m predictor --engine "$engine" --http_port "$port" --enable_grpc false "$@" &
server=$!
stop() { kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
trap stop INT TERM

echo "waiting for the predictor to warm up on port $port ..."
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
  if ! kill -0 "$server" 2>/dev/null; then
    echo "the predictor exited before it was ready" >&2
    exit 1
  fi
  sleep 1
done

echo "POST /v1/systemone with scripts/demo_request.json:"
curl -s "http://127.0.0.1:$port/v1/systemone" -H 'content-type: application/json' -d @scripts/demo_request.json
echo
echo "serving on http://127.0.0.1:$port (the weights are RANDOM: answers carry no meaning); Ctrl-C stops it"
wait "$server"
