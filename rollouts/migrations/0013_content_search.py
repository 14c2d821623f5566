"""Content search across a run (issue 11): ``TrajectoryItem.search_text`` filled for the items
stored before, the ``(kind, name, rollout)`` index for "tool called", and the backend's text index
(``rollouts.search.ensure_index``: FTS5 trigram on SQLite, pg_trgm GIN on PostgreSQL)."""
from django.db import migrations, models

BATCH = 2000


def fill_search_text(apps, schema_editor):
    import json

    from rollouts.search import ITEM_TABLE, item_search_text

    connection = schema_editor.connection
    last = 0
    with connection.cursor() as cursor:
        while True:
            cursor.execute(f"SELECT id, payload FROM {ITEM_TABLE} WHERE id > %s ORDER BY id LIMIT {BATCH}", [last])
            rows = cursor.fetchall()
            if not rows:
                break
            last = rows[-1][0]
            updates = []
            for pk, payload in rows:
                try:
                    text = item_search_text(json.loads(payload))
                except ValueError:
                    text = ""
                if text:
                    updates.append((text, pk))
            if updates:
                cursor.executemany(f"UPDATE {ITEM_TABLE} SET search_text = %s WHERE id = %s", updates)


def build_index(apps, schema_editor):
    from rollouts.search import ensure_index

    ensure_index(schema_editor.connection)


def drop_index(apps, schema_editor):
    from rollouts.search import FTS_TABLE, TRGM_INDEX

    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for suffix in ("ai", "ad", "au"):
                cursor.execute(f"DROP TRIGGER IF EXISTS {FTS_TABLE}_{suffix}")
            cursor.execute(f"DROP TABLE IF EXISTS {FTS_TABLE}")
        elif connection.vendor == "postgresql":
            cursor.execute(f"DROP INDEX IF EXISTS {TRGM_INDEX}")


class Migration(migrations.Migration):

    dependencies = [
        ("rollouts", "0012_review"),
    ]

    operations = [
        migrations.AddField(
            model_name="trajectoryitem",
            name="search_text",
            field=models.TextField(blank=True, default="", editable=False),
        ),
        migrations.AddIndex(
            model_name="trajectoryitem",
            index=models.Index(fields=["kind", "name", "rollout"], name="item_kind_name"),
        ),
        migrations.RunPython(fill_search_text, migrations.RunPython.noop, elidable=False),
        migrations.RunPython(build_index, drop_index, elidable=False),
    ]
