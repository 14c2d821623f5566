"""Runs with rollouts in chosen states, built through ``runs.create_run`` and then finished by hand
(no services needed), for the dashboard's view tests."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.utils import timezone

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Rollout, Run


def dataset_lines(n: int) -> list[str]:
    return [json.dumps({"responses_create_params": {"input": f"task {i}"}, "expected": i}) for i in range(n)]


def make_run(n_tasks: int = 5, *, status: str = Run.Status.COMPLETED, name: str = "run", **options: Any) -> Run:
    """A run of ``n_tasks`` synthetic tasks (all keys pending), then put in ``status``."""
    parsed = read_jsonl(dataset_lines(n_tasks), source="tasks.jsonl")
    options.setdefault("agent_url", "http://127.0.0.1:9102")
    options.setdefault("env_url", "http://127.0.0.1:9101")
    run = runs.create_run(parsed, name=name, **options)
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status=status,
        started=now - timedelta(minutes=2),
        finished=now if status in Run.FINAL else None,
    )
    run.refresh_from_db()
    return run


def finish(
    rollout: Rollout,
    status: str,
    reward: float | None = None,
    *,
    kind: str = "",
    error: str = "",
    terminal: bool = False,
    duration_ms: float = 100.0,
    calls: int = 2,
    tokens: int | None = None,
    output: list | None = None,
) -> Rollout:
    """End ``rollout`` like a worker would: a success stores the env's /verify reply (``output``:
    its ``response.output``, default none)."""
    rollout.status = status
    rollout.finished = timezone.now()
    if status == Rollout.Status.SUCCEEDED:
        row = json.loads(rollout.task.row_json)
        row["_ng_rollout_index"] = rollout.rollout_index
        verify = {
            **{k: v for k, v in row.items() if not k.startswith("_ng_") and k != "agent_ref"},
            "response": {"id": "r", "object": "response", "output": output or [], "usage": None},
            "reward": reward,
        }
        rollout.verify_json = json.dumps(verify)
        rollout.reward = reward
    elif status == Rollout.Status.FAILED:
        rollout.reward = 0.0
        rollout.failure_kind = kind or "agent_http_error"
        rollout.error = error or f"{rollout.failure_kind}: something went wrong"
        rollout.terminal = terminal
    if status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED):
        rollout.duration_ms = duration_ms
        rollout.num_agent_calls = calls
        rollout.num_tool_calls = max(calls - 1, 0)
        if tokens is not None:
            rollout.usage_reported = True
            rollout.input_tokens, rollout.output_tokens, rollout.total_tokens = (
                tokens,
                tokens // 2,
                tokens + tokens // 2,
            )
            rollout.cached_tokens, rollout.reasoning_tokens = 0, 1
    rollout.save()
    return rollout


def key(run: Run, task_index: int, rollout_index: int = 0) -> Rollout:
    """The latest attempt of a key."""
    return Rollout.objects.filter(run=run, task_index=task_index, rollout_index=rollout_index).order_by("-id").first()


def new_attempt(run: Run, task_index: int, rollout_index: int = 0) -> Rollout:
    last = key(run, task_index, rollout_index)
    spent = last.status == Rollout.Status.FAILED
    return Rollout.objects.create(
        run=run,
        task_id=last.task_id,
        task_index=task_index,
        rollout_index=rollout_index,
        attempt=last.attempt + (1 if spent else 0),
    )


ANSWER = [
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_a",
        "status": "completed",
        "content": [{"type": "output_text", "text": "the answer", "annotations": []}],
    }
]


def collect_unreached(tmp_path, tasks, *more: str, agent_url: str = "http://127.0.0.1:1") -> None:
    """``collect`` against services that are never reached: for tests it refuses before any call."""
    from django.core.management import call_command

    call_command(
        "collect",
        "--agent-url",
        agent_url,
        "--env-url",
        "http://127.0.0.1:2",
        "--input",
        str(tasks),
        "--output",
        str(tmp_path / "o.jsonl"),
        *more,
    )
