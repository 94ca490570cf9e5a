"""Serializers of the read API. Times are RFC 3339 UTC; durations are seconds."""

from datetime import UTC, datetime

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.accounting import CATEGORIES
from jobs.models import Attempt, Checkpoint, TrainingJob
from jobs.wire import INT32_MAX, KINDS, TS_MAX, TS_MIN


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


class CategorySecondsSerializer(serializers.Serializer):
    def get_fields(self):
        return {c: serializers.FloatField() for c in CATEGORIES}


class GoodputSerializer(serializers.Serializer):
    job = serializers.CharField()
    elapsed_s = serializers.FloatField()
    categories = CategorySecondsSerializer(help_text="seconds per category; they sum to elapsed_s")
    gpu_seconds = CategorySecondsSerializer(help_text="GPU-seconds per category")
    goodput = serializers.FloatField(allow_null=True, help_text="productive / elapsed, by time")
    gpu_goodput = serializers.FloatField(
        allow_null=True, help_text="productive / all, by GPU-seconds"
    )
    slowdown_s = serializers.FloatField(help_text="time lost to slow productive steps")
    as_of = serializers.DateTimeField(
        allow_null=True, help_text="the job-clock time the figures run to"
    )


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = [
            "attempt",
            "step",
            "save_started_at",
            "saved_at",
            "blocking_s",
            "bytes",
            "uri",
            "tier",
            "durable",
        ]


class AttemptSerializer(serializers.ModelSerializer):
    nodes = serializers.SerializerMethodField()
    duration_s = serializers.SerializerMethodField()

    class Meta:
        model = Attempt
        fields = [
            "number",
            "world_size",
            "gpus_per_node",
            "nodes",
            "started_at",
            "ready_at",
            "ended_at",
            "end_reason",
            "exit_code",
            "duration_s",
        ]

    def get_nodes(self, obj) -> list[str]:
        return sorted(n.name for n in obj.nodes.all())

    def get_duration_s(self, obj) -> float | None:
        if obj.started_at is None or obj.ended_at is None:
            return None
        return (obj.ended_at - obj.started_at).total_seconds()


class CurrentAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["number", "world_size", "started_at", "ended_at", "end_reason"]


class JobGoodputSummarySerializer(serializers.Serializer):
    goodput = serializers.FloatField(allow_null=True)
    gpu_goodput = serializers.FloatField(allow_null=True)
    elapsed_s = serializers.FloatField()
    as_of = serializers.DateTimeField(allow_null=True)


class JobSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name")
    current_attempt = CurrentAttemptSerializer(allow_null=True)
    world_size = serializers.SerializerMethodField()
    last_durable_checkpoint = CheckpointSerializer(allow_null=True)
    goodput = serializers.SerializerMethodField()
    first_event_at = serializers.SerializerMethodField()
    last_event_at = serializers.SerializerMethodField()

    class Meta:
        model = TrainingJob
        fields = [
            "key",
            "cluster",
            "status",
            "current_attempt",
            "world_size",
            "last_step",
            "last_durable_checkpoint",
            "goodput",
            "events_count",
            "first_event_at",
            "last_event_at",
            "finished_at",
            "created_at",
        ]

    def get_world_size(self, obj) -> int | None:
        return obj.current_attempt.world_size if obj.current_attempt else None

    def get_goodput(self, obj) -> JobGoodputSummarySerializer:
        figures = self.context["goodput"](obj)
        return {k: figures[k] for k in ("goodput", "gpu_goodput", "elapsed_s", "as_of")}

    def get_first_event_at(self, obj) -> str | None:
        return iso(obj.first_event_ts)

    def get_last_event_at(self, obj) -> str | None:
        return iso(obj.last_event_ts)


# The wire's rules (jobs.wire) in JSON Schema terms, for clients and the API's fuzz test.
JOB_KEY_PATTERN = r"^[A-Za-z0-9_-]{1,100}$"
NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
NO_NUL_PATTERN = r"^[^\u0000]*$"
RFC3339_PATTERN = (
    r"^20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]"
    r":[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "number", "minimum": TS_MIN, "maximum": TS_MAX},
            {"type": "string", "pattern": RFC3339_PATTERN},
        ],
        "description": "unix seconds, or RFC 3339 with an offset"
        " (2026-11-30T08:00:00.5Z, 2026-11-30T09:00:00+01:00); between 2000 and 2100",
    }
)
class TimestampField(serializers.Field):
    pass


class IngestEventSerializer(serializers.Serializer):
    """Documentation of wire format v1; ingest validates with jobs.wire for speed."""

    id = serializers.RegexField(
        NO_NUL_PATTERN, min_length=1, max_length=128, help_text="dedup key within the job"
    )
    job = serializers.RegexField(JOB_KEY_PATTERN, help_text="the job's key (a slug)")
    kind = serializers.ChoiceField(choices=sorted(KINDS))
    ts = TimestampField()
    attempt = serializers.IntegerField(
        min_value=1,
        max_value=INT32_MAX,
        required=False,
        help_text="the launch; required for every kind but heartbeat and fault",
    )
    node = serializers.RegexField(
        NODE_NAME_PATTERN, required=False, help_text="required for heartbeat"
    )
    rank = serializers.IntegerField(min_value=0, max_value=INT32_MAX, required=False)
    data = serializers.DictField(required=False, help_text="the kind's fields (see the README)")


class IngestRequestSerializer(serializers.Serializer):
    events = serializers.ListField(
        child=IngestEventSerializer(), min_length=1, max_length=settings.INGEST_MAX_EVENTS
    )


class IngestResponseSerializer(serializers.Serializer):
    accepted = serializers.IntegerField()
    duplicates = serializers.IntegerField()


class JobReopenSerializer(serializers.Serializer):
    reason = serializers.CharField(
        max_length=500, required=False, allow_blank=True, help_text="why, for the audit log"
    )
