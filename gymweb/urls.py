"""URL routes: the dashboard lives in the rollouts app; auth uses Django's own views."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from django.views.generic import RedirectView

from rollouts.api.router import api
from rollouts.operations.probes import healthz, readyz
from rollouts.operations.prometheus import metrics_view


class FaviconView(RedirectView):
    """``/favicon.ico`` (which browsers ask for on every page) → the static SVG icon."""

    permanent = False

    def get_redirect_url(self, *args, **kwargs):
        return static("gymweb/favicon.svg")


@csrf_exempt  # an API call carries a token, not the site's CSRF cookie: a JSON 404 whatever the method
def api_not_found(request, rest: str = "") -> JsonResponse:
    """Any other path under ``/api/``: the API's JSON 404 (``{"detail": ...}``), not the site's page."""
    return JsonResponse({"detail": f"Not Found: no API route {request.path} (GET /api/v1/docs lists them)"}, status=404)


urlpatterns = [
    # For load balancers and Prometheus: no sign-in (/metrics wants its token or an allowed address).
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    # A signed-in user who opens the sign-in page goes to the runs list (or to ``next``).
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("favicon.ico", FaviconView.as_view(), name="favicon"),
    path("api/v1/", api_not_found),  # django-ninja's own root answers the site's HTML 404
    path("api/v1/", api.urls),  # the HTTP API (rollouts.api)
    re_path(r"^api(?:/(?P<rest>.*))?$", api_not_found),  # /api, /api/, /api/v2/…, /api/v1/<unknown>
    path("", include("rollouts.web.urls")),
]
