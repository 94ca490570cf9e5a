from django.urls import path

from jobs.api import views

urlpatterns = [
    path("ingest", views.IngestView.as_view(), name="ingest"),
    path("jobs/", views.JobListView.as_view(), name="job-list"),
    path("jobs/<slug:key>/", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<slug:key>/goodput", views.JobGoodputView.as_view(), name="job-goodput"),
    path("jobs/<slug:key>/attempts", views.JobAttemptsView.as_view(), name="job-attempts"),
    path("jobs/<slug:key>/checkpoints", views.JobCheckpointsView.as_view(), name="job-checkpoints"),
    path("jobs/<slug:key>/reopen", views.JobReopenView.as_view(), name="job-reopen"),
    path(
        "clusters/<slug:name>/pricing", views.ClusterPricingView.as_view(), name="cluster-pricing"
    ),
]
