"""Incident serializers: the fields of the design contract (times RFC 3339, durations s)."""

from rest_framework import serializers

from incidents.models import Incident, TimelineEntry


class IncidentSerializer(serializers.ModelSerializer):
    job = serializers.CharField(source="job.key")
    cluster = serializers.CharField(source="cluster.name")
    nodes = serializers.SerializerMethodField()
    time_to_detect_s = serializers.FloatField(read_only=True)
    time_to_resume_s = serializers.FloatField(read_only=True, allow_null=True)
    time_to_recover_s = serializers.FloatField(read_only=True, allow_null=True)
    lost_gpu_hours = serializers.FloatField(read_only=True)

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
            "lost_breakdown",
        ]

    def get_nodes(self, obj) -> list[str]:
        return sorted(n.name for n in obj.nodes.all())


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


class IncidentNotesSerializer(serializers.Serializer):
    root_cause = serializers.CharField(required=False, allow_blank=True, max_length=20000)
    postmortem = serializers.CharField(required=False, allow_blank=True, max_length=100000)


class IncidentResolveSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)
