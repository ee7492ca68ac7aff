"""What the predictor container is, as the operator, the chart and the benchmarks see it.

Dependency-free (standard library only), so that the operator, the chart generator and the benchmark scripts
can all import it without pulling in each other or the model stack.
"""
