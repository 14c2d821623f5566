"""Reverify: recompute the rewards of a stored run against an env URL without calling the agent
(NeMo Gym 0.7.0's ``gym eval reverify``, ``nemo_gym/rollout_reverification.py``).

What it sends, the ``/reverify_mode`` guard and the new run it makes: docs/evaluate.md, "Reverify".
Besides: ``deliverables_dir``/``reference_ids`` are sent when the row carries them; NeMo Gym's own
envs answer ``unknown`` by default; a forced run notes ``reverify_unsafe``; the new run holds the
same tasks, trajectories and agent calls, so every page works on it; ``reward_flips`` lists the keys
whose reward changed.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.db import transaction
from django.utils import timezone
from pydantic import TypeAdapter, ValidationError

from rollouts import targets
from rollouts.collection.profile_numbers import profile_json_for_verify
from rollouts.engine.loop import validate_base_url
from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = ["ReverifyError", "ReverifyRefused", "ReverifyResult", "reverify_run", "reward_flips", "reverify_mode"]

STATELESS = "stateless"
VERIFY_FAILED = "verify_failed"
DEFAULT_CONCURRENCY = 16
DEFAULT_TIMEOUT_S = 300.0
CHUNK = 500


class ReverifyError(ValueError):
    """The reverification could not start (bad URL, env unreachable, nothing to reverify)."""


class ReverifyRefused(ReverifyError):
    """The env does not report ``reverify_mode = stateless`` and ``force`` was not given."""


@dataclass
class ReverifyResult:
    """``run``: the new run; ``flips``: ``[(task, rollout, old reward, new reward)]`` whose reward
    changed; ``failed``: rows whose ``/verify`` failed; ``mode``: what the env reported."""

    run: Run
    mode: str
    reverified: int = 0
    failed: int = 0
    flips: list[tuple[int, int, float, float | None]] = field(default_factory=list)
    warning: str = ""


def reverify_mode(env_url: str, timeout_s: float = 30.0) -> str:
    """``GET {env}/reverify_mode``: ``stateless``, ``unsupported`` or ``unknown`` (also when the env
    does not serve the route, or answers something else). Raises ``ReverifyError`` when the env
    cannot be reached."""
    try:
        with targets.sync_client(timeout_s) as client:
            response = client.get(f"{env_url}/reverify_mode")
    except targets.TargetRefused as exc:
        raise ReverifyError(f"{env_url}: {exc}") from None
    except httpx.HTTPError as exc:
        raise ReverifyError(f"could not reach {env_url}/reverify_mode: {exc.__class__.__name__}: {exc}") from None
    if not response.is_success:
        return "unknown"
    try:
        mode = response.json()
    except ValueError:
        return "unknown"
    return mode if mode in (STATELESS, "unsupported") else "unknown"


def _payload(task_row: dict[str, Any], rollout_index: int, verify: dict[str, Any]) -> dict[str, Any]:
    payload = {**task_row, ROLLOUT_INDEX_KEY_NAME: rollout_index, "response": verify.get("response")}
    for key in ("deliverables_dir", "reference_ids"):
        if key in verify:
            payload[key] = verify[key]
    return payload


# What NeMo Gym's reverify copies from the materialised input row into the env's reply, after the
# indices and ``agent_ref``, in this order (``RolloutReverificationHelper.run_from_config``).
_COPIED_KEYS = ("_ng_environment_server", "task_source", "skills_ref", "_ng_atif_provenance")


def _result_row(
    reply: dict[str, Any], task_row: dict[str, Any], task_index: int, rollout_index: int, agent_name: str
) -> dict[str, Any]:
    """The reverified row as NeMo Gym's reverify writes it: the env's reply, ``_ng_task_index``,
    ``_ng_rollout_index``, ``agent_ref`` (the task row's, else the run's agent, as the export writes
    it), then ``_COPIED_KEYS`` the task row carries, overriding the reply's."""
    row = dict(reply)
    row[TASK_INDEX_KEY_NAME] = task_index
    row[ROLLOUT_INDEX_KEY_NAME] = rollout_index
    row["agent_ref"] = task_row.get("agent_ref") or {"name": agent_name}
    for key in _COPIED_KEYS:
        if key in task_row:
            row[key] = task_row[key]
    return row


_FLOAT = TypeAdapter(float)


def reward_of(reply: Any) -> float | None:
    """The reward of an env's ``/verify`` reply read as NeMo Gym's models read one (pydantic's lax
    float: ``true`` → 1.0, ``"0.5"`` → 0.5), or None when it is missing, not a number or not finite.
    The reply itself is written as it came, as NeMo Gym's reverify writes it."""
    if not isinstance(reply, dict) or "reward" not in reply:
        return None
    try:
        reward = _FLOAT.validate_python(reply["reward"])
    except ValidationError:
        return None
    return reward if math.isfinite(reward) else None


