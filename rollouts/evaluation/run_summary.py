"""A run's aggregates for the dashboard, computed in SQL (never by looping over rollouts in Python).

Definitions (one place, used by every page):

- A *key* is a (task_index, rollout_index) pair; ``Run.num_keys`` of them exist. Every key has
  one or more attempt rows (``Rollout``); its *latest attempt* is its newest row.
- A key is **done** when its latest attempt ``succeeded`` or ``failed``. A pending or running
  attempt is not done yet, and neither is a key whose latest row is kill-shaped (cancelled or
  interrupted: not an attempt, it runs again on resume). Progress = done / num_keys.

  Computed without a per-key scan, from invariants the engine keeps: a pending, running or
  succeeded row is always its key's latest (the DB allows one such row per key, and no attempt
  follows a success), so ``done = num_keys − pending − running − killed_latest``, where
  ``killed_latest`` counts kill-shaped rows with no newer row for the key (a small set, found with
  an indexed ``NOT EXISTS``). Succeeded keys = succeeded rows; failed keys = done − succeeded.
- **Reward over successes** (NeMo Gym's convention): mean/min/max/median/std (ddof=1, 0 for a single
  value) of ``reward`` over succeeded attempts. **Reward with failures as 0**: the sum of success
  rewards over done keys (a key whose latest attempt failed counts once, as 0).
- Failure breakdown counts failed *attempts* (one per failures-sidecar row) by failure kind.
- Token usage sums every finished attempt that reported usage (failed ones spent tokens too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Avg, Count, Exists, F, FloatField, Max, Min, OuterRef, Q, Sum
from django.db.models.functions import Floor
from django.utils import timezone

from rollouts.models import Rollout, Run

S = Rollout.Status
FINISHED = (S.SUCCEEDED, S.FAILED)
# A run started this long after it was created was relaunched (Retry): its rate counts from then.
RELAUNCH_AFTER_S = 5.0
HISTOGRAM_BINS = 10
RATE_WINDOW_S = 60


@dataclass
class Progress:
    """Where a run stands, by key (see the module docstring)."""

    total: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed_attempts: int = 0
    cancelled: int = 0
    interrupted: int = 0
    killed_latest: int = 0
    reward_mean: float | None = None  # over successes

    @property
    def active(self) -> int:
        return self.pending + self.running

    @property
    def in_flight(self) -> int:
        return self.running

    @property
    def done(self) -> int:
        return max(0, min(self.total, self.total - self.active - self.killed_latest))

    @property
    def failed(self) -> int:
        """Keys whose latest attempt failed."""
        return max(0, self.done - self.succeeded)

    @property
    def not_run(self) -> int:
        """Keys that will not finish unless resumed (latest attempt cancelled or interrupted)."""
        return self.killed_latest

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 0.0

    @property
    def succeeded_percent(self) -> float:
        return 100.0 * self.succeeded / self.total if self.total else 0.0

    @property
    def failed_percent(self) -> float:
        return 100.0 * self.failed / self.total if self.total else 0.0


def _killed_latest(run_ids: Iterable[int]) -> dict[int, int]:
    """Per run: kill-shaped rows that are their key's latest row."""
    newer = Rollout.objects.filter(
        run_id=OuterRef("run_id"),
        task_index=OuterRef("task_index"),
        rollout_index=OuterRef("rollout_index"),
        id__gt=OuterRef("id"),
    )
    rows = (
        Rollout.objects.filter(run_id__in=list(run_ids), status__in=Rollout.KILL_SHAPED)
        .filter(~Exists(newer))
        .values("run_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {r["run_id"]: r["n"] for r in rows}


def _total(run: Run, p: Progress) -> int:
    # num_keys is set when a run is materialised; a run stored without it (an import) falls back
    # to the rows it has, which for such runs are one per key.
    return run.num_keys or (p.active + p.succeeded + p.failed_attempts + p.killed_latest)


_STATUS_FIELDS = {
    S.PENDING: "pending",
    S.RUNNING: "running",
    S.SUCCEEDED: "succeeded",
    S.FAILED: "failed_attempts",
    S.CANCELLED: "cancelled",
    S.INTERRUPTED: "interrupted",
}


def progress_for_runs(runs: Iterable[Run], with_reward: bool = True) -> dict[int, Progress]:
    """Progress (and mean reward over successes) of several runs, e.g. a page of the runs list,
    in at most three grouped queries whatever the number of runs and rollouts."""
    runs = list(runs)
    ids = [r.pk for r in runs]
    if not ids:
        return {}
    out = {run.pk: Progress() for run in runs}
    by_status = (
        Rollout.objects.filter(run_id__in=ids).values_list("run_id", "status").annotate(n=Count("id")).order_by()
    )
    for run_id, status, n in by_status:  # the (run, status) index alone
        if status in _STATUS_FIELDS:
            setattr(out[run_id], _STATUS_FIELDS[status], n)
    if with_reward:
        means = (
            Rollout.objects.filter(run_id__in=ids, status=S.SUCCEEDED)
            .values_list("run_id")
            .annotate(m=Avg("reward"))
            .order_by()
        )
        for run_id, mean in means:
            out[run_id].reward_mean = mean
    killable = [i for i in ids if out[i].cancelled or out[i].interrupted]
    for run_id, n in _killed_latest(killable).items() if killable else ():
        out[run_id].killed_latest = n
    for run in runs:
        out[run.pk].total = _total(run, out[run.pk])
    return out


@dataclass
class RewardStats:
    n: int = 0
    mean: float | None = None
    minimum: float | None = None
    maximum: float | None = None
    median: float | None = None
    std: float | None = None
    mean_with_failures: float | None = None  # failures (latest attempt failed) count as 0
    n_with_failures: int = 0


@dataclass
class Bin:
    low: float
    high: float
    count: int
    percent: float  # of the tallest bin, for the bar length

    @property
    def label(self) -> str:
        if self.low == self.high:
            return f"{self.low:g}"
        return f"{self.low:.3g} – {self.high:.3g}"


@dataclass
class Summary:
    """Everything the run page's live part shows."""

    progress: Progress
    reward: RewardStats
    histogram: list[Bin] = field(default_factory=list)
    failure_kinds: list[dict[str, Any]] = field(default_factory=list)
    terminal_failures: int = 0
    tokens: dict[str, int | None] = field(default_factory=dict)
    usage_reported: int = 0
    finished_attempts: int = 0
    recent_per_min: float | None = None  # None while the run has not run for a whole window
    overall_per_min: float | None = None
    rate_span_s: float | None = None  # the seconds overall_per_min is measured over
    mean_duration_ms: float | None = None

    @property
    def failed_bar_percent(self) -> float:
        """The failed-keys bar of the histogram, on the same scale as the bins."""
        tallest = max([b.count for b in self.histogram] + [self.progress.failed]) or 1
        return 100.0 * self.progress.failed / tallest

    @property
    def signature(self) -> str:
        """Changes whenever a rollout row changes state: the live poller compares it to decide
        whether the rollout table needs a refresh."""
        p = self.progress
        return f"{p.pending}.{p.running}.{p.succeeded}.{p.failed_attempts}.{p.cancelled}.{p.interrupted}"


def _median(qs, n: int) -> float | None:
    """Median of ``reward`` over ``qs`` (n rows) by ORDER BY + OFFSET: one or two values fetched."""
    if n == 0:
        return None
    mid = (n - 1) // 2
    values = list(qs.order_by("reward").values_list("reward", flat=True)[mid : mid + (1 if n % 2 else 2)])
    return sum(values) / len(values)


def equal_width_bins(lo: float, width: float, positions: Iterable[tuple[float | None, int]]) -> list[Bin]:
    """The reward histogram's one binning rule: ``HISTOGRAM_BINS`` equal-width bins from ``lo``
    (``width`` = (max - min) / bins); ``positions`` are ``((value - lo) / width, count)`` pairs, the
    position floored or not, truncated into a bin index and clamped (the top edge joins the last bin)."""
    counts = [0] * HISTOGRAM_BINS
    for position, n in positions:
        counts[min(max(int(position or 0), 0), HISTOGRAM_BINS - 1)] += n
    tallest = max(counts) or 1
    return [Bin(lo + i * width, lo + (i + 1) * width, c, 100.0 * c / tallest) for i, c in enumerate(counts)]


def _histogram(qs, lo: float | None, hi: float | None) -> list[Bin]:
    """``equal_width_bins`` over [lo, hi] by SQL bucketing (FLOOR of the scaled reward). One bin when
    every reward is equal."""
    if lo is None or hi is None:
        return []
    if hi == lo:
        n = qs.count()
        return [Bin(lo, hi, n, 100.0)] if n else []
    width = (hi - lo) / HISTOGRAM_BINS
    # Floor, not a cast to integer: PostgreSQL's cast rounds where SQLite's truncates.
    bucket = Floor((F("reward") - lo) / width)
    rows = qs.annotate(bucket=bucket).values("bucket").annotate(n=Count("id")).order_by()
    return equal_width_bins(lo, width, ((row["bucket"], row["n"]) for row in rows))


TOKEN_FIELDS = ("input_tokens", "output_tokens", "total_tokens", "cached_tokens", "reasoning_tokens")


@dataclass
class _Finished:
    """Aggregates over a run's finished attempts. Finished rows never change, and every new one
    raises the succeeded or failed count, so these are cached under those two counts."""

    reward: RewardStats
    reward_sum: float
    histogram: list[Bin]
    failure_kinds: list[dict[str, Any]]
    terminal_failures: int
    tokens: dict[str, int | None]
    usage_reported: int
    mean_duration_ms: float | None
    done: int = 0  # the run's done keys when these were computed (reward_sum's denominator)
    live: bool = False  # cached for GYMWEB_LIVE_CACHE_S, not under exact counts


DISTINCT_REWARDS_MAX = 5000


def stats_from_values(values: list[tuple[float, int]]) -> tuple[RewardStats, float, list[Bin]]:
    """Exact stats, median and histogram from (reward, count) pairs sorted by reward: one small
    GROUP BY result when rewards take few distinct values (0/1, a score out of 10, ...)."""
    n = sum(c for _, c in values)
    total = sum(v * c for v, c in values)
    mean = total / n
    stats = RewardStats(n=n, mean=mean, minimum=values[0][0], maximum=values[-1][0])
    stats.std = math.sqrt(sum(c * (v - mean) ** 2 for v, c in values) / (n - 1)) if n > 1 else 0.0
    middle = [(n - 1) // 2, n // 2]  # the one or two middle positions
    picked, seen = [], 0
    for v, c in values:
        while middle and middle[0] < seen + c:
            picked.append(v)
            middle.pop(0)
        seen += c
    stats.median = sum(picked) / len(picked)
    lo, hi = stats.minimum, stats.maximum
    if lo == hi:
        return stats, total, [Bin(lo, hi, n, 100.0)]
    width = (hi - lo) / HISTOGRAM_BINS
    return stats, total, equal_width_bins(lo, width, (((v - lo) / width, c) for v, c in values))


def _reward_stats(successes) -> tuple[RewardStats, float, list[Bin]]:
    """Stats over successes: mean/min/max/std (ddof=1)/median and the histogram.

    First one GROUP BY reward, capped at ``DISTINCT_REWARDS_MAX`` groups: when rewards take few
    values everything follows exactly from it. Otherwise (continuous rewards) SQL does it: one
    aggregate, the median by ORDER BY + OFFSET, the histogram by bucketing."""
    values = list(
        successes.values_list("reward").annotate(c=Count("id")).order_by("reward")[: DISTINCT_REWARDS_MAX + 1]
    )
    if not values:
        return RewardStats(), 0.0, []
    if len(values) <= DISTINCT_REWARDS_MAX:
        return stats_from_values(values)
    agg = successes.aggregate(
        n=Count("reward"),
        total=Sum("reward"),
        lo=Min("reward"),
        hi=Max("reward"),
        sq=Sum(F("reward") * F("reward"), output_field=FloatField()),
    )
    n, total = agg["n"], agg["total"] or 0.0
    stats = RewardStats(n=n, mean=total / n, minimum=agg["lo"], maximum=agg["hi"])
    ss = (agg["sq"] or 0.0) - total * total / n
    if ss <= 1e-9 * (agg["sq"] or 1.0):  # cancellation (values far from 0, tiny spread): two passes
        mean = stats.mean
        ss = (
            successes.aggregate(ss=Sum((F("reward") - mean) * (F("reward") - mean), output_field=FloatField()))["ss"]
            or 0.0
        )
    stats.std = math.sqrt(max(ss, 0.0) / (n - 1))
    stats.median = _median(successes, n)
    return stats, total, _histogram(successes, stats.minimum, stats.maximum)


def _finished_aggregates(run: Run, progress: Progress) -> _Finished:
    rows = Rollout.objects.filter(run=run)
    successes = rows.filter(status=S.SUCCEEDED, reward__isnull=False)
    reward, reward_sum, histogram = _reward_stats(successes)
    # Only failed attempts carry a failure kind: this reads the (run, failure_kind) index alone.
    kinds = list(
        rows.exclude(failure_kind="").values("failure_kind").annotate(n=Count("id")).order_by("-n", "failure_kind")
    )
    unclassified = progress.failed_attempts - sum(k["n"] for k in kinds)
    if unclassified > 0:
        kinds.append({"failure_kind": "", "n": unclassified})
    finished = rows.filter(status__in=FINISHED)
    agg = (
        finished.aggregate(
            n_terminal=Count("id", filter=Q(status=S.FAILED, terminal=True)),
            n_usage=Count("id", filter=Q(usage_reported=True)),
            mean_duration_ms=Avg("duration_ms"),
            **{f"tok_{name}": Sum(name, filter=Q(usage_reported=True)) for name in TOKEN_FIELDS},
        )
        if progress.succeeded or progress.failed_attempts
        else {}
    )
    return _Finished(
        reward=reward,
        reward_sum=reward_sum,
        histogram=histogram,
        failure_kinds=kinds,
        terminal_failures=agg.get("n_terminal") or 0,
        tokens={name: agg.get(f"tok_{name}") for name in TOKEN_FIELDS},
        usage_reported=agg.get("n_usage") or 0,
        mean_duration_ms=agg.get("mean_duration_ms"),
        done=progress.done,
    )


def _cached_finished_aggregates(run: Run, progress: Progress) -> _Finished:
    """Aggregates over finished attempts, cached: under the run's succeeded and failed counts
    (exact), or, while the run is running (its counts change on every poll), under the run alone
    for ``GYMWEB_LIVE_CACHE_S`` so that a team watching a run shares one computation per few
    seconds instead of one per poll."""
    ttl = settings.GYMWEB_SUMMARY_CACHE_S
    if ttl <= 0:
        return _finished_aggregates(run, progress)
    created = run.created.timestamp() if run.created else 0
    live_ttl = float(settings.GYMWEB_LIVE_CACHE_S)
    if run.status == Run.Status.RUNNING and live_ttl > 0:
        key, ttl = f"gymweb:finished-live:v1:{run.pk}:{created}", live_ttl
    else:
        key = f"gymweb:finished:v1:{run.pk}:{created}:{progress.succeeded}:{progress.failed_attempts}"
    value = cache.get(key)
    if value is None:
        value = _finished_aggregates(run, progress)
        value.live = key.startswith("gymweb:finished-live:")
        cache.set(key, value, ttl)
    return value


def run_progress(run: Run) -> Progress:
    """One run's progress (see the module docstring)."""
    return progress_for_runs([run], with_reward=False)[run.pk]


def run_summary(run: Run, now=None, progress: Progress | None = None) -> Summary:
    """The run page's aggregates: a few indexed SQL aggregates, none per rollout in Python.
    Aggregates over finished attempts are cached under the run's succeeded and failed counts
    (``GYMWEB_SUMMARY_CACHE_S``, default 600 s; 0 turns it off)."""
    now = now or timezone.now()
    progress = progress if progress is not None else run_progress(run)
    fin = _cached_finished_aggregates(run, progress)
    progress.reward_mean = fin.reward.mean
    reward = RewardStats(**vars(fin.reward))
    # A live snapshot's reward sum goes with the done count it was computed with (the two would
    # disagree for a few seconds otherwise); an exact one was computed at today's counts.
    done = fin.done if fin.live else progress.done
    reward.n_with_failures = done
    if done:
        reward.mean_with_failures = fin.reward_sum / done

    finished_attempts = progress.succeeded + progress.failed_attempts
    recent = 0
    if not run.is_final and finished_attempts:
        # Led by the index on ``finished`` (only the last minute's rows are read): ``run_id + 0``
        # keeps SQLite from preferring a run index, which would read every row of the run.
        recent = (
            Rollout.objects.filter(finished__gte=now - timedelta(seconds=RATE_WINDOW_S))
            .annotate(run_plus_zero=F("run_id") + 0)
            .filter(run_plus_zero=run.pk)
            .aggregate(n=Count("id", filter=Q(status__in=FINISHED)))["n"]
        )
    overall = span_s = None
    if run.started and finished_attempts:
        end = run.finished or now
        span_s = max((end - run.started).total_seconds(), 1.0)
        minutes = span_s / 60.0
        since = finished_attempts
        if run.created and (run.started - run.created).total_seconds() > RELAUNCH_AFTER_S:
            # Retry relaunches the run (``started`` moves to that moment): only the attempts
            # finished since then count, or every earlier attempt over a few seconds reads as
            # thousands a minute. (A run launched with its creation needs no query for this.)
            since = Rollout.objects.filter(run=run, status__in=FINISHED, finished__gte=run.started).count()
        overall = since / minutes if since else None

    tallest = max([b.count for b in fin.histogram] + [progress.failed]) or 1
    histogram = [
        Bin(b.low, b.high, b.count, 100.0 * b.count / tallest) for b in fin.histogram
    ]  # one scale with the failed bar
    return Summary(
        progress=progress,
        reward=reward,
        histogram=histogram,
        failure_kinds=fin.failure_kinds,
        terminal_failures=fin.terminal_failures,
        tokens=fin.tokens,
        usage_reported=fin.usage_reported,
        finished_attempts=finished_attempts,
        # A rate over the last minute exists only once the run has run for a minute.
        recent_per_min=recent * 60.0 / RATE_WINDOW_S if span_s is not None and span_s >= RATE_WINDOW_S else None,
        overall_per_min=overall,
        rate_span_s=span_s if overall is not None else None,
        mean_duration_ms=fin.mean_duration_ms,
    )


def failure_kinds(run: Run) -> list[str]:
    """The failure kinds present in a run (for the filter's choices)."""
    return list(
        Rollout.objects.filter(run=run)
        .exclude(failure_kind="")
        .values_list("failure_kind", flat=True)
        .distinct()
        .order_by("failure_kind")
    )
