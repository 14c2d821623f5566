"""Fill ``Rollout.profile_json`` for successes stored before it existed.

Each success's numbers are ``rollouts.collection.profile_numbers.profile_numbers`` (a pure module, the profiler's own
reduction) of its ``rollouts.jsonl`` row as the export writes it: the stored ``/verify`` reply plus
``_ng_task_index``, ``_ng_rollout_index`` and ``agent_ref`` (the task row's, else
``{"name": run.agent_name}``). Rows whose reply cannot be read stay blank: profiling reads their
``verify_json`` as before.

Streamed in batches by primary key (keyset pages, not one open cursor: SQLite gives no isolation
between a cursor and writes to the same table on one connection), each batch in its own
transaction, so a big table is never held in memory or in one transaction; an interrupted
migration resumes where it stopped (only blank rows are read).
"""
import json

from django.db import migrations, transaction

BATCH = 200


def _numbers_text(verify_json, task_index, rollout_index, task_json, agent_name):
    from rollouts.collection.profile_numbers import dumps_profile_numbers, profile_numbers

    try:
        row = json.loads(verify_json)
        task_row = json.loads(task_json)
    except ValueError:
        return ""
    if not isinstance(row, dict) or not isinstance(task_row, dict):
        return ""
    row["_ng_task_index"] = task_index
    row["_ng_rollout_index"] = rollout_index
    row["agent_ref"] = task_row.get("agent_ref") or {"name": agent_name}
    try:
        return dumps_profile_numbers(profile_numbers(row))
    except (TypeError, ValueError, RecursionError):
        return ""


def fill_profile_json(apps, schema_editor):
    Rollout = apps.get_model("rollouts", "Rollout")
    db = schema_editor.connection.alias
    todo = (
        Rollout.objects.using(db)
        .filter(status="succeeded", profile_json="")
        .exclude(verify_json="")
        .order_by("pk")
        .values_list("pk", "task_index", "rollout_index", "verify_json", "task__row_json", "run__agent_name")
    )
    last = 0
    while True:
        batch = list(todo.filter(pk__gt=last)[:BATCH])
        if not batch:
            return
        last = batch[-1][0]
        updates = []
        for pk, task_index, rollout_index, verify_json, task_json, agent_name in batch:
            text = _numbers_text(verify_json, task_index, rollout_index, task_json, agent_name)
            if text:
                updates.append(Rollout(pk=pk, profile_json=text))
        if updates:
            with transaction.atomic(using=db):
                Rollout.objects.using(db).bulk_update(updates, ["profile_json"])


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("rollouts", "0004_rollout_profile_json"),
    ]

    operations = [
        migrations.RunPython(fill_profile_json, migrations.RunPython.noop),
    ]
