"""Run aggregates read either way: with the env's rewards, or with the corrected reward where one
is in force. Same definitions as the run page (``rollouts.evaluation.run_summary``): over successes
(NeMo Gym's convention), and with failures as 0 over done keys.

Cheap on big runs: one grouped query over the (run, status, reward) index gives the env's reward
distribution; the corrected one follows from it and the run's corrections (a small table), so no
per-rollout subquery runs over the whole run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

from django.db.models import Count

from rollouts.evaluation import run_summary
from rollouts.models import Note, RewardCorrection, Rollout, RolloutLabel, Run
from rollouts.review.filters import CORRECTED, ORIGINAL


def corrections_in_force(run: Run) -> dict[int, float]:
    """``{rollout id: corrected reward}`` for the run's succeeded rollouts whose newest correction
    is not withdrawn."""
    latest: dict[int, Any] = {}
    rows = (
        RewardCorrection.objects.filter(rollout__run=run, rollout__status=Rollout.Status.SUCCEEDED)
        .order_by("id")
        .values_list("rollout_id", "reward")
    )
    for rollout_id, reward in rows:
        latest[rollout_id] = reward
    return {k: v for k, v in latest.items() if v is not None}


def _stats(counts: Counter, done: int) -> dict[str, Any]:
    values = sorted((v, c) for v, c in counts.items() if c > 0 and v is not None)
    if not values:
        return asdict(run_summary.RewardStats(n_with_failures=done))
    stats, total, _bins = run_summary.stats_from_values(values)
    stats.n_with_failures = done
    stats.mean_with_failures = total / done if done else None
    return asdict(stats)


def reward_aggregates(run: Run) -> dict[str, Any]:
    """``{"original": stats, "corrected": stats, "corrections": n}``; each ``stats`` has ``n``,
    ``mean``, ``minimum``, ``maximum``, ``median``, ``std`` (ddof=1) over successes and
    ``mean_with_failures`` over ``n_with_failures`` done keys (a key whose latest attempt failed
    counts as 0). ``corrections``: succeeded rollouts with a corrected reward in force."""
    done = run_summary.run_progress(run).done
    successes = Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED, reward__isnull=False)
    counts = Counter(dict(successes.values_list("reward").annotate(c=Count("id")).order_by()))
    original = _stats(counts, done)
    corrections = corrections_in_force(run)
    if not corrections:
        return {ORIGINAL: original, CORRECTED: dict(original), "corrections": 0}
    for _id, env_reward in successes.filter(id__in=list(corrections)).values_list("id", "reward"):
        counts[env_reward] -= 1
    for reward in corrections.values():
        counts[reward] += 1
    return {ORIGINAL: original, CORRECTED: _stats(counts, done), "corrections": len(corrections)}


def review_counts(run: Run) -> dict[str, Any]:
    """How far a run's review went: ``{"labels": [(name, rollouts)], "notes": n, "noted": rollouts
    with notes, "labelled": rollouts with a label}``. Reads the review tables only."""
    labels = list(
        RolloutLabel.objects.filter(rollout__run=run)
        .values_list("label__name")
        .annotate(n=Count("id"))
        .order_by("label__position", "label_id")
    )
    notes = Note.objects.filter(rollout__run=run)
    return {
        "labels": labels,
        "notes": notes.count(),
        "noted": notes.values("rollout_id").distinct().count(),
        "labelled": RolloutLabel.objects.filter(rollout__run=run).values("rollout_id").distinct().count(),
    }
