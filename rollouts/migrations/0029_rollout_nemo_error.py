# NeMo Gym 0.7.0's `error` text of a failed attempt (rollouts.engine.nemo_errors), which the failures
# sidecar and the results stream write; gymweb's own message stays in `error`. Blank on older rows.

from django.db import migrations

import rollouts.lossless


class Migration(migrations.Migration):
    dependencies = [
        ("rollouts", "0028_field_values"),
    ]

    operations = [
        migrations.AddField(
            model_name="rollout",
            name="nemo_error",
            field=rollouts.lossless.LosslessTextField(blank=True),
        ),
    ]
