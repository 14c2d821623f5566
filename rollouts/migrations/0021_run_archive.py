# Archived runs (rollouts.collection.archive): when and where a run's items were archived.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0020_imported_lines'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='archived',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='archive_path',
            field=models.CharField(blank=True, max_length=1000),
        ),
    ]
