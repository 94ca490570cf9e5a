"""The notify API's routes, under /api/v1/."""

from django.urls import path

from notify.api import views

urlpatterns = [
    path("notify/channels", views.ChannelListView.as_view(), name="notify-channel-list"),
    path(
        "notify/channels/<int:pk>",
        views.ChannelDetailView.as_view(),
        name="notify-channel-detail",
    ),
    path(
        "notify/channels/<int:pk>/test",
        views.ChannelTestView.as_view(),
        name="notify-channel-test",
    ),
    path("notify/rules", views.RuleListView.as_view(), name="notify-rule-list"),
    path("notify/rules/<int:pk>", views.RuleDetailView.as_view(), name="notify-rule-detail"),
    path(
        "notify/notifications",
        views.NotificationListView.as_view(),
        name="notify-notification-list",
    ),
]
