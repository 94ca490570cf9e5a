from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from common.errors import AppError, Invalid
from jobs.models import (
    Attempt,
    Checkpoint,
    Cluster,
    MaintenanceWindow,
    Node,
    NodePoolPrice,
    TrainingJob,
)
from jobs.services.maintenance import maintenance_window_cancel
from jobs.services.pricing import currency_check, node_set_pool, pool_check, price_check


def _checked(check, value):
    """A value the pricing rules (jobs.services.pricing) accept, else the form's error."""
    if value is None or value == "":
        return value
    try:
        check(value)
    except Invalid as exc:
        raise ValidationError(exc.detail) from exc
    return value


class ClusterForm(forms.ModelForm):
    class Meta:
        model = Cluster
        fields = ["name", "description", "gpu_hour_price", "currency"]

    def clean_gpu_hour_price(self):
        return _checked(price_check, self.cleaned_data.get("gpu_hour_price"))

    def clean_currency(self):
        return _checked(currency_check, self.cleaned_data.get("currency"))


class NodePoolPriceForm(forms.ModelForm):
    class Meta:
        model = NodePoolPrice
        fields = ["pool", "gpu_hour_price"]

    def clean_pool(self):
        return _checked(pool_check, self.cleaned_data.get("pool"))

    def clean_gpu_hour_price(self):
        return _checked(price_check, self.cleaned_data.get("gpu_hour_price"))


class NodePoolPriceInline(admin.TabularInline):
    """A node pool's price per GPU-hour wins over the cluster's for its nodes."""

    model = NodePoolPrice
    form = NodePoolPriceForm
    extra = 1


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterForm
    list_display = ["name", "gpu_hour_price", "currency", "created_at"]
    search_fields = ["name"]
    inlines = [NodePoolPriceInline]


class NodeForm(forms.ModelForm):
    class Meta:
        model = Node
        fields = [
            "cluster",
            "name",
            "state",
            "gpus",
            "last_heartbeat_at",
            "last_heard_at",
            "registered",
            "pool",
        ]

    def clean_pool(self):
        return _checked(pool_check, self.cleaned_data.get("pool"))


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    form = NodeForm
    list_display = ["name", "cluster", "pool", "state", "last_heartbeat_at"]
    list_filter = ["cluster", "state", "pool"]
    search_fields = ["name", "pool"]

    def save_model(self, request, obj, form, change):
        """A new pool goes through the service: the launches the node ran in are
        priced at it too."""
        if not change or "pool" not in form.changed_data:
            return super().save_model(request, obj, form, change)
        pool, obj.pool = obj.pool, form.initial.get("pool", "")
        super().save_model(request, obj, form, change)
        node_set_pool(node_id=obj.pk, pool=pool)
        obj.pool = pool


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
