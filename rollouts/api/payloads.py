"""The dicts the API answers with for a dataset, a run and a rollout (the shapes of
``rollouts.api.schemas``), links made absolute."""

from __future__ import annotations

from typing import Any

from rollouts.collection import run_settings
from rollouts.evaluation import run_summary
from rollouts.models import Dataset, RefusedReply, Rollout, Run
from rollouts.review import actions
from rollouts.web.refused import refused_data


# -- helpers -------------------------------------------------------------------------------------
def absolute_url(request, path: str) -> str:
    return request.build_absolute_uri(path)


def dataset_out(d: Dataset) -> dict[str, Any]:
    return {
        "id": d.pk,
        "name": d.name,
        "num_rows": d.num_rows,
        "sha256": d.sha256,
        "created": d.created,
        "source_run": d.source_run_id,
        "source_filters": d.source_filters,
    }


def run_out(request, run: Run, progress: run_summary.Progress | None = None) -> dict[str, Any]:
    p = progress or run_summary.run_progress(run)
    dataset = run.dataset
    return {
        "id": run.pk,
        "name": run.name,
        "status": run.status,
        "final": run.is_final,
        "created": run.created,
        "started": run.started,
        "finished": run.finished,
        "agent_url": run.agent_url,
        "env_url": run.env_url,
        "url_changes": run.url_changes or [],
        "agent_name": run.agent_name,
        "num_tasks": run.num_tasks,
        "num_keys": run.num_keys,
        "tasks_from": {
            "dataset": run.dataset_id,
            "dataset_name": dataset.name if dataset else "",
            "source_run": dataset.source_run_id if dataset else None,
            "source_filters": dataset.source_filters if dataset else "",
        },
        "progress": {
            "total": p.total,
            "done": p.done,
            "succeeded": p.succeeded,
            "failed": p.failed,
            "pending": p.pending,
            "running": p.running,
            "not_run": p.not_run,
            "failed_attempts": p.failed_attempts,
            "percent": p.percent,
        },
        "url": absolute_url(request, run.get_absolute_url()),
        "archived": run.archived,
        "settings": {
            "concurrency": run.concurrency,
            "max_steps": run.max_steps or None,
            "num_repeats": run.num_repeats,
            "limit": run.limit,
            "max_attempts": run.max_attempts,
            "remote_responses_timeout_s": run.remote_responses_timeout_s,
            "run_timeout_s": run.run_timeout_s,
            "env_max_in_flight": run.env_max_in_flight,
            "overrides": run.overrides or {},
            "env_aggregate_metrics": run.aggregate_metrics_error != run_settings.NOT_ASKED,
        },
        "team": run.team_id,
        "auto_retry": run.auto_retry,
        "head_url": run.head_url,
        "env_name": run.env_name,
    }


def rollout_out(request, r: Rollout, labels: list[str], notes: int, corrected: float | None) -> dict[str, Any]:
    return {
        "id": r.pk,
        "run": r.run_id,
        "task_index": r.task_index,
        "rollout_index": r.rollout_index,
        "attempt": r.attempt,
        "status": r.status,
        "reward": r.reward,
        "corrected_reward": corrected,
        "failure_kind": r.failure_kind,
        "error": r.error_head if hasattr(r, "error_head") else (r.error or "")[:500],
        "terminal": r.terminal,
        "duration_ms": r.duration_ms,
        "num_agent_calls": r.num_agent_calls,
        "num_tool_calls": r.num_tool_calls,
        "total_tokens": r.total_tokens if r.usage_reported else None,
        "labels": labels,
        "notes": notes,
        "url": absolute_url(request, r.get_absolute_url()),
    }


def rollout_detail(request, rollout: Rollout) -> dict[str, Any]:
    state = actions.review_state(rollout)
    corr = state.correction
    out = rollout_out(
        request, rollout, [e["label"].name for e in state.on], len(state.notes), corr.reward if corr else None
    )
    out["agent_url"], out["env_url"] = rollout.agent_url, rollout.env_url
    out["refused_reply"] = refused_data(RefusedReply.objects.filter(rollout=rollout).first())
    out["label_uses"] = [{"name": e["label"].name, "by": e["use"]["by"], "at": e["use"]["created"]} for e in state.on]
    out["note_list"] = [
        {
            "id": n.pk,
            "text": n.text,
            "item": n.item_seq,
            "by": n.created_by.get_username() if n.created_by else None,
            "at": n.created,
        }
        for n in state.notes
    ]
    out["correction"] = (
        None
        if corr is None
        else {
            "reward": corr.reward,
            "reason": corr.reason,
            "by": corr.created_by.get_username() if corr.created_by else None,
            "at": corr.created,
        }
    )
    return out


def task_out(task) -> dict[str, Any]:
    """A ``BackgroundTask`` as the API's ``TaskOut``: its status URL, the run it made (done) and the
    form field its refusal is about (failed)."""
    from django.urls import reverse

    field = task.result.get("field") if task.status == task.Status.FAILED else None
    return {
        "id": task.pk,
        "kind": task.kind,
        "status": task.status,
        "progress": task.progress,
        "message": task.message,
        "created": task.created,
        "started": task.started,
        "finished": task.finished,
        "url": reverse("api:get_task", args=[task.pk]),
        "run": task.result.get("run") if task.status == task.Status.DONE else None,
        "errors": {field: [task.message]} if field else {},
    }
