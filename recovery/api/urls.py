from django.urls import path

from recovery.api import views

urlpatterns = [
    path("actions/", views.ActionListView.as_view(), name="action-list"),
    path("actions/<int:pk>", views.ActionDetailView.as_view(), name="action-detail"),
    path("actions/<int:pk>/approve", views.ActionApproveView.as_view(), name="action-approve"),
    path("actions/<int:pk>/reject", views.ActionRejectView.as_view(), name="action-reject"),
    path("actions/<int:pk>/cancel", views.ActionCancelView.as_view(), name="action-cancel"),
    path(
        "clusters/<slug:name>/recovery",
        views.ClusterRecoveryView.as_view(),
        name="cluster-recovery",
    ),
    path("clusters/<slug:name>/pause", views.ClusterPauseView.as_view(), name="cluster-pause"),
    path("clusters/<slug:name>/resume", views.ClusterResumeView.as_view(), name="cluster-resume"),
    path("incidents/<int:pk>/phases", views.IncidentPhasesView.as_view(), name="incident-phases"),
    path("reliability/phases", views.PhasesSummaryView.as_view(), name="reliability-phases"),
    path("launches", views.LaunchView.as_view(), name="launches"),
    path("clusters/<slug:name>/faults", views.ClusterFaultView.as_view(), name="cluster-faults"),
]
