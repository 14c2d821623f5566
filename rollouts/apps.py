from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    """The domain app: runs, rollouts, trajectories, workers and pages."""

    name = "rollouts"
    default_auto_field = "django.db.models.BigAutoField"
