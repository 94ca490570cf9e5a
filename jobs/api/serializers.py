"""Serializers of the read API. Times are RFC 3339 UTC; durations are seconds."""

from datetime import UTC, datetime

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.time import TS_MAX, TS_MIN
from jobs import selectors
from jobs.accounting import CATEGORIES
from jobs.models import Attempt, Checkpoint, TrainingJob
from jobs.wire import (
    DATA_SCHEMA,
    END_REASONS,
    FAULT_TYPES,
    INT32_MAX,
    INT64_MAX,
    KINDS,
    KINDS_WITHOUT_ATTEMPT,
    NON_FINITE,
)


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
    badput_cost = serializers.DecimalField(
        max_digits=24,
        decimal_places=2,
        coerce_to_string=False,
        allow_null=True,
        help_text="the GPU-seconds of every category but productive, in money (to the cent)"
        " at the prices of the nodes of its launches; null where they have no price",
    )
    currency = serializers.CharField(
        allow_null=True, help_text="ISO 4217 code of `badput_cost`; null with it"
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
    """A launch; its queryset comes from `selectors.job_attempts` (effective ends)."""

    nodes = serializers.SerializerMethodField()
    ended_at = serializers.DateTimeField(
        source="ended_at_effective",
        allow_null=True,
        read_only=True,
        help_text="Its `attempt_ended`, or else the next launch's start (`end_inferred`).",
    )
    end_inferred = serializers.BooleanField(
        read_only=True,
        help_text="True when the launch sent no `attempt_ended` and the next launch's "
        "start ended it (it died without a word).",
    )
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
            "end_inferred",
            "end_reason",
            "exit_code",
            "duration_s",
        ]

    def get_nodes(self, obj) -> list[str]:
        return sorted(n.name for n in obj.nodes.all())

    def get_duration_s(self, obj) -> float | None:
        if obj.started_at is None or obj.ended_at_effective is None:
            return None
        return (obj.ended_at_effective - obj.started_at).total_seconds()


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
    """A job; `activity`, `last_heard_at` and `silent_for_s` as of the context's `now`
    (jobs.selectors.job_activity)."""

    cluster = serializers.CharField(source="cluster.name")
    activity = serializers.SerializerMethodField(
        help_text="`status`, except `silent` for a running job the console has received"
        " nothing from for longer than REBOUND_JOB_SILENT_S (120 s by default); the"
        " stored `status` stays `running`"
    )
    last_heard_at = serializers.DateTimeField(
        source="last_received_at",
        allow_null=True,
        read_only=True,
        help_text="when the console last received events for the job, on its own clock"
        " (`last_event_at` is the job's clock)",
    )
    silent_for_s = serializers.SerializerMethodField(
        help_text="seconds since `last_heard_at` when `activity` is `silent`; else null"
    )
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
            "activity",
            "current_attempt",
            "world_size",
            "last_step",
            "last_durable_checkpoint",
            "goodput",
            "events_count",
            "first_event_at",
            "last_event_at",
            "last_heard_at",
            "silent_for_s",
            "finished_at",
            "created_at",
        ]

    def _activity(self, obj) -> selectors.JobActivity:
        # One `now` for every job of a response, so that they are judged alike.
        return selectors.job_activity(obj, now=self.context.setdefault("now", timezone.now()))

    @extend_schema_field(serializers.ChoiceField(choices=selectors.ACTIVITIES))
    def get_activity(self, obj) -> str:
        return self._activity(obj).activity

    def get_silent_for_s(self, obj) -> float | None:
        return self._activity(obj).silent_for_s

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


# A time on the wire and in query parameters (?start=, ?since=...).
TIME_SCHEMA = {
    "oneOf": [
        {"type": "number", "minimum": TS_MIN, "maximum": TS_MAX},
        {"type": "string", "pattern": RFC3339_PATTERN},
    ],
    "description": "unix seconds, or RFC 3339 with an offset"
    " (2026-11-30T08:00:00.5Z, 2026-11-30T09:00:00+01:00); between 2000 and 2100",
}


_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": INT32_MAX}
_COUNT32 = {"type": "integer", "minimum": 1, "maximum": INT32_MAX}
_COUNT64 = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
_SECONDS = {"type": "number", "minimum": 0}
_ANY_NUMBER = {
    "oneOf": [{"type": "number"}, {"type": "string", "enum": sorted(NON_FINITE)}],
    "description": "a number, or a non-finite one spelled as a string",
}


def _text(n: int) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": n, "pattern": NO_NUL_PATTERN}


