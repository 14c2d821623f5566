from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_supervisor(sender, **kwargs):
    """Keep one django-q2 schedule that revives runs whose workers died (crash recovery)."""
    from django.conf import settings
    from django_q.models import Schedule

    Schedule.objects.update_or_create(
        name="gymweb-supervise",
        defaults={
            "func": "rollouts.workers.claims.supervise",
            "schedule_type": Schedule.MINUTES,
            "minutes": settings.GYMWEB_SUPERVISE_MINUTES,
            "repeats": -1,
        },
    )


def _ensure_search_index(sender, using="default", **kwargs):
    """The content-search index (``rollouts.search.index.ensure_index``) after every ``migrate``: a later
    migration that rebuilds the items table on SQLite drops its triggers; this puts them back and
    refills the index. Nothing happens before migration 0013 added ``search_text``."""
    from django.db import connections

    from rollouts.search.index import ITEM_TABLE, ensure_index

    connection = connections[using]
    with connection.cursor() as cursor:
        if ITEM_TABLE not in connection.introspection.table_names(cursor):
            return
        columns = [c.name for c in connection.introspection.get_table_description(cursor, ITEM_TABLE)]
    if "search_text" in columns:
        ensure_index(connection)


def _on_worker_spawn(sender, proc_name=None, **kwargs):
    """Each django-q2 worker process runs a dispatcher thread (rollouts.workers), and first
    requeues rollouts that died with an earlier worker instead of waiting for the schedule."""
    import logging

    from rollouts.workers.claims import supervise
    from rollouts.workers.process import start_in_worker_process

    try:
        supervise()
    except Exception:  # never keep a worker from starting
        logging.getLogger("gymweb.dispatch").exception("supervise on spawn failed")
    start_in_worker_process()


class RolloutsConfig(AppConfig):
    """The domain app: runs, rollouts, trajectories, workers and pages."""

    name = "rollouts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.conf import settings
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_save
        from django_q.signals import post_spawn

        import gymweb.checks  # noqa: F401  (registers the deploy checks)
        import rollouts.targets  # noqa: F401  (registers the target-policy check)
        from rollouts.lossless import register_sqlite_functions
        from rollouts.models import Team
        from rollouts.review.actions import ensure_default_labels, on_team_saved
        from rollouts.teams import on_user_saved

        connection_created.connect(register_sqlite_functions, dispatch_uid="gymweb-sqlite-functions")
        post_migrate.connect(_ensure_supervisor, sender=self)
        post_migrate.connect(ensure_default_labels, sender=self, dispatch_uid="gymweb-default-labels")
        post_migrate.connect(_ensure_search_index, sender=self, dispatch_uid="gymweb-search-index")
        post_spawn.connect(_on_worker_spawn, dispatch_uid="gymweb-worker-spawn")
        post_save.connect(on_user_saved, sender=settings.AUTH_USER_MODEL, dispatch_uid="gymweb-user-team")
        post_save.connect(on_team_saved, sender=Team, dispatch_uid="gymweb-team-labels")
