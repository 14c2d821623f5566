"""Dashboard routes. Run pages live in ``views``; the other pages in their ``*_views`` module. Review
pages and actions, labels and the account page (``review_views``) are listed first:
``runs/<id>/export/sft.jsonl`` must win over ``export/<kind>.jsonl``."""

from django.urls import path
from django.views.generic import RedirectView

from rollouts.web import (
    archive_views,
    chart_views,
    check_views,
    compare_views,
    dataset_views,
    environment_views,
    evaluation_views,
    import_views,
    profile_views,
    queue_views,
    review_views,
    run_name_views,
    task_views,
    trajectory_views,
    views,
)

urlpatterns = [
    # -- review pages and actions, labels, the account page
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/labels/", review_views.rollout_label, name="review_label"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/notes/", review_views.rollout_note, name="review_note"),
    path(
        "runs/<int:run_id>/rollouts/<int:rollout_id>/notes/<int:note_id>/delete/",
        review_views.note_delete,
        name="review_note_delete",
    ),
    path(
        "runs/<int:run_id>/rollouts/<int:rollout_id>/correction/",
        review_views.rollout_correction,
        name="review_correction",
    ),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/rubric/", review_views.rollout_rubric, name="review_rubric"),
    path("runs/<int:run_id>/review/", review_views.review_start, name="review_start"),
    path("runs/<int:run_id>/review/next/", review_views.review_next, name="review_next"),
    path("runs/<int:run_id>/review/reset/", review_views.review_reset, name="review_reset"),
    path("runs/<int:run_id>/selection/dataset/", review_views.selection_dataset, name="selection_dataset"),
    path("runs/<int:run_id>/export/sft.jsonl", review_views.run_export_sft, name="run_export_sft"),
    path("runs/<int:run_id>/export/sft-check/", review_views.run_export_sft_check, name="run_export_sft_check"),
    path("datasets/<int:dataset_id>/new-run/", review_views.dataset_new_run, name="dataset_new_run"),
    path("datasets/rename/", dataset_views.dataset_rename, name="dataset_rename"),
    path("labels/", review_views.labels_page, name="labels"),
    path("labels/<int:label_id>/up/", review_views.label_up, name="label_up"),
    path("labels/rubric/", review_views.label_rubric, name="label_rubric"),
    # -- review queues
    path("queues/", queue_views.queues_list, name="queues"),
    path("queues/<int:queue_id>/", queue_views.queue_page, name="queue"),
    path("queues/<int:queue_id>/assign/", queue_views.queue_assign, name="queue_assign"),
    path("queues/<int:queue_id>/next/", queue_views.queue_next, name="queue_next"),
    path("runs/<int:run_id>/queue/add/", queue_views.queue_add, name="queue_add"),
    path("account/", review_views.account, name="account"),
    path("account/tokens/<int:token_id>/delete/", review_views.token_delete, name="token_delete"),
    # -- run pages
    path("", views.runs_list, name="runs"),
    path("runs/", RedirectView.as_view(pattern_name="runs", query_string=True)),  # where people look for the list
    path("runs/new/", views.run_new, name="run_new"),
    path("runs/<int:run_id>/", views.run_detail, name="run"),
    path("runs/<int:run_id>/live/", views.run_live, name="run_live"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path("runs/<int:run_id>/rename/", run_name_views.run_rename, name="run_rename"),
    path("runs/<int:run_id>/retry/", views.run_retry, name="run_retry"),
    path("runs/<int:run_id>/delete/", archive_views.run_delete, name="run_delete"),
    path("runs/<int:run_id>/archive/", archive_views.run_archive, name="run_archive"),
    path("runs/<int:run_id>/restore/", archive_views.run_restore, name="run_restore"),
    path("runs/<int:run_id>/export/<str:kind>.jsonl", views.run_export, name="run_export"),
    path(
        "runs/<int:run_id>/export/rollouts_aggregate_metrics.json",
        profile_views.run_aggregate_metrics_file,
        name="run_aggregate_metrics",
    ),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/", trajectory_views.rollout_detail, name="rollout"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/live/", trajectory_views.rollout_live, name="rollout_live"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/find/", trajectory_views.rollout_find, name="rollout_find"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/raw.json", trajectory_views.rollout_raw, name="rollout_raw"),
    path(
        "runs/<int:run_id>/rollouts/<int:rollout_id>/items/<str:key>/",
        trajectory_views.rollout_item,
        name="rollout_item",
    ),
    path("import/", import_views.import_rollouts, name="import"),
    path("runs/<int:run_id>/profile/", profile_views.run_profile, name="run_profile"),
    path("runs/<int:run_id>/profile/files/<str:kind>", profile_views.run_profile_file, name="run_profile_file"),
    path("runs/<int:run_id>/charts/", chart_views.run_charts, name="run_charts"),
    path("runs/<int:run_id>/evaluation/", evaluation_views.run_evaluation, name="run_evaluation"),
    path("runs/<int:run_id>/health/", evaluation_views.run_health_check, name="run_health_check"),
    path("runs/<int:run_id>/health/<str:kind>", evaluation_views.run_health_file, name="run_health_file"),
    path("runs/<int:run_id>/reverify/", evaluation_views.run_reverify, name="run_reverify"),
    path("runs/<int:run_id>/atif.zip", evaluation_views.run_atif, name="run_atif"),
    path("compare/", compare_views.compare, name="compare"),
    path("compare/compare_report.<str:fmt>", compare_views.compare_report_file, name="compare_report_file"),
    path("check/", check_views.check_agent, name="check_agent"),
    path("tasks/<int:task_id>/", task_views.task_page, name="task"),
    path("environments/", environment_views.environments_page, name="environments"),
    path("runs/<int:run_id>/nemo_gym_config.yaml", environment_views.run_nemo_config, name="run_nemo_config"),
]
