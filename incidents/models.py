"""Incidents: one fault and its recovery, with the times and lost compute of the design."""

from django.db import models
from django.db.models import Q

from jobs.models import Cluster, Node, TrainingJob


class Incident(models.Model):
    class Cause(models.TextChoices):
        GPU = "gpu"
        MEMORY = "memory"
        NETWORK = "network"
        HOST = "host"
        SOFTWARE = "software"
        HANG = "hang"
        STRAGGLER = "straggler"
        TRAINING_INSTABILITY = "training_instability"
        PREEMPTION = "preemption"
        # An interruption inside a declared maintenance window: its cost is shown, but it
        # is not a failure (not in failure counts or MTBF).
        PLANNED = "planned"
        UNKNOWN = "unknown"

    class State(models.TextChoices):
        OPEN = "open"
        RECOVERED = "recovered"
        RESOLVED = "resolved"

    # The states of an incident still being worked on.
    OPEN_STATES = (State.OPEN,)

    class Severity(models.TextChoices):
        CRITICAL = "critical"
        MAJOR = "major"
        MINOR = "minor"

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="incidents")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="incidents")
    # One incident per fault episode: the detector and what identifies the
    # episode within the job (for a launch's fault: the launch's number).
    detector = models.CharField(max_length=32)
    episode = models.CharField(max_length=64)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    cause = models.CharField(max_length=24, choices=Cause.choices)
    fault_type = models.CharField(max_length=24, blank=True)
    xid = models.PositiveIntegerField(null=True, blank=True)
    severity = models.CharField(max_length=12, choices=Severity.choices)
    state = models.CharField(max_length=12, choices=State.choices, default=State.OPEN)
    summary = models.CharField(max_length=300)
    nodes = models.ManyToManyField(Node, blank=True, related_name="incidents")
    ranks = models.JSONField(default=list, blank=True)
    evidence = models.JSONField(default=list, blank=True, help_text="client ids of the events")

    fault_at = models.DateTimeField()
    detected_at = models.DateTimeField()
    opened_at = models.DateTimeField(auto_now_add=True)
    # Where the time to recover went, on the job's clock (see recovery.selectors.phases):
    # the next launch started, and it had its state back and could step again.
    relaunched_at = models.DateTimeField(null=True, blank=True)
    restored_at = models.DateTimeField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)
    recovered_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    lost_gpu_seconds = models.FloatField(default=0.0)
    lost_breakdown = models.JSONField(default=dict, blank=True)

    root_cause = models.TextField(blank=True)
    postmortem = models.TextField(blank=True)

    class Meta:
        ordering = ["-fault_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "detector", "episode"], name="incident_one_per_episode"
            )
        ]
        indexes = [
            models.Index(fields=["cluster", "-fault_at"], name="incident_cluster_time"),
            models.Index(
                fields=["job"], name="incident_awaiting_recovery", condition=Q(recovered_at=None)
            ),
            # The few open ones, for /metrics at every scrape.
            models.Index(fields=["cluster"], name="incident_open", condition=Q(state="open")),
        ]

    def __str__(self):
        return f"#{self.pk} {self.cause} on {self.job_id}"

    @property
    def time_to_detect_s(self) -> float:
        return (self.detected_at - self.fault_at).total_seconds()

    @property
    def time_to_resume_s(self) -> float | None:
        return (
            None if self.resumed_at is None else (self.resumed_at - self.fault_at).total_seconds()
        )

    @property
    def time_to_recover_s(self) -> float | None:
        if self.recovered_at is None:
            return None
        return (self.recovered_at - self.fault_at).total_seconds()

    @property
    def lost_gpu_hours(self) -> float:
        return self.lost_gpu_seconds / 3600.0


class TimelineEntry(models.Model):
    """An append-only entry of an incident's timeline."""

    class Kind(models.TextChoices):
        SIGNAL = "signal"
        DETECTION = "detection"
        STATE_CHANGE = "state_change"
        NOTE = "note"
        ACTION = "action"
        APPROVAL = "approval"
        NOTIFICATION = "notification"  # a delivery attempt to a channel (notify)

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="timeline")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    at = models.DateTimeField(help_text="when it happened (the job's clock for signals)")
    actor = models.CharField(max_length=150, help_text="who or what: a user, a detector, a job")
    source = models.CharField(max_length=64, blank=True)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self):
        return f"{self.incident_id} {self.kind} {self.at}"


