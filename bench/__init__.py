"""Benchmarks: each module prints its figures; ``python -m bench`` runs them all and writes
docs/BENCHMARKS.md."""
