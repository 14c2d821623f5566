"""An import or dataset upload whose process is SIGKILLed part-way never passes for a complete run or
dataset: what its committed batches stored is shown nowhere (runs list, run page, exports, compare,
the API's lists, the new-run page's dataset picker), and once its writer's lease lapses the
supervisor's sweep deletes it (``rollouts.collection.writing``). The writers are real processes on
this test's file-backed database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from rollouts.collection import writing
from rollouts.models import DatasetRow, Rollout, Run, Task
from rollouts.tokens import create_token
from rollouts.workers.claims import supervise

from .conftest import REPO, _worker_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE_S = 6  # the killed writer's GYMWEB_WRITE_LEASE_S: long enough for a batch on a busy machine


def _rollouts_file(path, rows: int):
    with path.open("w") as out:
        for i in range(rows):
            out.write(
                json.dumps(
                    {
                        "responses_create_params": {"input": f"task {i}"},
                        "response": {"id": f"r{i}", "output": [{"type": "message", "role": "assistant"}]},
                        "reward": 1.0,
                    }
                )
                + "\n"
            )
    return path


def _dataset_file(path, rows: int):
    with path.open("w") as out:
        for i in range(rows):
            out.write(json.dumps({"responses_create_params": {"input": f"task {i}"}, "expected": i}) + "\n")
    return path


STORE_DATASET = """
import sys
import django
django.setup()
from rollouts.collection import streamed_upload
path = sys.argv[1]
found = streamed_upload.scan(path, "killed.jsonl", 10**7, 1 << 20)
streamed_upload.store_dataset(path, "killed.jsonl", found, name="killed.jsonl", max_line_bytes=1 << 20)
"""


def _start(args: list[str], tmp_path):
    log = (tmp_path / "writer.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        env=_worker_env({"GYMWEB_WRITE_LEASE_S": str(LEASE_S), "DJANGO_SETTINGS_MODULE": "gymweb.settings"}),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    return proc


def _kill_once(proc, stored, tmp_path, what: str) -> None:
    """SIGKILL ``proc`` once ``stored()`` says a batch is committed (it must still be writing)."""
    try:
        wait_for(lambda: stored() or proc.poll() is not None, 120, what=f"a first batch of the {what}")
        assert proc.poll() is None, (tmp_path / "writer.log").read_text()[-3000:]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


def _superuser(django_user_model):
    return django_user_model.objects.create_superuser(username="root", password="x")


def _sweep_after_the_lease() -> None:
    time.sleep(LEASE_S + 0.5)
    supervise()


def test_a_killed_import_shows_nowhere_and_the_sweep_deletes_it(tmp_path, client, django_user_model):
    path = _rollouts_file(tmp_path / "killed_rollouts.jsonl", 40_000)
    proc = _start(["manage.py", "import_rollouts", str(path), "--no-health-check"], tmp_path)
    _kill_once(proc, lambda: Rollout.objects.exists(), tmp_path, "import")

    run = Run.objects.get()  # what the committed batches stored is still there...
    assert run.writing_until is not None and Rollout.objects.filter(run=run).count() < 40_000
    root = _superuser(django_user_model)
    client.force_login(root)
    # ...but no page, list, export or picker offers it as a run
    assert "killed_rollouts" not in client.get(reverse("runs")).content.decode()
    assert client.get(reverse("run", args=[run.pk])).status_code == 404
    assert client.get(reverse("run_export", args=[run.pk, "rollouts"])).status_code == 404
    assert f'value="{run.pk}"' not in client.get(reverse("compare")).content.decode()
    token = create_token(root, "tests")[1]
    listed = client.get("/api/v1/runs", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert run.pk not in [r["id"] for r in listed]
    assert client.get(f"/api/v1/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 404

    _sweep_after_the_lease()
    assert not Run.objects.exists() and not Rollout.objects.exists() and not Task.objects.exists()


def test_a_killed_dataset_upload_is_offered_nowhere_and_the_sweep_deletes_it(tmp_path, client, django_user_model):
    path = _dataset_file(tmp_path / "killed.jsonl", 200_000)
    proc = _start(["-c", STORE_DATASET, str(path)], tmp_path)
    _kill_once(proc, lambda: DatasetRow.objects.exists(), tmp_path, "dataset upload")

    from rollouts.models import Dataset

    dataset = Dataset.objects.get()
    assert dataset.writing_until is not None and dataset.rows.count() < 200_000
    root = _superuser(django_user_model)
    client.force_login(root)
    assert "killed.jsonl" not in client.get(reverse("run_new")).content.decode()  # the dataset picker
    token = create_token(root, "tests")[1]
    listed = client.get("/api/v1/datasets", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert dataset.pk not in [d["id"] for d in listed]

    _sweep_after_the_lease()
    assert not Dataset.objects.exists() and not DatasetRow.objects.exists()


def test_the_sweep_leaves_a_live_writer_alone_and_a_lapsed_writer_cannot_go_on(settings):
    live = Run.objects.create(name="live", writing_until=writing.lease())
    lapsed = Run.objects.create(name="lapsed", writing_until=timezone.now() - timedelta(seconds=1))
    assert writing.sweep() == (1, 0)
    assert list(Run.objects.values_list("name", flat=True)) == ["live"]
    writing.renew(live)
    writing.done(live)
    assert Run.objects.get(pk=live.pk).writing_until is None
    with pytest.raises(writing.LeaseLost, match="GYMWEB_WRITE_LEASE_S"):
        writing.renew(lapsed)


RUN_TASK = """
import sys
import django
django.setup()
from rollouts import background
background.run(int(sys.argv[1]))
"""


@pytest.fixture
def queued_tasks(settings, tmp_path, queued):
    settings.GYMWEB_TASKS_INLINE = False
    settings.GYMWEB_MAX_TASKS_PER_USER = 1
    settings.GYMWEB_WRITE_LEASE_S = LEASE_S  # as the killed worker's: the page's reason names it
    settings.DATA_DIR = tmp_path / "data"
    return queued


def _import(client, path):
    with path.open("rb") as fh:
        return client.post(reverse("import"), {"rollouts": fh})


def test_an_import_whose_worker_is_killed_fails_with_its_reason_and_can_be_submitted_again(
    tmp_path, signed_in, queued_tasks
):
    from rollouts.models import BackgroundTask

    path = _rollouts_file(tmp_path / "killed_rollouts.jsonl", 40_000)
    first = _import(signed_in, path)
    task = BackgroundTask.objects.get()
    assert first["Location"] == reverse("task", args=[task.pk])
    proc = _start(["-c", RUN_TASK, str(task.pk)], tmp_path)  # the worker's entry point, in its own process
    _kill_once(proc, lambda: Rollout.objects.exists(), tmp_path, "import")

    time.sleep(LEASE_S + 0.5)  # no sweep runs (no qcluster): the page itself sees the lease lapsed
    page = signed_in.get(first["Location"]).content.decode()
    assert 'data-status="failed"' in page
    assert "The worker running this import stopped (no sign of it for GYMWEB_WRITE_LEASE_S, 6 s" in page
    assert "nothing of it was kept; submit it again." in page

    again = _import(signed_in, path)  # the same file: a new task (not the dead one), in the one free slot
    assert again.status_code == 302 and again["Location"] != first["Location"]
    assert BackgroundTask.objects.filter(status=BackgroundTask.Status.QUEUED).count() == 1
    supervise()  # the sweep deletes what the killed worker stored
    assert not Rollout.objects.exists() and not Run.objects.exists()


def test_a_worker_killed_while_reading_its_file_frees_its_slot_through_the_sweep(tmp_path, signed_in, queued_tasks):
    from rollouts.models import BackgroundTask, Dataset

    path = _rollouts_file(tmp_path / "read_rollouts.jsonl", 200_000)
    _import(signed_in, path)
    task = BackgroundTask.objects.get()
    proc = _start(["-c", RUN_TASK, str(task.pk)], tmp_path)
    try:  # killed as soon as it claimed the task: before its writer took any lease
        wait_for(
            lambda: BackgroundTask.objects.get(pk=task.pk).status != BackgroundTask.Status.QUEUED or proc.poll(),
            60,
            what="the worker's claim",
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
    assert BackgroundTask.objects.get(pk=task.pk).alive_until is not None  # the claim took the task's lease

    time.sleep(LEASE_S + 0.5)
    supervise()  # the qcluster's scheduled job fails it, before anyone looks at it
    task.refresh_from_db()
    assert task.status == BackgroundTask.Status.FAILED and "submit it again" in task.message
    assert not Run.objects.exists() and not Dataset.objects.exists()
    assert _import(signed_in, path).status_code == 302  # the slot is free


def test_a_live_worker_keeps_its_task_running_past_the_lease(tmp_path, user, queued_tasks):
    from rollouts import background
    from rollouts.models import BackgroundTask

    task, _ = background.start(BackgroundTask.Kind.CHECK_AGENT, user, {"agent_url": "http://127.0.0.1:1"})
    BackgroundTask.objects.filter(pk=task.pk).update(status=BackgroundTask.Status.RUNNING, alive_until=writing.lease())
    beat = background._Lease(task.pk)
    try:
        time.sleep(2 * LEASE_S)
        now = background.current(BackgroundTask.objects.get(pk=task.pk))
        assert background.reap() == 0 and now.status == BackgroundTask.Status.RUNNING
    finally:
        beat.stop()
    time.sleep(LEASE_S + 0.5)
    assert background.reap() == 1
