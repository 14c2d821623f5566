"""Runs launched for the workers complete through real ``qcluster`` processes."""

from __future__ import annotations

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Rollout, Run

from .conftest import wait_for


def _launch(env_url, agent_url, path, **options):
    with open(path, "rb") as fh:
        parsed = read_jsonl(fh)
    run = runs.create_run(parsed, name="t", agent_url=agent_url, env_url=env_url, **options)
    runs.launch(run)
    return run


def test_a_worker_process_completes_a_launched_run(workers, counter_env_url, counter_agent_url, counter_tasks_path):
    run = _launch(counter_env_url, counter_agent_url, counter_tasks_path, num_repeats=4)
    workers.start(workers=1)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED, 60, what="the run to complete")
    assert Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count() == 20
    assert Rollout.objects.filter(run=run).count() == 20


def test_a_worker_fetches_the_envs_aggregate_metrics_after_the_run(
    workers, counter_env_url, counter_agent_url, counter_tasks_path
):
    run = _launch(counter_env_url, counter_agent_url, counter_tasks_path)
    workers.start(workers=1)
    wait_for(lambda: Run.objects.get(pk=run.pk).aggregate_metrics is not None, 60, what="aggregate metrics")
    assert Run.objects.get(pk=run.pk).aggregate_metrics["agent_metrics"]["mean/reward"] == 1.0
