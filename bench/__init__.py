"""Benchmarks: each module prints its figures; ``python -m bench`` runs them all and writes
docs/BENCHMARKS.md."""

from rallypoint.cli import hide_hypothesis

# Benchmarks use no Hypothesis; keep kio from registering its strategies (seconds of CPU) in
# every benchmark process, as the broker does.
hide_hypothesis()
