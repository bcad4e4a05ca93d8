"""Levels of the runtime's ``early`` kernel argument (plain Python: the runtime imports it
without the DSL): how much of a kernel's TMA producer may run before ``wait_prior_grids``
(``kernels/schedule.py``, ``produce_tiles``). Every other thread waits at the kernel's start.
"""

# nothing: the producer waits first, like every other thread
EARLY_NONE = 0
# the tables are immutable and were complete before any earlier kernel ran (host splits: the
# runtime copies them once, synchronously, and caches them): the producer finds its first tile
# (dependent table loads) before waiting and issues its first TMA load right after the wait.
# H200 A/B: 0.4-1.0 us per call (RHT amax dense 23.3 / 22.6 -> 22.2 / 22.5 us, 8 groups 35.1 ->
# 34.1 us; perf/NOTES.md attempt 58)
EARLY_TABLES = 1
# also x: a cast kernel launched right after the same call's amax pass over the same x loads its
# first ring of x before waiting (device splits too: their table kernel ran before the amax pass)
EARLY_X = 2
