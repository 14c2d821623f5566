"""Lossless text on every backend (issue 9; ``rollouts/lossless.py``).

- The JSON columns (``TrajectoryItem.payload``, ``AgentCall.usage``/``incomplete_details``,
  ``Rollout.warnings``, ``Run.overrides``/``aggregate_metrics``/``health_summary``,
  ``RolloutHealth.findings``/``finding_steps``/``unobserved``) become JSON text in ``text`` columns
  (``JSONTextField``). On PostgreSQL the ``jsonb`` values are cast to text (what ``jsonb`` already
  changed, key order and number spelling, cannot be recovered; nothing else changes). On SQLite the
  table is rebuilt with the same JSON text.
- The plain-text columns that hold what agents, envs, files and users send become
  ``LosslessTextField``/``LosslessCharField``: same column types (no schema change), but U+0000 and
  the escape character U+FDD0 are now stored encoded, so existing rows holding either are encoded
  here (PostgreSQL never held U+0000; SQLite may have): each column is scanned once, in keyset
  batches, and only the rows that hold one of the two characters are rewritten.
- ``Rollout.storage_error``: what of an attempt could not be stored.
"""
from django.db import migrations

import rollouts.lossless

ESCAPE = "\ufdd0"
BATCH = 500

# (table, column) of every lossless plain-text column
TEXT_COLUMNS = [
    ("rollouts_dataset", "name"),
    ("rollouts_run", "name"),
    ("rollouts_run", "agent_name"),
    ("rollouts_run", "source_file"),
    ("rollouts_run", "aggregate_metrics_error"),
    ("rollouts_rollout", "failure_kind"),
    ("rollouts_rollout", "error"),
    ("rollouts_agentcall", "response_id"),
    ("rollouts_agentcall", "model"),
    ("rollouts_agentcall", "error"),
    ("rollouts_trajectoryitem", "kind"),
    ("rollouts_trajectoryitem", "role"),
    ("rollouts_trajectoryitem", "call_id"),
    ("rollouts_trajectoryitem", "name"),
]


def _encode(text):
    return text.replace(ESCAPE, ESCAPE + ESCAPE).replace("\x00", ESCAPE + "0")


def encode_existing(apps, schema_editor):
    connection = schema_editor.connection
    qn = connection.ops.quote_name
    if connection.vendor == "sqlite":
        # SQLite's LIKE stops at U+0000; instr() does not.
        where = "instr({c}, char(0)) > 0 OR instr({c}, %s) > 0"
    elif connection.vendor == "postgresql":
        where = "strpos({c}, %s) > 0"  # text columns there cannot hold U+0000
    else:
        where = "{c} LIKE '%%' || %s || '%%'"
    for table, column in TEXT_COLUMNS:
        c = qn(column)
        last = 0
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT id, {c} FROM {qn(table)} WHERE id > %s AND ({where.format(c=c)}) ORDER BY id LIMIT {BATCH}",
                    [last, ESCAPE],
                )
                rows = cursor.fetchall()
                for pk, value in rows:
                    cursor.execute(f"UPDATE {qn(table)} SET {c} = %s WHERE id = %s", [_encode(value), pk])
            if len(rows) < BATCH:
                break
            last = rows[-1][0]


def _state_only(model_name, name, field):
    """The column type does not change: only Django's idea of the field does."""
    return migrations.SeparateDatabaseAndState(state_operations=[migrations.AlterField(model_name=model_name, name=name, field=field)])


class Migration(migrations.Migration):
    dependencies = [
        ("rollouts", "0009_health_and_reverify"),
    ]

    operations = [
        migrations.AddField(
            model_name="rollout",
            name="storage_error",
            field=rollouts.lossless.LosslessTextField(blank=True),
        ),
        # JSON columns: jsonb (PostgreSQL) / checked text (SQLite) -> plain text holding JSON text
        migrations.AlterField(
            model_name="trajectoryitem",
            name="payload",
            field=rollouts.lossless.JSONTextField(help_text="the item as it came, JSON text"),
        ),
        migrations.AlterField(model_name="agentcall", name="usage", field=rollouts.lossless.JSONTextField(blank=True, null=True)),
        migrations.AlterField(model_name="agentcall", name="incomplete_details", field=rollouts.lossless.JSONTextField(blank=True, null=True)),
        migrations.AlterField(model_name="rollout", name="warnings", field=rollouts.lossless.JSONTextField(blank=True, default=list)),
        migrations.AlterField(
            model_name="run",
            name="overrides",
            field=rollouts.lossless.JSONTextField(blank=True, default=dict, help_text="merged into responses_create_params"),
        ),
        migrations.AlterField(
            model_name="run",
            name="aggregate_metrics",
            field=rollouts.lossless.JSONTextField(blank=True, help_text="the env's /aggregate_metrics reply", null=True),
        ),
        migrations.AlterField(model_name="run", name="health_summary", field=rollouts.lossless.JSONTextField(blank=True, null=True)),
        migrations.AlterField(model_name="rollouthealth", name="findings", field=rollouts.lossless.JSONTextField(blank=True, default=list)),
        migrations.AlterField(model_name="rollouthealth", name="finding_steps", field=rollouts.lossless.JSONTextField(blank=True, default=list)),
        migrations.AlterField(model_name="rollouthealth", name="unobserved", field=rollouts.lossless.JSONTextField(blank=True, default=list)),
        # plain text: same columns, lossless fields
        _state_only("dataset", "name", rollouts.lossless.LosslessCharField(max_length=200)),
        _state_only("run", "name", rollouts.lossless.LosslessCharField(max_length=200)),
        _state_only("run", "agent_name", rollouts.lossless.LosslessCharField(default="remote_agent", max_length=200)),
        _state_only("run", "source_file", rollouts.lossless.LosslessCharField(blank=True, max_length=500)),
        _state_only("run", "aggregate_metrics_error", rollouts.lossless.LosslessTextField(blank=True)),
        _state_only("rollout", "failure_kind", rollouts.lossless.LosslessCharField(blank=True, max_length=40)),
        _state_only("rollout", "error", rollouts.lossless.LosslessTextField(blank=True)),
        _state_only("agentcall", "response_id", rollouts.lossless.LosslessCharField(blank=True, max_length=300)),
        _state_only("agentcall", "model", rollouts.lossless.LosslessCharField(blank=True, max_length=300)),
        _state_only("agentcall", "error", rollouts.lossless.LosslessTextField(blank=True)),
        _state_only("trajectoryitem", "kind", rollouts.lossless.LosslessCharField(max_length=40)),
        _state_only("trajectoryitem", "role", rollouts.lossless.LosslessCharField(blank=True, max_length=20)),
        _state_only("trajectoryitem", "call_id", rollouts.lossless.LosslessCharField(blank=True, max_length=300)),
        _state_only("trajectoryitem", "name", rollouts.lossless.LosslessCharField(blank=True, max_length=300)),
        migrations.RunPython(encode_existing, migrations.RunPython.noop, elidable=False),
    ]
