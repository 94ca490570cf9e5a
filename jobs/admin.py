from django.contrib import admin, messages

from common.errors import AppError
from jobs.models import Attempt, Checkpoint, Cluster, MaintenanceWindow, Node, TrainingJob
from jobs.services.maintenance import maintenance_window_cancel


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    search_fields = ["name"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "state", "last_heartbeat_at"]
    list_filter = ["cluster", "state"]
    search_fields = ["name"]


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    fields = ["number", "world_size", "started_at", "ready_at", "ended_at", "end_reason"]
    readonly_fields = fields
    can_delete = False


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    list_display = ["key", "cluster", "status", "last_step", "events_count", "created_at"]
    list_filter = ["cluster", "status"]
    search_fields = ["key"]
    readonly_fields = ["revision", "events_count", "first_event_ts", "last_event_ts"]
    inlines = [AttemptInline]


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["job", "attempt", "step", "saved_at", "blocking_s", "tier", "durable"]
    list_filter = ["durable", "tier"]
    search_fields = ["job__key"]


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(admin.ModelAdmin):
    """Read and cancel here; declare on the console's maintenance page or the API, whose
    service validates a window and re-judges what it covers (an edit here would not)."""

    list_display = ["id", "cluster", "starts_at", "ends_at", "reason", "pre_action", "cancelled_at"]
    list_filter = ["cluster", "pre_action"]
    search_fields = ["reason", "nodes__name"]
    readonly_fields = [
        "cluster",
        "nodes",
        "starts_at",
        "ends_at",
        "reason",
        "pre_action",
        "pre_action_lead_s",
        "pre_action_proposed_at",
        "created_by",
        "created_at",
        "cancelled_at",
    ]
    actions = ["cancel"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Cancel the selected maintenance windows")
    def cancel(self, request, queryset):
        for window in queryset.filter(cancelled_at__isnull=True):
            try:
                maintenance_window_cancel(window=window, actor=request.user.username)
            except AppError as exc:
                self.message_user(request, exc.detail, messages.WARNING)
