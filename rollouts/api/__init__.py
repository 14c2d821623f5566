"""The HTTP API under ``/api/v1/`` (django-ninja): ``router`` (the API object, its auth and most
routes), ``trainer`` (batches in, results out, one rollout whole), ``archive`` (delete, archive,
restore) and ``openapi`` (what the OpenAPI document declares beyond the routes' signatures)."""
