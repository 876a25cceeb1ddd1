"""wrk, the closed-loop load generator (Debian's `wrk`), driven from Python: the benchmarks' load (scripts/bench)
and the warm-ups that pay a server's first requests before traffic (scripts/server/warmup.py)."""
