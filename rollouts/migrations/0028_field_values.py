# The run table's kept field values (rollouts.review.field_values) and an index that serves the
# table's order and its superseded-attempt test without reading the rollouts' rows.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("rollouts", "0027_label_team"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="rollout",
            index=models.Index(
                fields=["run", "task_index", "rollout_index", "attempt", "status", "id"], name="rollout_run_order"
            ),
        ),
        migrations.CreateModel(
            name="FieldExtract",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("field", models.CharField(max_length=500)),
                ("upto_seq", models.BigIntegerField(default=0)),
                ("upto_id", models.BigIntegerField(default=0)),
                ("made", models.DateTimeField(auto_now_add=True)),
                (
                    "run",
                    models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="rollouts.run"),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("run", "field"), name="fieldextract_one_per_field")],
            },
        ),
        migrations.CreateModel(
            name="FieldValue",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("field", models.CharField(max_length=500)),
                ("number", models.FloatField(null=True)),
                ("text", models.TextField(null=True)),
                (
                    "rollout",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="field_values",
                        to="rollouts.rollout",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="rollouts.run",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["run", "field", "number"], name="fieldvalue_run_number"),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("rollout", "field"), name="fieldvalue_one_per_rollout"),
                ],
            },
        ),
    ]
