"""Helpers the benchmarks in ``tools/bench/`` share (not benchmarks themselves)."""
