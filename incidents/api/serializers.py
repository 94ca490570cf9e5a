"""Incident serializers: the fields of the design contract (times RFC 3339, durations s)."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from incidents.costs import attach_costs
from incidents.models import Incident, TimelineEntry
from jobs.models import Node

# An amount of money on the wire: a number to the cent, or null (no price).
MONEY = serializers.DecimalField(
    max_digits=24,
    decimal_places=2,
    min_value=0,
    coerce_to_string=False,
    allow_null=True,
    read_only=True,
)
CURRENCY = serializers.CharField(allow_null=True, read_only=True, min_length=3, max_length=3)


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {"type": "number"},
        "description": "currency (ISO 4217) -> amount to the cent; the priced incidents only",
    }
)
class CostsField(serializers.DictField):
    """Money per currency: clusters may price in different ones."""

    def to_representation(self, value):
        return {k: MONEY.to_representation(v) for k, v in value.items()}


class IncidentSerializer(serializers.ModelSerializer):
    job = serializers.CharField(source="job.key")
    cluster = serializers.CharField(source="cluster.name")
    nodes = serializers.SerializerMethodField()
    time_to_detect_s = serializers.FloatField(read_only=True)
    time_to_resume_s = serializers.FloatField(read_only=True, allow_null=True)
    time_to_recover_s = serializers.FloatField(read_only=True, allow_null=True)
    lost_gpu_hours = serializers.FloatField(read_only=True)
    lost_cost = serializers.SerializerMethodField(
        help_text="the lost GPU-hours in money (to the cent), at the prices of the nodes"
        " of the launch it interrupted; null where they have no price"
    )
    currency = serializers.SerializerMethodField(
        help_text="ISO 4217 code of `lost_cost`; null with it"
    )

    class Meta:
        model = Incident
        fields = [
            "id",
            "job",
            "cluster",
            "attempt",
            "cause",
            "fault_type",
            "xid",
            "severity",
            "state",
            "summary",
            "nodes",
            "ranks",
            "fault_at",
            "detected_at",
            "opened_at",
            "resumed_at",
            "recovered_at",
            "resolved_at",
            "time_to_detect_s",
            "time_to_resume_s",
            "time_to_recover_s",
            "lost_gpu_hours",
            "lost_cost",
            "currency",
            "lost_breakdown",
        ]

    def get_nodes(self, obj) -> list[str]:
        return sorted(n.name for n in obj.nodes.all())

    def _cost(self, obj):
        # Lists attach every row's cost at once (incidents.costs.attach_costs).
        if not hasattr(obj, "lost_cost"):
            attach_costs([obj])
        return obj.lost_cost

    @extend_schema_field(MONEY)
    def get_lost_cost(self, obj):
        cost = self._cost(obj)
        return None if cost is None else MONEY.to_representation(cost.amount)

    @extend_schema_field(CURRENCY)
    def get_currency(self, obj):
        cost = self._cost(obj)
        return None if cost is None else cost.currency


class TimelineEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = TimelineEntry
        fields = ["kind", "at", "actor", "source", "message", "data"]


class IncidentDetailSerializer(IncidentSerializer):
    timeline = TimelineEntrySerializer(many=True, read_only=True)

    class Meta(IncidentSerializer.Meta):
        fields = [
            *IncidentSerializer.Meta.fields,
            "evidence",
            "root_cause",
            "postmortem",
            "timeline",
        ]


# The longest texts an incident takes, for the API and the pages alike.
ROOT_CAUSE_MAX = 20_000
POSTMORTEM_MAX = 100_000
RESOLVE_NOTE_MAX = 2_000


class IncidentNotesSerializer(serializers.Serializer):
    root_cause = serializers.CharField(required=False, allow_blank=True, max_length=ROOT_CAUSE_MAX)
    postmortem = serializers.CharField(required=False, allow_blank=True, max_length=POSTMORTEM_MAX)


class IncidentResolveSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=RESOLVE_NOTE_MAX)


class CauseFiguresSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="incidents of this cause")
    share = serializers.FloatField(help_text="of the period's incidents")
    failures = serializers.IntegerField(help_text="incidents of this cause that are failures")
    failure_share = serializers.FloatField(help_text="of the period's failures")
    lost_gpu_hours = serializers.FloatField()
    lost_cost = CostsField(help_text="the lost GPU-hours in money, per currency")


class DurationSummarySerializer(serializers.Serializer):
    count = serializers.IntegerField()
    mean_s = serializers.FloatField(allow_null=True)
    p50_s = serializers.FloatField(allow_null=True)
    p90_s = serializers.FloatField(allow_null=True)


class RepeatOffenderSerializer(serializers.Serializer):
    node = serializers.CharField()
    incidents = serializers.IntegerField()


class ReliabilitySerializer(serializers.Serializer):
    cluster = serializers.CharField(allow_null=True)
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    incidents = serializers.IntegerField(help_text="incidents with a fault in the period")
    failures = serializers.IntegerField(
        help_text="incidents that interrupted a launch; a straggler only when an action"
        " restarted the job for it"
    )
    mtbf_s = serializers.FloatField(allow_null=True, help_text="period / failures")
    by_cause = serializers.DictField(child=CauseFiguresSerializer())
    time_to_resume = DurationSummarySerializer()
    time_to_recover = DurationSummarySerializer()
    lost_gpu_hours = serializers.FloatField()
    lost_cost = CostsField(help_text="the lost GPU-hours in money, per currency")
    unpriced_lost_gpu_hours = serializers.FloatField(
        help_text="the lost GPU-hours of incidents on nodes without a price: not in `lost_cost`"
    )
    repeat_offenders = RepeatOffenderSerializer(many=True)


class NodeSerializer(serializers.Serializer):
    cluster = serializers.CharField(source="cluster.name")
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=Node.State.choices)
    gpus = serializers.IntegerField(allow_null=True)
    pool = serializers.CharField(help_text="its node pool (for its price); empty: none")
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)
    incidents_7d = serializers.IntegerField()
    incidents_30d = serializers.IntegerField()


class RankScoreSerializer(serializers.Serializer):
    rank = serializers.IntegerField()
    node = serializers.CharField(allow_null=True)
    compute_s = serializers.FloatField()
    step_s = serializers.FloatField()
    comm_wait_s = serializers.FloatField(allow_null=True)
    peer_score = serializers.FloatField(help_text="the ranks' lower-quartile compute / this rank's")
    self_score = serializers.FloatField(
        help_text="this rank's best / current compute, relative to the upper quartile's"
    )
    slow = serializers.BooleanField(help_text="either score below 0.75")


class JobRanksSerializer(serializers.Serializer):
    job = serializers.CharField()
    attempt = serializers.IntegerField(allow_null=True)
    first_step = serializers.IntegerField(allow_null=True)
    last_step = serializers.IntegerField(allow_null=True)
    world_size = serializers.IntegerField(
        allow_null=True, help_text="the launch's ranks (those of the window if it named none)"
    )
    count = serializers.IntegerField(help_text="the ranks that match the filters, all pages")
    slow_count = serializers.IntegerField(help_text="the window's slow ranks, whatever the filters")
    ranks = RankScoreSerializer(many=True, help_text="this page of the matching ranks")


@extend_schema_field(OpenApiTypes.NUMBER)
class NumberField(serializers.Field):
    """A JSON number as it is: counts stay integers. Input is checked by
    incidents.settings, which tells a boolean or a string from a number."""

    def to_internal_value(self, data):
        return data

    def to_representation(self, value):
        return value


class DetectorSettingSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    default = NumberField()
    cluster_value = NumberField(allow_null=True, help_text="the cluster's override")
    job_value = NumberField(allow_null=True, help_text="the job's override (with ?job=)")
    value = NumberField(help_text="in force: the job's, else the cluster's, else the default")
    updated_at = serializers.DateTimeField(
        allow_null=True, help_text="when the override in force was set"
    )
    updated_by = serializers.CharField(allow_null=True, help_text="who set the override in force")


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {"type": "number", "nullable": True},
        "minProperties": 1,
    }
)
class SettingValuesField(serializers.DictField):
    """At least one value (an empty change is refused)."""


class DetectorSettingsUpdateSerializer(serializers.Serializer):
    cluster = serializers.CharField(max_length=100)
    job = serializers.CharField(
        max_length=100,
        required=False,
        allow_null=True,
        allow_blank=True,
        help_text="set the job's overrides instead of the cluster's",
    )
    values = SettingValuesField(
        child=NumberField(allow_null=True),
        allow_empty=False,
        help_text="parameter name -> new value, or null to remove the override",
    )
