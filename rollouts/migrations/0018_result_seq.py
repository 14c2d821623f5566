# The results stream's finishing order: one column and its index. Existing rows keep it empty (the
# stream puts them first, in id order).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0017_environments'),
    ]

    operations = [
        migrations.AddField(
            model_name='rollout',
            name='result_seq',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='rollout',
            index=models.Index(fields=['run', 'result_seq'], name='rollout_run_result_seq'),
        ),
    ]
