"""Routes of the review pages and actions, and the HTTP API (``/api/v1/``). Included before the
dashboard's own routes (``runs/<id>/export/sft.jsonl`` must win over ``export/<kind>.jsonl``)."""

from django.urls import path

from rollouts.review import views
from rollouts.review.api import api

urlpatterns = [
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/labels/", views.rollout_label, name="review_label"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/notes/", views.rollout_note, name="review_note"),
    path(
        "runs/<int:run_id>/rollouts/<int:rollout_id>/notes/<int:note_id>/delete/",
        views.note_delete,
        name="review_note_delete",
    ),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/correction/", views.rollout_correction, name="review_correction"),
    path("runs/<int:run_id>/review/", views.review_start, name="review_start"),
    path("runs/<int:run_id>/review/next/", views.review_next, name="review_next"),
    path("runs/<int:run_id>/review/reset/", views.review_reset, name="review_reset"),
    path("runs/<int:run_id>/selection/dataset/", views.selection_dataset, name="selection_dataset"),
    path("runs/<int:run_id>/export/sft.jsonl", views.run_export_sft, name="run_export_sft"),
    path("runs/<int:run_id>/export/sft-check/", views.run_export_sft_check, name="run_export_sft_check"),
    path("datasets/<int:dataset_id>/new-run/", views.dataset_new_run, name="dataset_new_run"),
    path("labels/", views.labels_page, name="labels"),
    path("labels/<int:label_id>/up/", views.label_up, name="label_up"),
    path("account/", views.account, name="account"),
    path("account/tokens/<int:token_id>/delete/", views.token_delete, name="token_delete"),
    path("api/v1/", api.urls),
]
