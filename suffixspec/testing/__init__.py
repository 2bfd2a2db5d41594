"""What the pool's fault tests and ``bench/fault_bench.py`` share: crafted and
fuzzed snapshot segments, and the scripts they run as child processes.

Nothing here is imported by the serving path.
"""
