"""Dashboard routes."""
from django.urls import path

from . import views

urlpatterns = [
    path("", views.runs_list, name="runs"),
    path("runs/<int:run_id>/", views.run_detail, name="run"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/", views.rollout_detail, name="rollout"),
]
