# Labels per team: every existing label goes to the "default" team (as 0024 did for runs and
# datasets); a label name is unique within its team, no longer instance-wide. Every other team
# gets the default set (post_migrate: rollouts.review.actions.ensure_default_labels).

import django.db.models.deletion
from django.db import migrations, models


def into_default_team(apps, schema_editor):
    Team = apps.get_model("rollouts", "Team")
    Label = apps.get_model("rollouts", "Label")
    if Label.objects.filter(team__isnull=True).exists():
        team, _ = Team.objects.get_or_create(name="default")
        Label.objects.filter(team__isnull=True).update(team=team)


class Migration(migrations.Migration):

    dependencies = [
        ("rollouts", "0026_review_queues"),
    ]

    operations = [
        migrations.AddField(
            model_name="label",
            name="team",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.CASCADE, related_name="labels", to="rollouts.team"
            ),
        ),
        migrations.RunPython(into_default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="label",
            name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="labels", to="rollouts.team"
            ),
        ),
        migrations.AlterField(
            model_name="label",
            name="name",
            field=models.CharField(max_length=40),
        ),
        migrations.AddConstraint(
            model_name="label",
            constraint=models.UniqueConstraint(fields=("team", "name"), name="label_team_name"),
        ),
    ]
