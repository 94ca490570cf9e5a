"""Action serializers: the approval queue's rows, an action's evidence and audit trail,
and the bodies of the commands (propose, approve, reject, cancel, pause).

The command serializers are the one validator of each command: the console's forms
(console/pages/approvals.py, nodes.py) validate with them too, and word their
errors for people with the limits below."""

import re

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.vocabulary import JOB_KEY
from incidents.models import Incident
from jobs.models import Node, TrainingJob
from recovery.models import Action, ActionAudit, ClusterRecoverySettings
from recovery.policies import TRIGGERS
from recovery.selectors.phases import PHASES

REASON_MAX = 2000  # why an action is proposed
COMMENT_MAX = 2000  # a decision's comment
PAUSE_REASON_MAX = 500  # why a cluster's recovery is paused


class ActionSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name")
    node = serializers.CharField(source="node.name", allow_null=True, default=None)
    job = serializers.CharField(source="job.key", allow_null=True, default=None)
    spare = serializers.CharField(source="spare.name", allow_null=True, default=None)
    incident = serializers.IntegerField(source="incident_id", allow_null=True)

    class Meta:
        model = Action
        fields = [
            "id",
            "kind",
            "state",
            "mode",
            "cluster",
            "node",
            "job",
            "spare",
            "params",
            "reason",
            "incident",
            "policy",
            "requested_by",
            "approved_by",
            "comment",
            "dry_run",
            "blocked_by",
            "blocked_reason",
            "attempts",
            "deadline",
            "expires_at",
            "created_at",
            "approved_at",
            "queued_at",
            "started_at",
            "finished_at",
            "output",
            "error",
        ]


class ActionAuditSerializer(serializers.ModelSerializer):
    class Meta:
        model = ActionAudit
        fields = ["at", "actor", "from_state", "to_state", "reason", "data"]


class EvidenceIncidentSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    cause = serializers.ChoiceField(choices=Incident.Cause.choices)
    fault_type = serializers.CharField()
    severity = serializers.ChoiceField(choices=Incident.Severity.choices)
    state = serializers.ChoiceField(choices=Incident.State.choices)
    summary = serializers.CharField()
    nodes = serializers.ListField(child=serializers.CharField())
    fault_at = serializers.DateTimeField()
    detected_at = serializers.DateTimeField()
    evidence = serializers.ListField(child=serializers.CharField(), help_text="event ids")


class EvidenceNodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=Node.State.choices)
    state_changed_at = serializers.DateTimeField()


class EvidenceJobSerializer(serializers.Serializer):
    key = serializers.CharField()
    status = serializers.ChoiceField(choices=TrainingJob.Status.choices)
    attempt = serializers.IntegerField(allow_null=True)
    world_size = serializers.IntegerField(allow_null=True)
    nodes = serializers.ListField(child=serializers.CharField())
    last_step = serializers.IntegerField(allow_null=True)
    ranks_on_nodes = serializers.DictField(
        child=serializers.ListField(child=serializers.IntegerField()),
        help_text="a replacement or scale-down: the job's ranks on each node it leaves"
        " (from its latest launch's rank windows)",
    )


class AtStakeSerializer(serializers.Serializer):
    last_step = serializers.IntegerField(allow_null=True)
    checkpoint_step = serializers.IntegerField(
        allow_null=True, help_text="the checkpoint a relaunch restarts from"
    )
    steps_lost = serializers.IntegerField(allow_null=True)
    seconds_lost = serializers.FloatField(help_text="the launch's progress since that checkpoint")
    world_size = serializers.IntegerField()
    gpu_hours = serializers.FloatField(help_text="seconds_lost x world_size / 3600")


class ApprovalBlockSerializer(serializers.Serializer):
    guardrail = serializers.CharField()
    reason = serializers.CharField()


class EvidenceSerializer(serializers.Serializer):
    incident = EvidenceIncidentSerializer(allow_null=True)
    approval_blocked_by = ApprovalBlockSerializer(
        allow_null=True,
        help_text="awaiting approval: what stops an approval now (as approving would answer),"
        " else null",
    )
    nodes = EvidenceNodeSerializer(many=True)
    jobs = EvidenceJobSerializer(many=True, help_text="the job acted on, and jobs on the node")
    restarts_jobs = serializers.BooleanField(help_text="running it relaunches the jobs")
    gpu_hours_at_stake = serializers.FloatField(
        help_text="progress since the last durable checkpoint x world size, that a relaunch"
        " throws away (all jobs)"
    )
    at_stake = serializers.DictField(child=AtStakeSerializer(), help_text="per job key")


class ActionDetailSerializer(ActionSerializer):
    audit = ActionAuditSerializer(many=True, read_only=True)
    evidence = serializers.SerializerMethodField()

    class Meta(ActionSerializer.Meta):
        fields = [*ActionSerializer.Meta.fields, "target_snapshot", "audit", "evidence"]

    @extend_schema_field(EvidenceSerializer)
    def get_evidence(self, obj) -> dict:
        return EvidenceSerializer(self.context["evidence"]).data


class ActionProposeSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=Action.Kind.choices)
    cluster = serializers.SlugField(max_length=100)
    node = serializers.CharField(max_length=128, required=False, allow_blank=True)
    job = serializers.SlugField(max_length=100, required=False, allow_blank=True)
    params = serializers.DictField(
        required=False,
        help_text="rollback: {step}; scale_down: {nodes: [...]};"
        " replace_at_next_checkpoint: {max_wait_s}; checkpoint_job: none",
    )
    reason = serializers.CharField(max_length=REASON_MAX)
    incident = serializers.IntegerField(required=False, allow_null=True)
    dry_run = serializers.BooleanField(default=False)


class DecisionSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=COMMENT_MAX, required=False, allow_blank=True)


class RejectSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=COMMENT_MAX, help_text="why not")


class PauseSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=PAUSE_REASON_MAX)


class PolicyRuleSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=Action.Kind.choices)
    mode = serializers.CharField()
    source = serializers.CharField(help_text='"default", "cluster:<name>" or "job:<key>"')


class ClusterRecoverySerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name")
    driver = serializers.CharField(source="driver_in_force")
    policies = serializers.SerializerMethodField()

    class Meta:
        model = ClusterRecoverySettings
        fields = [
            "cluster",
            "driver",
            "paused",
            "pause_reason",
            "paused_by",
            "paused_at",
            "dry_run",
            "storm_max_share",
            "storm_max_nodes",
            "storm_window_s",
            "cooldown_s",
            "approval_ttl_s",
            "policies",
        ]

    @extend_schema_field(serializers.DictField(child=PolicyRuleSerializer(many=True)))
    def get_policies(self, obj) -> dict:
        table = self.context.get("policies") or {}
        return {
            t: [{"kind": r.kind, "mode": r.mode, "source": r.source} for r in table.get(t, [])]
            for t in TRIGGERS
        }


class FaultSerializer(serializers.Serializer):
    """What to inject (recovery.faults.FAULTS names each kind and what it needs)."""

    kind = serializers.ChoiceField(choices=[])
    job = serializers.SlugField(required=False)
    rank = serializers.IntegerField(required=False, min_value=0)
    node = serializers.CharField(required=False, max_length=128)
    factor = serializers.FloatField(required=False, min_value=0)
    xid = serializers.IntegerField(required=False, min_value=0)
    from_step = serializers.IntegerField(required=False, min_value=0)
    kill = serializers.BooleanField(required=False, default=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from recovery.faults import FAULTS

        self.fields["kind"].choices = [(k, f.what) for k, f in FAULTS.items()]


# A launch identity: printable ASCII, space included (the schema's pattern is the rule).
LAUNCH_IDENTITY = re.compile(r"\A[ -~]{1,200}\Z")


@extend_schema_field({"type": "string", "pattern": r"^[A-Za-z0-9_-]{1,100}$"})
class JobKeyField(serializers.CharField):
    def to_internal_value(self, data):
        if type(data) is not str or not JOB_KEY.match(data):
            raise serializers.ValidationError("a job key is 1-100 letters, digits, '-' and '_'.")
        return data


@extend_schema_field({"type": "string", "pattern": r"^[ -~]{1,200}$"})
class LaunchIdentityField(serializers.CharField):
    def to_internal_value(self, data):
        if type(data) is not str or not LAUNCH_IDENTITY.match(data):
            raise serializers.ValidationError(
                "a launch identity is 1-200 printable ASCII characters (space to '~')."
            )
        return data


class LaunchRequestSerializer(serializers.Serializer):
    job = JobKeyField(help_text="the job's key (created on the token's cluster when new)")
    launch = LaunchIdentityField(
        help_text="the launch identity: the launcher's ids and a nonce drawn at the launch's"
        " start; the same identity always gets the same number"
    )


class LaunchReservedSerializer(serializers.Serializer):
    job = serializers.CharField()
    attempt = serializers.IntegerField(help_text="the launch number to report with")
    launch = serializers.CharField(help_text="the launch identity, as sent")
    created = serializers.BooleanField(
        help_text="true: a new number (201); false: the identity had it already (200)"
    )


PHASE_NAMES = [name for name, _, _ in PHASES]


class PhaseSerializer(serializers.Serializer):
    phase = serializers.ChoiceField(choices=PHASE_NAMES)
    label = serializers.CharField()
    who = serializers.ChoiceField(
        choices=["people", "machines"], help_text="who holds recovery up in this phase"
    )
    seconds = serializers.FloatField(allow_null=True, help_text="null: not reached (yet)")


class IncidentPhasesSerializer(serializers.Serializer):
    incident = serializers.IntegerField()
    time_to_recover_s = serializers.FloatField(allow_null=True)
    phases = PhaseSerializer(many=True)
    people_s = serializers.FloatField(help_text="the phases people hold up (approval), added")
    machines_s = serializers.FloatField(help_text="the other phases, added")


class PhaseMeanSerializer(serializers.Serializer):
    phase = serializers.ChoiceField(choices=PHASE_NAMES)
    label = serializers.CharField()
    who = serializers.ChoiceField(choices=["people", "machines"])
    incidents = serializers.IntegerField(help_text="incidents that reached this phase")
    mean_s = serializers.FloatField(allow_null=True)


class PhasesSummarySerializer(serializers.Serializer):
    cluster = serializers.CharField(allow_null=True)
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    incidents = serializers.IntegerField(help_text="incidents with a fault in the period")
    phases = PhaseMeanSerializer(many=True)
    people_share = serializers.FloatField(
        allow_null=True, help_text="the share of all phases' time spent waiting for people"
    )
