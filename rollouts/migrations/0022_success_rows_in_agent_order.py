"""Store again the profile numbers of collected runs' successes, from their rows in NeMo Gym's order.

A collected run's ``rollouts.jsonl`` row is now the env's ``/verify`` reply as NeMo Gym's agent
returns it (``rollouts.engine.nemo_request.agent_result``: its verify-response model's fields
first, then the reply's others), computed when the row is written, while ``verify_json`` keeps the
reply as the env sent it. The profiler reads top-level numbers in row order, so numbers stored from
the reply's own order would give another column order than the file: each success of a collected,
not reverified, not archived run gets them again from the row as the export now writes it. Imported
and reverified runs' rows keep their order (unchanged numbers); an archived run has no reply left and
its archived files were written, and its numbers stored, in one order.

Keyset batches by primary key, each in its own transaction; only changed values are written.
"""

import json

from django.db import migrations, transaction

BATCH = 200


def _numbers_text(verify_json, task_index, rollout_index, task_json, agent_name):
    from rollouts.collection.profile_numbers import dumps_profile_numbers, profile_numbers
    from rollouts.engine.nemo_request import agent_result

    try:
        row = json.loads(verify_json)
        task_row = json.loads(task_json)
    except ValueError:
        return None
    if not isinstance(row, dict) or not isinstance(task_row, dict):
        return None
    row = agent_result(row)
    row["_ng_task_index"] = task_index
    row["_ng_rollout_index"] = rollout_index
    row["agent_ref"] = task_row.get("agent_ref") or {"name": agent_name}
    try:
        return dumps_profile_numbers(profile_numbers(row))
    except (TypeError, ValueError, RecursionError):
        return None


def refill_profile_json(apps, schema_editor):
    Rollout = apps.get_model("rollouts", "Rollout")
    db = schema_editor.connection.alias
    todo = (
        Rollout.objects.using(db)
        .filter(status="succeeded", run__reverified_from__isnull=True, run__archived__isnull=True)
        .exclude(run__status="imported")
        .exclude(verify_json="")
        .order_by("pk")
        .values_list(
            "pk", "task_index", "rollout_index", "verify_json", "task__row_json", "run__agent_name", "profile_json"
        )
    )
    last = 0
    while True:
        batch = list(todo.filter(pk__gt=last)[:BATCH])
        if not batch:
            return
        last = batch[-1][0]
        updates = []
        for pk, task_index, rollout_index, verify_json, task_json, agent_name, old in batch:
            text = _numbers_text(verify_json, task_index, rollout_index, task_json, agent_name)
            if text is not None and text != old:
                updates.append(Rollout(pk=pk, profile_json=text))
        if updates:
            with transaction.atomic(using=db):
                Rollout.objects.using(db).bulk_update(updates, ["profile_json"])


class Migration(migrations.Migration):
    dependencies = [("rollouts", "0021_run_archive")]

    operations = [migrations.RunPython(refill_profile_json, migrations.RunPython.noop)]