async def _verify_all(
    env_url: str, payloads: list[dict[str, Any]], concurrency: int, timeout_s: float
) -> list[tuple[dict | None, str, float]]:
    """POST every payload to ``/verify``: per payload ``(reply or None, error, ms)``."""
    semaphore = asyncio.Semaphore(max(1, concurrency))
    async with targets.async_client(max(1, concurrency)) as client:

        async def one(payload: dict[str, Any]) -> tuple[dict | None, str, float]:
            async with semaphore:
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(timeout_s):
                        response = await client.post(
                            f"{env_url}/verify",
                            content=json.dumps(payload),
                            headers={"content-type": "application/json"},
                        )
                except TimeoutError:
                    return None, f"{env_url}/verify did not answer within {timeout_s:g} s", 0.0
                except httpx.HTTPError as exc:
                    return None, f"could not call {env_url}/verify: {exc.__class__.__name__}: {exc}", 0.0
                ms = (time.perf_counter() - started) * 1000.0
                if not response.is_success:
                    return None, f"/verify answered HTTP {response.status_code}: {response.text[:500]}", ms
                try:
                    reply = response.json()
                except ValueError:
                    return None, f"/verify answered with a body that is not JSON: {response.text[:500]}", ms
                if reward_of(reply) is None:
                    return None, "/verify's reply is not a JSON object with a numeric reward", ms
                return reply, "", ms

        return await asyncio.gather(*(one(p) for p in payloads))


