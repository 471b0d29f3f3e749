"""Benchmarks: each prints a ratio of two things measured side by side in one run on the same data."""
