# A dataset keeps the name it came with (the uploaded file's, the selection's) apart from its
# display name, which can be renamed.

from django.db import migrations
from django.db.models import F

import rollouts.lossless


def _copy_names(apps, schema_editor):
    Dataset = apps.get_model("rollouts", "Dataset")
    Dataset.objects.filter(source_name="").update(source_name=F("name"))


class Migration(migrations.Migration):
    dependencies = [
        ("rollouts", "0024_teams"),
    ]

    operations = [
        migrations.AddField(
            model_name="dataset",
            name="source_name",
            field=rollouts.lossless.LosslessCharField(blank=True, max_length=200),
        ),
        migrations.RunPython(_copy_names, migrations.RunPython.noop),
    ]
