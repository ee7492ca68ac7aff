"""What ``python -m predictor`` spends before it builds anything: importing the predictor, then building its
parser and reading a command line, for ``--engine transformers`` (no vLLM) and the default engine (vLLM's
parser, which imports vLLM). Each case runs in a fresh interpreter; medians of ``--repeats`` runs.

    python -m bench.start_imports --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CASES = {"transformers": ["--engine", "transformers"], "vllm": ["--engine", "vllm"]}
PROBE = """
import json, sys, time
started = time.perf_counter()
from predictor import cli
imported = time.perf_counter()
argv = sys.argv[1:]
cli.build_parser(argv).parse_args(argv)
parsed = time.perf_counter()
print(json.dumps({"import_s": imported - started, "parser_s": parsed - imported, "vllm": "vllm" in sys.modules}))
"""


def measure(argv: list[str]) -> dict[str, float | bool]:
    """One fresh interpreter's import and parser seconds for the command line ``argv``."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True)
    result: dict[str, float | bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.start_imports", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters per case")
    args = parser.parse_args(argv)
    for name, case_argv in CASES.items():
        runs = [measure(case_argv) for _ in range(args.repeats)]
        imports = statistics.median(float(run["import_s"]) for run in runs)
        parsers = statistics.median(float(run["parser_s"]) for run in runs)
        vllm = all(run["vllm"] for run in runs)
        print(f"--engine {name:12} import predictor.cli {imports:.2f} s, parser {parsers:.2f} s, vLLM imported: {vllm}")


if __name__ == "__main__":
    main()
