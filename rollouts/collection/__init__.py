"""Collecting: datasets, runs, the per-process dispatcher, imports and NeMo Gym's output files."""
