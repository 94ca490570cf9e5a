from django.contrib import admin

from recovery.models import Action, ActionAudit, ClusterRecoverySettings, RecoveryPolicy


class AuditInline(admin.TabularInline):
    model = ActionAudit
    extra = 0
    fields = ["at", "actor", "from_state", "to_state", "reason"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Action)
class ActionAdmin(admin.ModelAdmin):
    """Read-only: actions move through the API and the workers, each move audited."""

    list_display = ["id", "kind", "state", "mode", "cluster", "node", "job", "created_at"]
    list_filter = ["cluster", "state", "kind", "mode"]
    search_fields = ["job__key", "node__name", "reason", "requested_by"]
    inlines = [AuditInline]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ClusterRecoverySettings)
class ClusterRecoverySettingsAdmin(admin.ModelAdmin):
    list_display = [
        "cluster",
        "driver",
        "paused",
        "pause_reason",
        "dry_run",
        "storm_max_share",
        "storm_max_nodes",
    ]


@admin.register(RecoveryPolicy)
class RecoveryPolicyAdmin(admin.ModelAdmin):
    """Overrides of recovery.policies.DEFAULTS per cluster or job."""

    list_display = ["cluster", "job", "trigger", "kind", "mode", "position", "updated_by"]
    list_filter = ["cluster", "trigger", "mode"]
