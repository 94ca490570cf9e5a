from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console.metrics.views import metrics


class FaviconView(RedirectView):
    """/favicon.ico, which browsers ask for whatever a page links, to the static icon
    (its URL is looked up per request: in production it carries the file's hash)."""

    permanent = False

    def get_redirect_url(self, *args, **kwargs):
        return static("favicon.svg")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("favicon.ico", FaviconView.as_view()),
    path("metrics", metrics, name="metrics"),  # Prometheus (docs/monitoring.md)
    path("", include("console.page_urls")),
    path("api/v1/", include("jobs.api.urls")),
    path("api/v1/", include("incidents.api.urls")),
    path("api/v1/", include("recovery.api.urls")),
    path("api/v1/", include("notify.api.urls")),
    path("api/v1/schema", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

# What escapes every view (production mode): JSON under /api/, pages elsewhere.
handler404 = "console.exceptions.handler404"
handler500 = "console.exceptions.handler500"
