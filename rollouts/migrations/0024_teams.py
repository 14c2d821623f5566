# Teams: every existing user, run and dataset joins one team, "default"; API tokens get a scope
# (existing tokens stay read-write) and an optional expiry.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models



def into_default_team(apps, schema_editor):
    Team = apps.get_model("rollouts", "Team")
    team, _ = Team.objects.get_or_create(name="default")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    team.members.add(*User.objects.values_list("pk", flat=True))
    apps.get_model("rollouts", "Run").objects.filter(team__isnull=True).update(team=team)
    apps.get_model("rollouts", "Dataset").objects.filter(team__isnull=True).update(team=team)


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0023_background_tasks'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='apitoken',
            name='expires',
            field=models.DateTimeField(blank=True, help_text='refused (401) from then on; empty: never', null=True),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='scope',
            field=models.CharField(choices=[('read', 'read-only'), ('write', 'read-write')], default='write', max_length=8),
        ),
        migrations.CreateModel(
            name='Team',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('members', models.ManyToManyField(blank=True, related_name='teams', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['id'],
            },
        ),
        migrations.AddField(
            model_name='dataset',
            name='team',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='datasets', to='rollouts.team'),
        ),
        migrations.AddField(
            model_name='run',
            name='team',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='rollouts.team'),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='team',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to='rollouts.team'),
        ),
        migrations.RunPython(into_default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='dataset',
            name='team',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='datasets', to='rollouts.team'),
        ),
        migrations.AlterField(
            model_name='run',
            name='team',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='rollouts.team'),
        ),
    ]
