"""Evaluating stored runs: NeMo Gym's `gym eval` (profile, aggregate metrics, compare) and gymweb's own
analyses (run aggregates, agent conformance check)."""
