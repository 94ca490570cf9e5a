from django.contrib import admin

from jobs.models import Attempt, Checkpoint, Cluster, Node, TrainingJob


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
