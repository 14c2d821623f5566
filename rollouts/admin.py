"""Admin: teams and their members; django-q2's schedules are read-only here.

django-q2's own Schedule admin lets any superuser add or edit a schedule whose ``func`` is any
importable Python callable, with any arguments, run on every worker: code execution for anyone
who gets into the admin. gymweb's only schedule (``gymweb-supervise``) is made by code
(``rollouts.apps``), so the admin may list schedules but never add, change or delete one.
"""

from django.contrib import admin
from django_q.admin import ScheduleAdmin
from django_q.models import Schedule

from rollouts.models import Team


class ReadOnlyScheduleAdmin(ScheduleAdmin):
    """django-q2's schedule list, with no add, change or delete."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


if admin.site.is_registered(Schedule):
    admin.site.unregister(Schedule)
admin.site.register(Schedule, ReadOnlyScheduleAdmin)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    """Teams and their members (``rollouts.teams``): a user sees their teams' runs only."""

    list_display = ("name", "created")
    search_fields = ("name",)
    filter_horizontal = ("members",)
