"""Serializers of the read API. Times are RFC 3339 UTC; durations are seconds."""

from datetime import UTC, datetime

from rest_framework import serializers

from jobs.accounting import CATEGORIES
from jobs.models import Attempt, Checkpoint, TrainingJob
from jobs.wire import KINDS


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


class IngestEventSerializer(serializers.Serializer):
    """Documentation of wire format v1; ingest validates with jobs.wire for speed."""

    id = serializers.CharField(max_length=128)
    job = serializers.SlugField(max_length=100)
    kind = serializers.ChoiceField(choices=sorted(KINDS))
    ts = serializers.CharField(help_text="RFC 3339 with an offset, or unix seconds (a number)")
    attempt = serializers.IntegerField(min_value=1, required=False)
    node = serializers.CharField(max_length=128, required=False)
    rank = serializers.IntegerField(min_value=0, required=False)
    data = serializers.DictField(required=False)


class IngestRequestSerializer(serializers.Serializer):
    events = IngestEventSerializer(many=True)


class IngestResponseSerializer(serializers.Serializer):
    accepted = serializers.IntegerField()
    duplicates = serializers.IntegerField()