def reverify_run(
    source: Run,
    env_url: str,
    *,
    force: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    name: str = "",
    user=None,
) -> ReverifyResult:
    """Reverify ``source``'s successes against ``env_url`` (see the module docstring) and store the
    result as a new completed run linked to ``source``. Times in seconds.

    Raises ``ReverifyError`` (bad URL, env unreachable, no successes) and ``ReverifyRefused`` (the
    env's ``reverify_mode`` is not ``stateless`` and ``force`` is false); nothing is stored then.
    """
    try:
        env_url = validate_base_url(env_url, "--env-url")
    except ValueError as exc:
        raise ReverifyError(str(exc)) from None
    mode = reverify_mode(env_url)
    warning = ""
    if mode != STATELESS:
        if not force:
            raise ReverifyRefused(
                f"the environment at {env_url} has reverify_mode={mode} (its reward may depend on session state the "
                "rollout built up, which reverification does not replay). Rewards computed by reverification may be "
                "incorrect. Pass --force to override (the new run's name is then prefixed with 'unsafe_')."
            )
        warning = (
            f"the environment has reverify_mode={mode}: rewards computed by reverification may be incorrect; "
            "the new run is marked unsafe_"
        )

    copied = (
        "usage_reported",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "cached_tokens",
        "reasoning_tokens",
        "num_agent_calls",
        "num_tool_calls",
        "num_items",
        "seed_ms",
        "duration_ms",
    )
    rows = list(
        Rollout.objects.filter(run=source, status=Rollout.Status.SUCCEEDED)
        .order_by("task_index", "rollout_index", "id")
        .only("id", "task_id", "task_index", "rollout_index", "reward", "verify_json", *copied)
    )
    successes = [(r.pk, r.task_id, r.task_index, r.rollout_index, r.reward, r.verify_json) for r in rows]
    source_rows = {r.pk: r for r in rows}
    if not successes:
        raise ReverifyError(f"run #{source.pk} has no successful rollouts to reverify")
    tasks = {t.pk: t for t in Task.objects.filter(run=source)}
    task_rows = {pk: json.loads(t.row_json) for pk, t in tasks.items()}
    payloads = [
        _payload(task_rows[task_id], rollout_index, json.loads(verify_json))
        for _, task_id, _, rollout_index, _, verify_json in successes
    ]
    outcomes = asyncio.run(_verify_all(env_url, payloads, concurrency, timeout_s))

    prefix = "unsafe_" if warning else ""
    now = timezone.now()
    result_name = name or f"{prefix}reverify of #{source.pk} {source.name}"
    with transaction.atomic():
        run = Run.objects.create(
            name=result_name[:200],
            status=Run.Status.COMPLETED,
            started=now,
            finished=now,
            created_by=user,
            dataset=source.dataset,
            team_id=source.team_id,  # the run it re-scores: the same team sees both
            agent_url="",
            env_url=env_url,
            agent_name=source.agent_name,
            concurrency=concurrency,
            max_steps=source.max_steps,
            num_repeats=source.num_repeats,
            limit=source.limit,
            max_attempts=1,
            overrides=source.overrides,
            source_file="",
            reverified_from=source,
            aggregate_metrics_error=warning,
        )
        new_tasks = Task.objects.bulk_create(
            [Task(run=run, task_index=t.task_index, row_json=t.row_json) for t in tasks.values()]
        )
        task_map = {old: new for old, new in zip(tasks.keys(), new_tasks)}
        if any(t.pk is None for t in new_tasks):  # backends without RETURNING
            by_index = dict(Task.objects.filter(run=run).values_list("task_index", "id"))
            task_ids = {old: by_index[tasks[old].task_index] for old in tasks}
        else:
            task_ids = {old: new.pk for old, new in task_map.items()}
        result = ReverifyResult(run=run, mode=mode, warning=warning)
        pairs = []
        for (old_pk, task_id, task_index, rollout_index, old_reward, old_verify), (reply, error, ms) in zip(
            successes, outcomes
        ):
            source_row = source_rows[old_pk]
            r = Rollout(
                run=run,
                task_id=task_ids[task_id],
                task_index=task_index,
                rollout_index=rollout_index,
                attempt=1,
                started=now,
                finished=now,
                verify_ms=ms or None,
                **{f: getattr(source_row, f) for f in copied},
            )
            if reply is not None:
                reward = reward_of(reply)
                assert reward is not None  # _verify_all passes only replies with one
                reply = _result_row(reply, task_rows[task_id], task_index, rollout_index, source.agent_name)
                r.status, r.reward, r.verify_json = (
                    Rollout.Status.SUCCEEDED,
                    reward,
                    json.dumps(reply, ensure_ascii=False),
                )
                r.profile_json = profile_json_for_verify(reply)
                result.reverified += 1
            else:
                r.status, r.reward, r.failure_kind, r.error = Rollout.Status.FAILED, 0.0, VERIFY_FAILED, error
                r.partial_response_json = json.dumps(json.loads(old_verify).get("response"), ensure_ascii=False)
                result.failed += 1
            if r.reward != old_reward:
                result.flips.append((task_index, rollout_index, old_reward, r.reward if reply is not None else None))
            pairs.append((old_pk, r))
        for start in range(0, len(pairs), CHUNK):
            chunk = pairs[start : start + CHUNK]
            created = Rollout.objects.bulk_create([r for _, r in chunk])
            if any(r.pk is None for r in created):
                ids = {
                    (t, ro): pk
                    for pk, t, ro in Rollout.objects.filter(run=run).values_list("id", "task_index", "rollout_index")
                }
                for r in created:
                    r.pk = r.id = ids[(r.task_index, r.rollout_index)]
            new_of = {old: r.pk for (old, _), r in zip(chunk, created)}
            AgentCall.objects.bulk_create(
                [
                    AgentCall(
                        rollout_id=new_of[c.rollout_id],
                        index=c.index,
                        started=c.started,
                        latency_ms=c.latency_ms,
                        http_status=c.http_status,
                        response_id=c.response_id,
                        model=c.model,
                        usage=c.usage,
                        incomplete_details=c.incomplete_details,
                        num_asks=c.num_asks,
                        error=c.error,
                    )
                    for c in AgentCall.objects.filter(rollout_id__in=new_of)
                ],
                batch_size=2000,
            )
            TrajectoryItem.objects.bulk_create(
                [
                    TrajectoryItem(
                        rollout_id=new_of[i.rollout_id],
                        seq=i.seq,
                        step=i.step,
                        kind=i.kind,
                        role=i.role,
                        call_id=i.call_id,
                        name=i.name,
                        origin=i.origin,
                        asked=i.asked,
                        paired=i.paired,
                        refused=i.refused,
                        latency_ms=i.latency_ms,
                        tool_status=i.tool_status,
                        payload=i.payload,
                        search_text=i.search_text,
                    )
                    for i in TrajectoryItem.objects.filter(rollout_id__in=new_of).iterator(chunk_size=2000)
                ],
                batch_size=1000,
            )
        run.num_tasks = len({t for _, _, t, _, _, _ in successes})
        run.num_keys = len(successes)
        run.save(update_fields=["num_tasks", "num_keys"])
    return result


def reward_flips(run: Run) -> list[dict[str, Any]]:
    """For a reverified run: the keys whose reward differs from its source's success, as
    ``{"task", "rollout", "before", "after", "rollout_id", "source_rollout_id"}`` (``after`` None when
    ``/verify`` failed). Empty for other runs. Two queries."""
    if run.reverified_from_id is None:
        return []
    before = {
        (t, r): (pk, reward)
        for pk, t, r, reward in Rollout.objects.filter(
            run_id=run.reverified_from_id, status=Rollout.Status.SUCCEEDED
        ).values_list("id", "task_index", "rollout_index", "reward")
    }
    out = []
    for pk, t, r, status, reward in (
        Rollout.objects.filter(run=run)
        .order_by("task_index", "rollout_index")
        .values_list("id", "task_index", "rollout_index", "status", "reward")
    ):
        old = before.get((t, r))
        after = reward if status == Rollout.Status.SUCCEEDED else None
        if old is not None and old[1] != after:
            out.append(
                {
                    "task": t,
                    "rollout": r,
                    "before": old[1],
                    "after": after,
                    "rollout_id": pk,
                    "source_rollout_id": old[0],
                }
            )
    return out
