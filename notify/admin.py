"""Admin: channels (with their rules inline and a "send test" action), rules, and
notifications with their delivery attempts (read-only: they are a record)."""

from django.contrib import admin, messages
from django.db import models

from notify import services
from notify.models import Channel, DeliveryAttempt, Notification, Rule


class RuleInline(admin.TabularInline):
    model = Rule
    extra = 0
    fields = ["name", "events", "clusters", "severities", "causes", "group_window_s", "enabled"]


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "url", "rate_limit_per_minute", "enabled"]
    list_filter = ["kind", "enabled"]
    search_fields = ["name", "url"]
    inlines = [RuleInline]
    actions = ["send_test"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    @admin.action(description="Send test")
    def send_test(self, request, queryset):
        for channel in queryset:
            delivery = services.channel_test_send(channel=channel)
            attempt = delivery.attempt
            if delivery.outcome == "sent":
                self.message_user(request, f"{channel.name}: sent ({attempt.duration_s:.2f} s).")
            else:
                self.message_user(
                    request, f"{channel.name}: failed: {attempt.error}", level=messages.ERROR
                )


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    list_display = ["name", "channel", "events", "clusters", "group_window_s", "enabled"]
    list_filter = ["enabled", "channel"]
    search_fields = ["name"]


class AttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    fields = ["number", "at", "outcome", "http_status", "error", "duration_s"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ["id", "event", "channel", "cluster", "state", "attempts", "created_at"]
    list_filter = ["state", "event", "channel"]
    raw_id_fields = ["incident", "action", "incidents"]
    inlines = [AttemptInline]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
