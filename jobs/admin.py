from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from common.errors import Invalid
from jobs.models import Attempt, Checkpoint, Cluster, Node, NodePoolPrice, TrainingJob
from jobs.services.pricing import currency_check, pool_check, price_check


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
