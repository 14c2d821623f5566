"""NeMo Gym's ``metrics_config.is_primary_metric``: which metric names are point estimates (compared
by ``gym eval compare``, summarised across repeats by ``gym eval profile``) and which are statistics of
one (``std/``, ``*/p25``, ``*_across_repeats/``...). No Django."""

from __future__ import annotations

from typing import Any

from rollouts.nemo.keys import ATTEMPT_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = ["is_primary_metric"]

_STAT_NAMES = ("max", "min", "median", "std", "sem", "se", "p25", "p75", "ci_low_95", "ci_high_95", "histogram")
_EXCLUDED_PREFIXES = tuple(f"{s}/" for s in _STAT_NAMES)
_EXCLUDED_SUFFIXES = (
    "/max",
    "/min",
    "/median",
    "/p5",
    "/p25",
    "/p75",
    "/p95",
    "/ci_low_95",
    "/ci_high_95",
    "/ci_lower",
    "/ci_upper",
    "_ci_lower",
    "_ci_upper",
    "_ci95_lower",
    "_ci95_upper",
    f"/{ATTEMPT_INDEX_KEY_NAME}",
    "/std_dev_across_runs",
    "/std_err_across_runs",
    "/avg_sample_std_dev",
)
_EXCLUDED_NAMES = (
    TASK_INDEX_KEY_NAME,
    ROLLOUT_INDEX_KEY_NAME,
    ATTEMPT_INDEX_KEY_NAME,
    "sample_count",
    "missing_count",
    "num_repeats",
    "token_usage_version",
)


def is_primary_metric(name: Any) -> bool:
    """NeMo Gym's ``is_primary_metric``: a point estimate, not a statistic of one."""
    return (
        isinstance(name, str)
        and name not in _EXCLUDED_NAMES
        and not name.startswith(_EXCLUDED_PREFIXES)
        and not name.endswith(_EXCLUDED_SUFFIXES)
        and "_across_repeats/" not in name
    )
