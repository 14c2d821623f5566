# Review queues (a team's rollouts from several runs, assigned, reviewed) and the label set's
# rubric with its answers per reviewer.

import django.db.models.deletion
import rollouts.lossless
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0025_dataset_source_name'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ReviewQueue',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', rollouts.lossless.LosslessCharField(max_length=200)),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='review_queues', to='rollouts.team')),
            ],
            options={
                'ordering': ['-created', '-id'],
            },
        ),
        migrations.CreateModel(
            name='Rubric',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('definition_json', rollouts.lossless.JSONTextField()),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['id'],
            },
        ),
        migrations.CreateModel(
            name='QueueEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('added_at', models.DateTimeField(auto_now_add=True)),
                ('reviewed_at', models.DateTimeField(blank=True, null=True)),
                ('added_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('assigned_to', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('reviewed_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('rollout', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='queue_entries', to='rollouts.rollout')),
                ('queue', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='entries', to='rollouts.reviewqueue')),
            ],
            options={
                'ordering': ['id'],
                'indexes': [models.Index(fields=['queue', 'reviewed_at', 'assigned_to'], name='queue_entry_todo')],
                'constraints': [models.UniqueConstraint(fields=('queue', 'rollout'), name='queue_entry_unique')],
            },
        ),
        migrations.CreateModel(
            name='RubricAnswer',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('values_json', rollouts.lossless.JSONTextField()),
                ('updated', models.DateTimeField(auto_now=True)),
                ('rollout', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='rubric_answers', to='rollouts.rollout')),
                ('rubric', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='answers', to='rollouts.rubric')),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['updated', 'id'],
                'constraints': [models.UniqueConstraint(fields=('rollout', 'user'), name='rubric_answer_unique')],
            },
        ),
    ]
