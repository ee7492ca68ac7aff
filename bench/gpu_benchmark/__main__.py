"""``python -m bench.gpu_benchmark``: see the package's docstring."""

import sys

from bench.gpu_benchmark.cli import main

sys.exit(main())
