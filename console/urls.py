from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("console.page_urls")),
    path("api/v1/", include("jobs.api.urls")),
    path("api/v1/", include("incidents.api.urls")),
    path("api/v1/", include("recovery.api.urls")),
    path("api/v1/schema", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]