# Each kind's `data` fields, as jobs.wire.DATA_SCHEMA checks them (a test keeps the two
# in step); keys beyond them are kept as sent.
DATA_FIELD_SCHEMAS: dict[str, dict[str, dict]] = {
    "attempt_started": {
        "world_size": _COUNT32,
        "gpus_per_node": _COUNT32,
        "nodes": {"type": "array", "items": {"type": "string", "pattern": NODE_NAME_PATTERN}},
    },
    "ready": {},
    "checkpoint_load_started": {"step": _COUNT64},
    "checkpoint_loaded": {"step": _COUNT64},
    "step": {
        "step": _COUNT64,
        "loss": _ANY_NUMBER,
        "grad_norm": _ANY_NUMBER,
        "tokens": _COUNT64,
        "step_time_s": _SECONDS,
    },
    "checkpoint_save_started": {"step": _COUNT64},
    "checkpoint_saved": {
        "step": _COUNT64,
        "bytes": _COUNT64,
        "blocking_s": _SECONDS,
        "uri": _text(1024),
        "tier": _text(32),
    },
    "rank_window": {
        "first_step": _COUNT64,
        "last_step": {**_COUNT64, "description": "at least first_step"},
        "compute_s": _SECONDS,
        "step_s": _SECONDS,
        "comm_wait_s": _SECONDS,
        "data_wait_s": _SECONDS,
    },
    "heartbeat": {},
    "fault": {
        "type": {"type": "string", "enum": sorted(FAULT_TYPES)},
        "xid": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
        "message": _text(4096),
        "exit_code": _INT32,
    },
    "attempt_ended": {
        "reason": {"type": "string", "enum": sorted(END_REASONS)},
        "exit_code": _INT32,
        "requested_by": _text(200),
    },
    "job_finished": {},
    "pause_started": {"reason": {**_text(64), "description": "why, e.g. evaluation"}},
    "pause_ended": {},
}


def _event_schema(kind: str) -> dict:
    """One kind's event: the fields every event has, and the kind's own."""
    required_data = [n for n, spec in DATA_SCHEMA[kind].items() if spec[1]]
    data = {
        "type": "object",
        "properties": DATA_FIELD_SCHEMAS[kind],
        "additionalProperties": True,
    }
    if required_data:
        data["required"] = required_data
    required = ["id", "job", "kind", "ts"]
    if kind not in KINDS_WITHOUT_ATTEMPT:
        required.append("attempt")
    if kind == "heartbeat":
        required.append("node")
    if kind == "rank_window":
        required.append("rank")
    if required_data:
        required.append("data")
    return {
        "type": "object",
        "title": kind,
        "properties": {
            "id": {**_text(128), "description": "the dedup key within the job"},
            "job": {"type": "string", "pattern": JOB_KEY_PATTERN, "description": "a slug"},
            "kind": {"type": "string", "enum": [kind]},
            "ts": TIME_SCHEMA,
            "attempt": {**_COUNT32, "description": "the launch"},
            "node": {"type": "string", "pattern": NODE_NAME_PATTERN},
            "rank": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
            "data": data,
        },
        "required": required,
        "additionalProperties": False,
    }


@extend_schema_field(
    {
        "oneOf": [_event_schema(kind) for kind in sorted(KINDS)],
        "description": "one event of wire format v1; `kind` tells which",
    }
)
class IngestEventField(serializers.DictField):
    """Documentation of wire format v1; ingest validates with jobs.wire for speed."""


class IngestRequestSerializer(serializers.Serializer):
    refuses_unknown_fields = True  # jobs.wire.parse_body: the body holds only `events`

    events = serializers.ListField(
        child=IngestEventField(), min_length=1, max_length=settings.INGEST_MAX_EVENTS
    )


class IngestResponseSerializer(serializers.Serializer):
    accepted = serializers.IntegerField()
    duplicates = serializers.IntegerField()


class JobReopenSerializer(serializers.Serializer):
    reason = serializers.CharField(
        max_length=500, required=False, allow_blank=True, help_text="why, for the audit log"
    )


# A price per GPU-hour as the columns hold it (jobs.models.Cluster.gpu_hour_price).
def _price_field(**kwargs):
    return serializers.DecimalField(
        max_digits=12, decimal_places=4, min_value=0, coerce_to_string=False, **kwargs
    )


class ClusterPricingSerializer(serializers.Serializer):
    """A cluster's prices: what its GPU-hour costs, and its node pools' own prices."""

    cluster = serializers.CharField(read_only=True)
    gpu_hour_price = _price_field(
        allow_null=True, help_text="per GPU-hour; null: no price (no money shown)"
    )
    currency = serializers.RegexField(
        r"^[A-Z]{3}$", help_text="ISO 4217 code: three capital letters"
    )
    pools = serializers.DictField(
        child=_price_field(),
        help_text="node pool -> its price per GPU-hour, which wins for its nodes; a PUT"
        " replaces them all ({} removes them)",
    )
