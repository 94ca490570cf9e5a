"""Recovery: actions on the cluster and their state machine, their audit trail,
remediation policies, and each cluster's recovery settings (driver, pause switch,
guardrail limits).

The Action row is the truth. Its state moves only through
`recovery.services.actions.action_transition` (a conditional UPDATE, audited); the
partial unique constraints on LEASE_STATES are the per-node and per-job lease: at
most one action at a time is decided to touch a node or a job.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

from incidents.models import Incident
from jobs.models import Cluster, Node, TrainingJob

# Not finished yet.
ACTIVE_STATES = ("proposed", "awaiting_approval", "approved", "queued", "running")
# States that hold the node's and the job's lease. An action awaiting approval does
# not: a person may take an hour to decide, and meanwhile the job that crashed must
# still be restarted automatically. The approval takes the lease (or is refused,
# naming its holder), and the stale check sends it back if the target moved on.
LEASE_STATES = ("proposed", "approved", "queued", "running")
TERMINAL_STATES = ("rejected", "expired", "succeeded", "failed", "cancelled")


class Action(models.Model):
    class Kind(models.TextChoices):
        RESTART_JOB = "restart_job"
        ROLLBACK = "rollback"
        REPLACE_NODE = "replace_node"
        REPLACE_AT_NEXT_CHECKPOINT = "replace_at_next_checkpoint"
        CORDON_NODE = "cordon_node"
        UNCORDON_NODE = "uncordon_node"
        DRAIN_NODE = "drain_node"
        SCALE_DOWN = "scale_down"
        VALIDATE_NODE = "validate_node"
        CHECKPOINT_JOB = "checkpoint_job"  # ask the running job to save a checkpoint now

    class State(models.TextChoices):
        PROPOSED = "proposed"
        AWAITING_APPROVAL = "awaiting_approval"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class Mode(models.TextChoices):
        AUTO = "auto"  # runs without a person, while the guardrails allow
        APPROVAL = "approval"  # waits for an operator other than the requester

    ACTIVE_STATES = ACTIVE_STATES
    LEASE_STATES = LEASE_STATES
    TERMINAL_STATES = TERMINAL_STATES

    kind = models.CharField(max_length=32, choices=Kind.choices)
    state = models.CharField(max_length=24, choices=State.choices, default=State.PROPOSED)
    mode = models.CharField(max_length=12, choices=Mode.choices, default=Mode.APPROVAL)
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="actions")
    # Indexed by the (node|job, -created_at) indexes below.
    node = models.ForeignKey(
        Node,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="actions",
        db_index=False,
    )
    job = models.ForeignKey(
        TrainingJob,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="actions",
        db_index=False,
    )
    # The spare a replacement claimed (spare -> active), kept so a re-run reuses it.
    spare = models.ForeignKey(
        Node, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    params = models.JSONField(default=dict, blank=True)
    reason = models.TextField(blank=True)
    incident = models.ForeignKey(
        Incident, on_delete=models.SET_NULL, null=True, blank=True, related_name="actions"
    )
    # Which policy rule proposed it ("" for a person's proposal), and the key that
    # makes a policy's proposal for one incident and target happen once.
    policy = models.CharField(max_length=200, blank=True)
    dedup_key = models.CharField(max_length=200, blank=True)

    requested_by = models.CharField(max_length=150, help_text='a username or "policy:<name>"')
    requested_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    approved_by = models.CharField(max_length=150, blank=True, help_text="who decided")
    approved_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    comment = models.TextField(blank=True, help_text="the decision's comment")

    dry_run = models.BooleanField(default=False)
    blocked_by = models.CharField(max_length=32, blank=True, help_text="the guardrail's name")
    blocked_reason = models.TextField(blank=True)
    # The target's state when it was proposed (or last sent back to the queue): a
    # change means an approval given on it is stale.
    target_snapshot = models.JSONField(default=dict, blank=True)

    attempts = models.PositiveIntegerField(default=0, help_text="driver runs started")
    deadline = models.DateTimeField(
        null=True, blank=True, help_text="queued or running past this: the reconciler acts"
    )
    expires_at = models.DateTimeField(null=True, blank=True, help_text="approval expiry")

    created_at = models.DateTimeField(auto_now_add=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    output = models.JSONField(default=dict, blank=True, help_text="what the driver reported")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(state__in=LEASE_STATES) & Q(node__isnull=False),
                name="action_one_active_per_node",
            ),
            models.UniqueConstraint(
                fields=["job"],
                condition=Q(state__in=LEASE_STATES) & Q(job__isnull=False),
                name="action_one_active_per_job",
            ),
            models.UniqueConstraint(
                fields=["dedup_key"], condition=~Q(dedup_key=""), name="action_unique_dedup_key"
            ),
        ]
        indexes = [
            # The reconciler's and the approval queue's polls.
            models.Index(
                fields=["deadline"],
                name="action_queue_deadline",
                condition=Q(state__in=("queued", "running")),
            ),
            models.Index(
                fields=["expires_at"],
                name="action_awaiting_expiry",
                condition=Q(state="awaiting_approval"),
            ),
            models.Index(fields=["cluster", "state", "-created_at"], name="action_cluster_state"),
            # The unfinished ones, for /metrics at every scrape.
            models.Index(
                fields=["cluster"], name="action_active", condition=Q(state__in=ACTIVE_STATES)
            ),
            models.Index(fields=["job", "-created_at"], name="action_by_job"),
            models.Index(fields=["node", "-created_at"], name="action_by_node"),
        ]

    def __str__(self):
        target = self.node or self.job or self.cluster
        return f"#{self.pk} {self.kind} {target} ({self.state})"


class ActionAudit(models.Model):
    """An append-only entry: who or what moved an action, when, from, to and why."""

    action = models.ForeignKey(Action, on_delete=models.CASCADE, related_name="audit")
    at = models.DateTimeField()
    actor = models.CharField(max_length=150)
    from_state = models.CharField(max_length=24, blank=True, help_text='"" at creation')
    to_state = models.CharField(max_length=24)
    reason = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["action", "at"], name="action_audit_by_action")]

    def __str__(self):
        return f"#{self.action_id} {self.from_state or '-'} -> {self.to_state} by {self.actor}"


class ClusterRecoverySettings(models.Model):
    """A cluster's recovery switches: its driver, the pause switch, dry-run and the
    guardrails' limits. A cluster without a row uses the field defaults (and the
    REBOUND_RECOVERY_DRIVER setting for its driver)."""

    cluster = models.OneToOneField(
        Cluster, on_delete=models.CASCADE, primary_key=True, related_name="recovery_settings"
    )
    driver = models.CharField(max_length=32, blank=True, help_text='"" : the site default')
    driver_options = models.JSONField(default=dict, blank=True)
    paused = models.BooleanField(default=False)
    pause_reason = models.CharField(max_length=500, blank=True)
    paused_by = models.CharField(max_length=150, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    dry_run = models.BooleanField(default=False, help_text="record what would be done, only")
    storm_max_share = models.FloatField(
        default=0.10, help_text="automatic isolation stops above this share of the nodes"
    )
    storm_max_nodes = models.PositiveIntegerField(
        null=True,
        blank=True,
        default=10,
        help_text="and above this many nodes, whatever the cluster's size (empty: no cap)",
    )
    storm_window_s = models.FloatField(default=600.0)
    cooldown_s = models.FloatField(
        default=900.0, help_text="no automatic action on a target this soon after one failed"
    )
    approval_ttl_s = models.FloatField(default=1800.0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "cluster recovery settings"

    def __str__(self):
        return f"recovery settings of {self.cluster_id}"


class RecoveryPolicy(models.Model):
    """One rule: incidents of `trigger` propose `kind` in `mode`, for a cluster or one
    of its jobs (which wins). Rules not set here follow recovery.policies.DEFAULTS."""

    class Mode(models.TextChoices):
        AUTO = "auto"
        APPROVAL = "approval"
        OFF = "off"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="recovery_policies")
    job = models.ForeignKey(
        TrainingJob,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="recovery_policies",
    )
    trigger = models.CharField(max_length=32)
    kind = models.CharField(max_length=32, choices=Action.Kind.choices)
    mode = models.CharField(max_length=12, choices=Mode.choices)
    position = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="order in the trigger's chain; the defaults sit at 10, 20, ...",
    )
    updated_by = models.CharField(max_length=150, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "recovery policies"
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "trigger", "kind"],
                condition=Q(job=None),
                name="recovery_policy_one_per_cluster",
            ),
            models.UniqueConstraint(
                fields=["job", "trigger", "kind"],
                condition=Q(job__isnull=False),
                name="recovery_policy_one_per_job",
            ),
        ]

    def __str__(self):
        scope = f"job {self.job_id}" if self.job_id else f"cluster {self.cluster_id}"
        return f"{self.trigger} -> {self.kind} {self.mode} ({scope})"
