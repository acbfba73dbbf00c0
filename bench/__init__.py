"""Benchmarks: run against a memsvc started as a separate process, never in timed tests."""
