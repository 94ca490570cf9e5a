"""Serializers of Alertmanager's alerts: the webhook payload as documented (the view
reads and checks the body itself: incidents.alerts.webhook_parse), the alerts as
recorded, and the cluster's alert mapping settings."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from incidents.models import Alert

LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
TIME = {"type": "string", "format": "date-time"}


@extend_schema_field(LABELS)
class LabelsField(serializers.DictField):
    pass


class WebhookAlertSerializer(serializers.Serializer):
    # Alertmanager's names (camelCase), as the payload carries them.
    status = serializers.ChoiceField(choices=Alert.Status.choices)
    labels = LabelsField()
    annotations = LabelsField(required=False)
    startsAt = serializers.DateTimeField()
    endsAt = serializers.DateTimeField(
        required=False, help_text="0001-01-01T00:00:00Z (Go's zero time) while firing"
    )
    generatorURL = serializers.CharField(required=False, allow_blank=True)
    fingerprint = serializers.RegexField(r"^[0-9A-Za-z]{1,64}$")


class WebhookSerializer(serializers.Serializer):
    """Alertmanager's webhook payload, version 4."""

    version = serializers.ChoiceField(choices=["4"])
    groupKey = serializers.CharField(allow_blank=True)
    truncatedAlerts = serializers.IntegerField(min_value=0, required=False)
    status = serializers.ChoiceField(choices=Alert.Status.choices)
    receiver = serializers.CharField(allow_blank=True)
    groupLabels = LabelsField(required=False)
    commonLabels = LabelsField(required=False)
    commonAnnotations = LabelsField(required=False)
    externalURL = serializers.CharField(required=False, allow_blank=True)
    alerts = WebhookAlertSerializer(many=True, min_length=1, max_length=1000)


class AlertSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name")
    node = serializers.SerializerMethodField()
    fault_type = serializers.SerializerMethodField()
    incidents = serializers.SerializerMethodField()

    class Meta:
        model = Alert
        fields = [
            "id",
            "cluster",
            "fingerprint",
            "alertname",
            "status",
            "starts_at",
            "ends_at",
            "labels",
            "annotations",
            "generator_url",
            "node_label",
            "node",
            "fault_type",
            "xid",
            "rule",
            "outcome",
            "incidents",
            "first_received_at",
            "last_received_at",
            "resolved_received_at",
            "receipts",
        ]

    @extend_schema_field({"type": "string", "nullable": True})
    def get_node(self, obj) -> str | None:
        return obj.node.name if obj.node_id else None

    @extend_schema_field({"type": "string", "nullable": True})
    def get_fault_type(self, obj) -> str | None:
        return obj.fault_type or None

    @extend_schema_field({"type": "array", "items": {"type": "integer"}})
    def get_incidents(self, obj) -> list[int]:
        return sorted(i.pk for i in obj.incidents.all())


class WebhookResponseSerializer(serializers.Serializer):
    received = serializers.IntegerField(help_text="alerts in the delivery")
    new = serializers.IntegerField(help_text="alerts heard of for the first time")
    resolved = serializers.IntegerField(help_text="firing alerts now resolved")
    repeats = serializers.IntegerField(help_text="deliveries that changed nothing")
    alerts = AlertSerializer(many=True)


@extend_schema_field(OpenApiTypes.ANY)
class AnyJsonField(serializers.Field):
    """A setting's value as stored: a list of label names, a list of rules or a word."""

    def to_internal_value(self, data):
        return data

    def to_representation(self, value):
        return value


class AlertSettingSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    default = AnyJsonField()
    cluster_value = AnyJsonField(allow_null=True, help_text="the cluster's override")
    value = AnyJsonField(help_text="in force: the cluster's, else the default")
    updated_at = serializers.DateTimeField(allow_null=True)
    updated_by = serializers.CharField(allow_null=True)


@extend_schema_field({"type": "object", "additionalProperties": {}, "minProperties": 1})
class AlertValuesField(serializers.DictField):
    pass


class AlertSettingsUpdateSerializer(serializers.Serializer):
    cluster = serializers.CharField(max_length=100)
    values = AlertValuesField(
        child=AnyJsonField(allow_null=True),
        allow_empty=False,
        help_text="setting name -> new value, or null to remove the override",
    )
