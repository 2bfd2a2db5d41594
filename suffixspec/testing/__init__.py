"""What the tests and the benchmarks share: crafted and fuzzed snapshot
segments and the pool's child scripts (the fault tests, ``bench/fault_bench.py``),
and what vLLM's modules bind (the plugin's no-rebinding tests).

Nothing here is imported by the serving path.
"""
