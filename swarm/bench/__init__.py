"""Benchmarks with printed figures (performance targets live here, not in timed tests)."""
