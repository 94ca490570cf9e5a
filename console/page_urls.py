from django.urls import path

from console import views

app_name = "console"
urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("jobs/<slug:key>/", views.job_detail, name="job-detail"),
]
