"""The Django admin of incidents, their timelines, detector settings and detector state,
and the alerts Alertmanager sent."""

from django.contrib import admin

from incidents.models import Alert, DetectorSetting, DetectorState, Incident, TimelineEntry


class TimelineInline(admin.TabularInline):
    model = TimelineEntry
    extra = 0
    fields = ["at", "kind", "actor", "message"]
    readonly_fields = fields
    can_delete = False


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    list_display = ["id", "job", "cause", "severity", "state", "fault_at", "lost_gpu_seconds"]
    list_filter = ["cluster", "cause", "state", "severity", "detector"]
    search_fields = ["job__key", "summary"]
    readonly_fields = [
        "job",
        "cluster",
        "detector",
        "episode",
        "attempt",
        "fault_at",
        "detected_at",
        "opened_at",
        "resumed_at",
        "recovered_at",
        "resolved_at",
        "lost_gpu_seconds",
        "lost_breakdown",
        "evidence",
    ]
    inlines = [TimelineInline]


@admin.register(DetectorSetting)
class DetectorSettingAdmin(admin.ModelAdmin):
    """Detector parameters per cluster or job; detectors read them on every pass."""

    list_display = ["name", "value", "cluster", "job", "updated_at", "updated_by"]
    list_filter = ["name", "cluster"]


@admin.register(DetectorState)
class DetectorStateAdmin(admin.ModelAdmin):
    """What detection keeps per job; `failure` says why its last pass could not judge
    something (also logged at ERROR), until a clean pass clears it."""

    list_display = ("job", "updated_at", "last_pass_s", "failed_at", "failure")
    list_filter = (("failed_at", admin.EmptyFieldListFilter),)
    readonly_fields = ("job", "data", "updated_at", "last_pass_s", "failed_at", "failure")


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    """Alertmanager's alerts as received (incidents.alerts): read only, they are a record."""

    list_display = [
        "id",
        "alertname",
        "cluster",
        "status",
        "node",
        "fault_type",
        "outcome",
        "starts_at",
        "last_received_at",
        "receipts",
    ]
    list_filter = ["cluster", "status", "outcome", "fault_type"]
    search_fields = ["alertname", "fingerprint", "node_label", "node__name"]
    date_hierarchy = "last_received_at"
    filter_horizontal = ["incidents"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Alert._meta.get_fields() if f.concrete]

    def has_add_permission(self, request):
        return False
