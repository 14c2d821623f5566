"""The django-q2 Schedule admin cannot schedule a Python callable: a schedule names any
importable function to run on the workers, so the admin lists schedules read-only."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django_q.models import Schedule


@pytest.fixture
def admin_client_(db, client, django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="x" * 12)
    client.force_login(root)
    return client


def test_a_superuser_sees_the_schedules_but_cannot_add_one(admin_client_):
    listing = admin_client_.get(reverse("admin:django_q_schedule_changelist"))
    assert listing.status_code == 200
    assert reverse("admin:django_q_schedule_add") not in listing.content.decode()
    added = admin_client_.post(
        reverse("admin:django_q_schedule_add"),
        {
            "name": "pwn",
            "func": "os.system",
            "args": "'touch /tmp/pwned'",
            "schedule_type": "O",
            "repeats": "-1",
        },
    )
    assert added.status_code == 403
    assert not Schedule.objects.filter(name="pwn").exists()


def test_a_superuser_cannot_change_or_delete_the_supervisor_schedule(admin_client_):
    schedule = Schedule.objects.create(
        name="gymweb-supervise-test",
        func="rollouts.workers.claims.supervise",
        schedule_type=Schedule.MINUTES,
        minutes=1,
        repeats=-1,
    )
    change_url = reverse("admin:django_q_schedule_change", args=[schedule.pk])
    page = admin_client_.get(change_url)
    assert page.status_code == 200 and 'name="func"' not in page.content.decode()  # view only
    changed = admin_client_.post(
        change_url, {"name": schedule.name, "func": "os.system", "schedule_type": "O", "repeats": "-1"}
    )
    assert changed.status_code == 403
    deleted = admin_client_.post(reverse("admin:django_q_schedule_delete", args=[schedule.pk]), {"post": "yes"})
    assert deleted.status_code == 403
    schedule.refresh_from_db()
    assert schedule.func == "rollouts.workers.claims.supervise"
