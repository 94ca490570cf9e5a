"""The incidents API's routes, under /api/v1/."""

from django.urls import path

from incidents.api import alert_views, views

urlpatterns = [
    path("incidents/", views.IncidentListView.as_view(), name="incident-list"),
    path("incidents/<int:pk>", views.IncidentDetailView.as_view(), name="incident-detail"),
    path(
        "incidents/<int:pk>/resolve", views.IncidentResolveView.as_view(), name="incident-resolve"
    ),
    path("reliability", views.ReliabilityView.as_view(), name="reliability"),
    path("nodes/", views.NodeListView.as_view(), name="node-list"),
    path("jobs/<slug:key>/ranks", views.JobRanksView.as_view(), name="job-ranks"),
    path("detector-settings", views.DetectorSettingsView.as_view(), name="detector-settings"),
    path("alerts", alert_views.AlertListView.as_view(), name="alert-list"),
    path(
        "alerts/alertmanager",
        alert_views.AlertmanagerWebhookView.as_view(),
        name="alerts-alertmanager",
    ),
    path("alerts/settings", alert_views.AlertSettingsView.as_view(), name="alert-settings"),
]
