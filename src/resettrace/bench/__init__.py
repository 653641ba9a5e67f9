"""Benchmarks: the collector breakdown (the main job) and the tracing overhead A/B."""
