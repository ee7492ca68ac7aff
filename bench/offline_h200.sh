#!/usr/bin/env bash
# One offline measurement on an H200 machine without network, in one command (BENCHMARKS.md, round 5):
#   1. the vLLM 0.26 bundle's install line (unpacks into /tmp/site once) and the wheels in $WHEELS (what the bundle
#      lacks: bench/offline_wheels.sh fetches them);
#   2. the repository and operator installed into /tmp/site (no dependencies: the bundle holds them);
#   3. python3 -m bench.gpu_benchmark with the arguments given (work folder and caches under $WORK), with
#      vLLM's compilation passes logging at DEBUG (how many patterns each fusion pass replaced) and every other
#      vLLM logger at INFO, so the engine's own settings (Inductor's size asserts among them) stay as a user runs them;
#   4. the summary, every case's log and result (logs.tar.gz), and what each case log says of the fusion passes
#      (passes.txt: the pass_config and custom_ops vLLM resolved, the patterns replaced) in $OUT_DIR.
#
#   BUNDLE=.gpub WHEELS=.whl bash bench/offline_h200.sh --cases prepare,vllm-fp8-graphs --records 1400
#
# Bytecode: the machine sets PYTHONDONTWRITEBYTECODE; it is unset with a cache prefix of its own, so the first
# process writes the bytecode of what it imports and every later case process reads it (R19).
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${BUNDLE:-.gpub}
WHEELS=${WHEELS:-.whl}
WORK=${WORK:-/tmp/cb}
OUT_DIR=${OUT_DIR:-$WORK/out}
SITE=/tmp/site

line=$(bash "$BUNDLE/install.sh" "$SITE")
eval "$line"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . ./operator
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pyc

mkdir -p "$WORK" "$OUT_DIR"
cat >"$WORK/vllm-logging.json" <<'EOF'
{
  "version": 1,
  "disable_existing_loggers": false,
  "formatters": {"plain": {"format": "%(levelname)s %(asctime)s [%(name)s] %(message)s", "datefmt": "%m-%d %H:%M:%S"}},
  "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "plain", "level": "DEBUG",
                        "stream": "ext://sys.stdout"}},
  "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": false},
              "vllm.compilation.passes": {"level": "DEBUG"}}
}
EOF
export VLLM_LOGGING_CONFIG_PATH="$WORK/vllm-logging.json"

status=0
python3 -m bench.gpu_benchmark --work "$WORK" --cache-dir "$WORK/cache" --out "$OUT_DIR" "$@" || status=$?

for log in "$WORK"/case-*.log; do
    [ -f "$log" ] || continue
    echo "== $(basename "$log" .log)"
    grep -oE "Replaced [0-9]+ patterns|fusion pass matches: .*|Enabled custom fusions: .*|'custom_ops': \[[^]]*\]|'pass_config': \{[^}]*\}" \
        "$log" | sort | uniq -c || true
done >"$OUT_DIR/passes.txt"
(cd "$WORK" && tar -czf "$OUT_DIR/logs.tar.gz" case-*.log results) || true
exit "$status"
