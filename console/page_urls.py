from django.contrib.auth import views as auth_views
from django.urls import path

from console.pages import (
    approvals,
    incidents,
    jobs,
    live,
    maintenance,
    nodes,
    overview,
    reliability,
)
from console.signin import SignInView

app_name = "console"
urlpatterns = [
    path("login/", SignInView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="/login/"), name="logout"),
    *overview.urls,
    *jobs.urls,
    *incidents.urls,
    *approvals.urls,
    *nodes.urls,
    *reliability.urls,
    *maintenance.urls,
    *live.urls,
]