class DetectorSetting(models.Model):
    """A detector's parameter for one cluster, or one job (which wins), set at run time.

    Detectors read it on every pass (see incidents.settings), so a change
    takes effect without restarting anything.
    """

    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, null=True, blank=True, related_name="detector_settings"
    )
    job = models.ForeignKey(
        TrainingJob,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="detector_settings",
    )
    name = models.CharField(max_length=64)
    value = models.JSONField()
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True, help_text="who set it last")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "name"],
                condition=Q(job=None),
                name="detector_setting_one_per_cluster",
            ),
            models.UniqueConstraint(
                fields=["job", "name"],
                condition=Q(job__isnull=False),
                name="detector_setting_one_per_job",
            ),
            models.CheckConstraint(
                condition=Q(cluster__isnull=False) | Q(job__isnull=False),
                name="detector_setting_has_a_scope",
            ),
        ]

    def __str__(self):
        scope = f"job {self.job_id}" if self.job_id else f"cluster {self.cluster_id}"
        return f"{self.name}={self.value} ({scope})"


class DetectorState(models.Model):
    """What the detectors have read of a job so far and what they carry forward
    (see incidents.detectors.engine), so that a pass reads only what was stored since."""

    job = models.OneToOneField(
        TrainingJob, on_delete=models.CASCADE, primary_key=True, related_name="detector_state"
    )
    data = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)
    # How long the last full pass took: passes are spaced by it (incidents.receivers).
    last_pass_s = models.FloatField(default=0.0)
    # The last pass that could not judge something of this job, and why: shown to
    # operators (admin) and logged at ERROR; cleared by the next clean pass.
    failed_at = models.DateTimeField(null=True, blank=True)
    failure = models.TextField(blank=True)

    def __str__(self):
        return f"detector state of {self.job_id}"


class SweepState(models.Model):
    """The periodic sweep's memory (one row): when it last ran, and since when it has
    run without a break. Kept in the database: a cache that is wiped (a Redis restart)
    would make the sweep skip what happened while the broker was away."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    at = models.DateTimeField()
    since = models.DateTimeField()

    def __str__(self):
        return f"sweep at {self.at}, unbroken since {self.since}"


class Alert(models.Model):
    """One Alertmanager alert as Rebound received it (incidents.alerts): where it points
    (node), what fault it stands for, and the incidents it opened or joined.

    Unique on (cluster, fingerprint, starts_at): Alertmanager sends a firing alert again
    every repeat_interval, and each delivery after the first changes nothing but
    `last_received_at` and `receipts`. The same alert firing again after it resolved
    starts anew (a new `startsAt`): a new row."""

    class Status(models.TextChoices):
        FIRING = "firing"
        RESOLVED = "resolved"

    class Outcome(models.TextChoices):
        INCIDENT = "incident"  # a fault reported for the jobs running on its node
        NO_JOB = "no_job"  # its node runs no job: the node was marked suspect
        UNKNOWN_NODE = "unknown_node"  # a node label names no node of the cluster
        NO_NODE = "no_node"  # none of the node labels is present
        IGNORED = "ignored"  # no rule maps it to a fault (alerts.unmatched = ignore)
        RESOLVED_FIRST = "resolved_first"  # first heard of as resolved: nothing to do

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="alerts")
    fingerprint = models.CharField(max_length=64)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices)
    alertname = models.CharField(max_length=200, blank=True)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)
    generator_url = models.CharField(max_length=1000, blank=True)
    node_label = models.CharField(
        max_length=200, blank=True, help_text="the node as the alert's labels name it"
    )
    node = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="alerts"
    )
    fault_type = models.CharField(max_length=24, blank=True, help_text="blank: ignored")
    xid = models.PositiveIntegerField(null=True, blank=True)
    rule = models.CharField(max_length=100, blank=True, help_text="the rule that mapped it")
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    # The fault events it reported, one per job running on its node: {"job", "event"}.
    events = models.JSONField(default=list, blank=True)
    incidents = models.ManyToManyField(Incident, blank=True, related_name="alerts")
    first_received_at = models.DateTimeField()
    last_received_at = models.DateTimeField()
    resolved_received_at = models.DateTimeField(null=True, blank=True)
    receipts = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["-last_received_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "fingerprint", "starts_at"], name="alert_one_per_start"
            )
        ]
        indexes = [
            models.Index(fields=["cluster", "-last_received_at"], name="alert_cluster_recent"),
        ]

    def __str__(self):
        return f"{self.alertname or self.fingerprint} {self.status} ({self.cluster_id})"
