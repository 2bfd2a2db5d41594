"""Cross-request pools: in memory (``memory``), or in an LMDB file
(``persistent`` over ``store``; ``gate`` coordinates file compaction between
processes)."""
