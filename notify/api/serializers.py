"""Notify serializers: channels and rules (secrets write-only: an answer says only
whether one is set), notifications with their delivery attempts, the test send's
answer."""

from rest_framework import serializers

from incidents.models import Incident
from jobs.models import Cluster
from notify.models import RULE_EVENTS, Channel, DeliveryAttempt, Notification, Rule

MAX_EMAILS = 50
MAX_FILTER = 100  # names in one filter list
MAX_RATE = 10_000  # deliveries a minute
MAX_GROUP_WINDOW_S = 3600
K = Channel.Kind


class ChannelSerializer(serializers.ModelSerializer):
    url = serializers.URLField(max_length=500, required=False, allow_blank=True)
    secret = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        write_only=True,
        help_text="webhook: the HMAC key; PagerDuty: the routing key. Never returned;"
        " omitted on PUT: kept.",
    )
    has_secret = serializers.SerializerMethodField()
    emails = serializers.ListField(
        child=serializers.EmailField(), max_length=MAX_EMAILS, required=False
    )
    rate_limit_per_minute = serializers.IntegerField(
        min_value=0, max_value=MAX_RATE, required=False, help_text="0: no limit"
    )

    class Meta:
        model = Channel
        fields = [
            "id",
            "name",
            "kind",
            "url",
            "secret",
            "has_secret",
            "emails",
            "rate_limit_per_minute",
            "enabled",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]

    def get_has_secret(self, channel) -> bool:
        return bool(channel.secret)

    def validate_url(self, value):
        if value and not value.lower().startswith(("http://", "https://")):
            raise serializers.ValidationError("Must be an http:// or https:// URL.")
        return value

    def validate(self, data):
        def get(name, default=""):
            if name in data:
                return data[name]
            return getattr(self.instance, name, default) if self.instance else default

        kind = get("kind")
        if kind in (K.WEBHOOK, K.SLACK) and not get("url"):
            raise serializers.ValidationError({"url": f"A {kind} channel needs a URL."})
        if kind == K.PAGERDUTY and not get("secret"):
            raise serializers.ValidationError(
                {"secret": "A PagerDuty channel needs its integration's routing key."}
            )
        if kind == K.EMAIL and not get("emails", []):
            raise serializers.ValidationError(
                {"emails": "An e-mail channel needs at least one address."}
            )
        return data


class RuleSerializer(serializers.ModelSerializer):
    channel = serializers.PrimaryKeyRelatedField(queryset=Channel.objects.all())
    clusters = serializers.ListField(
        child=serializers.SlugField(max_length=100),
        max_length=MAX_FILTER,
        required=False,
        help_text="cluster names; empty: all",
    )
    severities = serializers.ListField(
        child=serializers.ChoiceField(Incident.Severity.choices),
        max_length=MAX_FILTER,
        required=False,
        help_text="incident severities; empty: all",
    )
    causes = serializers.ListField(
        child=serializers.ChoiceField(Incident.Cause.choices),
        max_length=MAX_FILTER,
        required=False,
        help_text="incident causes; empty: all but planned",
    )
    events = serializers.ListField(
        child=serializers.ChoiceField(RULE_EVENTS),
        max_length=MAX_FILTER,
        required=False,
        help_text="empty: all",
    )
    group_window_s = serializers.IntegerField(
        min_value=0, max_value=MAX_GROUP_WINDOW_S, required=False
    )

    class Meta:
        model = Rule
        fields = [
            "id",
            "name",
            "channel",
            "clusters",
            "severities",
            "causes",
            "events",
            "group_window_s",
            "enabled",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]

    def validate_clusters(self, value):
        value = list(dict.fromkeys(value))
        known = set(Cluster.objects.filter(name__in=value).values_list("name", flat=True))
        unknown = [n for n in value if n not in known]
        if unknown:
            raise serializers.ValidationError(f"No such cluster: {', '.join(unknown)}.")
        return value

    def validate_severities(self, value):
        return list(dict.fromkeys(value))

    def validate_causes(self, value):
        return list(dict.fromkeys(value))

    def validate_events(self, value):
        return list(dict.fromkeys(value))


class DeliveryAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeliveryAttempt
        fields = ["number", "at", "outcome", "http_status", "error", "duration_s"]


class NotificationSerializer(serializers.ModelSerializer):
    rule_name = serializers.CharField(source="rule.name", allow_null=True, default=None)
    channel_name = serializers.CharField(source="channel.name")
    cluster = serializers.CharField(source="cluster.name", allow_null=True, default=None)
    incident = serializers.IntegerField(source="incident_id", allow_null=True)
    action = serializers.IntegerField(source="action_id", allow_null=True)
    delivery_attempts = DeliveryAttemptSerializer(many=True)

    class Meta:
        model = Notification
        fields = [
            "id",
            "rule",
            "rule_name",
            "channel",
            "channel_name",
            "event",
            "cluster",
            "incident",
            "action",
            "subjects",
            "state",
            "attempts",
            "next_attempt_at",
            "last_error",
            "created_at",
            "sent_at",
            "delivery_attempts",
        ]


class TestSendSerializer(serializers.Serializer):
    notification = serializers.IntegerField()
    outcome = serializers.ChoiceField(["sent", "failed"])
    attempt = DeliveryAttemptSerializer()
