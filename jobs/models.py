"""The ledger's data: clusters, nodes, training jobs, their launches, the raw
event stream and what ingest projects out of it (steps, rank windows,
checkpoints), and what a cluster's nodes cost and when they are down for
maintenance.

Long module: the models of one app, read together (Django finds them here).

Stream rows (events, steps, rank windows) keep `ts` as float seconds since the
epoch on the job's own clock: microsecond precision, no time-zone handling, and
the accounting reads them as plain numbers. Summary rows (attempts,
checkpoints, jobs) use datetimes for people and the API.
"""

from django.db import models
from django.db.models import Q

from common.vocabulary import EVENT_KINDS, LAUNCH_KINDS, TIMELINE_KINDS


class Cluster(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # What a GPU-hour costs here, so lost compute shows in money next to GPU-hours;
    # a node pool's own price (NodePoolPrice) wins for its nodes. Unset: no money shown.
    gpu_hour_price = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    currency = models.CharField(max_length=3, default="USD", help_text="ISO 4217 code")

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Node(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active"
        SUSPECT = "suspect"
        CORDONED = "cordoned"
        DRAINING = "draining"
        IN_REPAIR = "in_repair"
        SPARE = "spare"
        RETIRED = "retired"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=128)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    gpus = models.PositiveIntegerField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)  # on the job's clock
    # When the console last received a heartbeat from it (its own clock), for the sweep.
    last_heard_at = models.DateTimeField(null=True, blank=True)
    # Made by a person (the admin, `set_node_state --create`) rather than by ingest
    # naming it: storm protection counts a cluster's nodes as the registered ones and
    # those heard from lately, so a batch naming made-up nodes cannot raise its limit.
    registered = models.BooleanField(default=True)
    # The node pool (a kind of machine, a reservation) it belongs to, for its price.
    pool = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_name_per_cluster")
        ]
        indexes = [models.Index(fields=["cluster", "state"], name="node_cluster_state")]

    def __str__(self):
        return f"{self.cluster_id}/{self.name}"


class NodePoolPrice(models.Model):
    """A node pool's price per GPU-hour, where it differs from its cluster's."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pool_prices")
    pool = models.CharField(max_length=64)
    gpu_hour_price = models.DecimalField(max_digits=12, decimal_places=4)

    class Meta:
        ordering = ["cluster_id", "pool"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "pool"], name="pool_price_one_per_pool")
        ]

    def __str__(self):
        return f"{self.cluster_id}/{self.pool}: {self.gpu_hour_price}"


class MaintenanceWindow(models.Model):
    """Planned maintenance of a cluster's nodes (all of them when `nodes` is empty):
    an interruption inside it is `planned`, not a failure; detectors raise no fault
    for its nodes and remediation leaves them alone while it lasts."""

    class PreAction(models.TextChoices):
        NONE = "none"
        CHECKPOINT_NOW = "checkpoint_now"
        DRAIN_AT_NEXT_CHECKPOINT = "drain_at_next_checkpoint"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="maintenance")
    nodes = models.ManyToManyField(Node, blank=True, related_name="maintenance")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.CharField(max_length=300, blank=True)
    pre_action = models.CharField(max_length=32, choices=PreAction.choices, default=PreAction.NONE)
    # How long before `starts_at` the pre-maintenance action is proposed.
    pre_action_lead_s = models.PositiveIntegerField(default=600)
    pre_action_proposed_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-starts_at", "-id"]
        indexes = [models.Index(fields=["cluster", "ends_at"], name="maintenance_cluster_end")]
        constraints = [
            models.CheckConstraint(
                condition=Q(ends_at__gt=models.F("starts_at")), name="maintenance_ends_after_start"
            )
        ]

    def __str__(self):
        return f"maintenance of {self.cluster_id} {self.starts_at} -> {self.ends_at}"


class TrainingJob(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"  # known, no launch reported yet
        RUNNING = "running"  # the latest launch has not ended
        INTERRUPTED = "interrupted"  # the latest launch ended without completing
        COMPLETED = "completed"  # job_finished after a completed launch
        FAILED = "failed"  # job_finished after a launch that did not complete

    key = models.SlugField(max_length=100, unique=True)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="jobs")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    # The job's clock, as seconds since the epoch: the ledger runs to
    # last_event_ts while the job runs.
    first_event_ts = models.FloatField(null=True, blank=True)
    last_event_ts = models.FloatField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_step = models.BigIntegerField(null=True, blank=True)
    last_step_ts = models.FloatField(null=True, blank=True)
    # The console's clock when the job's latest events arrived: a job that went
    # silent cannot move its own clock, so the periodic sweep judges by this.
    last_received_at = models.DateTimeField(null=True, blank=True)
    # Bumped by every ingest that stored something for the job: cached
    # figures computed at an older revision are stale.
    revision = models.BigIntegerField(default=0)
    events_count = models.BigIntegerField(default=0)
    # The latest finish an operator reopened (job clock): a job_finished at or before
    # it no longer finishes the job, so a late copy of it cannot close the job again.
    reopened_finish_ts = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["cluster", "status"], name="job_cluster_status")]

    def __str__(self):
        return self.key


class Attempt(models.Model):
    """One launch of a job, as its lifecycle events describe it."""

    class EndReason(models.TextChoices):
        COMPLETED = "completed"
        FAILED = "failed"
        KILLED = "killed"
        PREEMPTED = "preempted"

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    world_size = models.PositiveIntegerField(null=True, blank=True)
    gpus_per_node = models.PositiveIntegerField(null=True, blank=True)
    nodes = models.ManyToManyField(Node, blank=True, related_name="attempts")
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=16, choices=EndReason.choices, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # Its nodes counted by pool ({pool: n}, "" for none), kept with the nodes and their
    # pools (jobs.services.lifecycle, jobs.services.pricing.node_set_pool), so that
    # pricing a launch of thousands of nodes reads one row; null: not counted.
    pool_counts = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_number")
        ]

    def __str__(self):
        return f"{self.job_id}#{self.number}"


class LaunchReservation(models.Model):
    """A launch number handed out before the launch reports anything: one per launch
    identity (`POST /api/v1/launches`, `jobs.services.launches.launch_reserve`).

    The identity is the launcher's ids and a nonce drawn at the launch's start, so a
    torchrun restart, a Slurm requeue or a resubmission never gets an old number."""

    IDENTITY_MAX = 200

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="reservations")
    attempt = models.PositiveIntegerField()
    identity = models.CharField(max_length=IDENTITY_MAX)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job_id", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["job", "identity"], name="reservation_unique_identity"),
            models.UniqueConstraint(fields=["job", "attempt"], name="reservation_unique_attempt"),
        ]

    def __str__(self):
        return f"{self.job_id}#{self.attempt} ({self.identity})"


# The stream tables (events, steps, rank windows) take most of the writes.
# Their job is locked and known to exist when ingest writes them, so the
# database checks no foreign key per row (those checks were a third of the
# database's work per batch), and the job column is indexed as the first
# column of each table's unique key rather than on its own. Django still
# cascades deletes.
STREAM_FK = {"on_delete": models.CASCADE, "db_constraint": False, "db_index": False}


class Event(models.Model):
    """The raw stream exactly as received, deduplicated on (job, client id)."""

    # One member per kind of common.vocabulary (ATTEMPT_STARTED = "attempt_started", ...).
    Kind = models.TextChoices("Kind", [(kind.upper(), kind) for kind in EVENT_KINDS])

    TIMELINE_KINDS = TIMELINE_KINDS
    LAUNCH_KINDS = LAUNCH_KINDS

    job = models.ForeignKey(TrainingJob, related_name="events", **STREAM_FK)
    client_id = models.CharField(max_length=128)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    ts = models.FloatField(help_text="seconds since the epoch, on the job's clock")
    attempt = models.PositiveIntegerField(null=True, blank=True)
    node = models.CharField(max_length=128, blank=True)
    rank = models.IntegerField(null=True, blank=True)
    data = models.JSONField(default=dict)
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "client_id"], name="event_unique_client_id")
        ]
        indexes = [
            # Lifecycle events are a small share of the stream: a partial index
            # finds them without paying for an index on every step and window.
            models.Index(
                fields=["job", "ts"],
                name="event_lifecycle_by_job",
                condition=Q(kind__in=TIMELINE_KINDS),
            ),
            models.Index(
                fields=["job", "ts"],
                name="event_launch_by_job",
                condition=Q(kind__in=LAUNCH_KINDS),
            ),
        ]

    def __str__(self):
        return f"{self.job_id}:{self.client_id} {self.kind}"


class StepRecord(models.Model):
    """One execution of a step in one launch (rank 0's report)."""

    job = models.ForeignKey(TrainingJob, related_name="steps", **STREAM_FK)
    attempt = models.PositiveIntegerField()
    step = models.BigIntegerField()
    ts = models.FloatField()
    loss = models.FloatField(null=True, blank=True)
    grad_norm = models.FloatField(null=True, blank=True)
    tokens = models.BigIntegerField(null=True, blank=True)
    step_time_s = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "step"], name="step_unique_per_attempt"
            )
        ]

    def __str__(self):
        return f"{self.job_id}#{self.attempt} step {self.step}"


class WindowFields(models.Model):
    """A rank's means over a window of steps of one launch (the wire's `rank_window`)."""

    attempt = models.PositiveIntegerField()
    rank = models.IntegerField()
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    ts = models.FloatField()
    compute_s = models.FloatField()
    step_s = models.FloatField()
    comm_wait_s = models.FloatField(null=True, blank=True)
    data_wait_s = models.FloatField(null=True, blank=True)

    class Meta:
        abstract = True


class RankWindow(WindowFields):
    """Per-rank means over a window of steps: where stragglers show."""

    job = models.ForeignKey(TrainingJob, related_name="rank_windows", **STREAM_FK)
    node = models.ForeignKey(
        Node,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="rank_windows",
        db_constraint=False,
        db_index=False,
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "rank", "first_step"], name="rank_window_unique"
            )
        ]

    def __str__(self):
        return (
            f"{self.job_id}#{self.attempt} rank {self.rank} [{self.first_step}..{self.last_step}]"
        )


class Checkpoint(models.Model):
    """A checkpoint of `step` written during one launch."""

    # Tiers that do not survive the loss of a node: not a safe restart point.
    NON_DURABLE_TIERS = ("memory", "local")

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.PositiveIntegerField()
    step = models.BigIntegerField()
    save_started_at = models.DateTimeField(null=True, blank=True)
    saved_at = models.DateTimeField(null=True, blank=True)
    blocking_s = models.FloatField(null=True, blank=True)
    bytes = models.BigIntegerField(null=True, blank=True)
    uri = models.CharField(max_length=1024, blank=True)
    tier = models.CharField(max_length=32, blank=True)
    durable = models.BooleanField(default=False)

    class Meta:
        ordering = ["job_id", "saved_at", "step"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "step"], name="checkpoint_unique_per_attempt"
            )
        ]
        indexes = [
            models.Index(
                fields=["job", "-saved_at"],
                name="checkpoint_durable_latest",
                condition=Q(durable=True),
            )
        ]

    def __str__(self):
        return f"{self.job_id} step {self.step} ({self.tier or 'default'})"


class HeartbeatBucket(models.Model):
    """When a node of a job sent heartbeats, summarised in buckets of BUCKET_S seconds.

    The first and last heartbeat of each bucket are enough to find every
    silence longer than a bucket, whatever order heartbeats arrive in, without
    reading the raw stream.
    """

    BUCKET_S = 10

    job = models.ForeignKey(TrainingJob, related_name="heartbeat_buckets", **STREAM_FK)
    node = models.CharField(max_length=128)
    bucket = models.BigIntegerField(help_text="floor(ts / BUCKET_S)")
    first_ts = models.FloatField()
    last_ts = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "node", "bucket"], name="heartbeat_bucket_unique"
            )
        ]

    def __str__(self):
        return f"{self.job_id} {self.node} [{self.first_ts}..{self.last_ts}]"


class LedgerSnapshot(models.Model):
    """The cumulative ledger of a job as computed at `revision`."""

    job = models.OneToOneField(TrainingJob, on_delete=models.CASCADE, related_name="ledger")
    revision = models.BigIntegerField()
    figures = models.JSONField()
    computed_at = models.DateTimeField(auto_now=True)
    # The latest revision whose ledger the apps were told of (`ledger_refreshed`): a
    # reader that stored the current figures first told no one.
    announced_revision = models.BigIntegerField(default=0)

    def __str__(self):
        return f"ledger of {self.job_id} at r{self.revision}"


# --- what storage upkeep keeps of the streams (jobs.services.upkeep) ---------------


class RankWindowHour(models.Model):
    """A node's rank windows of one launch and one hour (job clock), once the raw
    windows are past `REBOUND_KEEP_RANK_WINDOWS_S`: how its ranks computed."""

    job = models.ForeignKey(TrainingJob, related_name="rank_window_hours", **STREAM_FK)
    attempt = models.PositiveIntegerField()
    node = models.ForeignKey(
        Node,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    hour = models.BigIntegerField(help_text="floor(ts / 3600)")
    windows = models.PositiveIntegerField(help_text="rank windows rolled up")
    compute_min_s = models.FloatField()
    compute_mean_s = models.FloatField()
    compute_max_s = models.FloatField()
    step_mean_s = models.FloatField()
    slowest_rank = models.IntegerField(help_text="the rank of the slowest compute")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "node", "hour"], name="rank_window_hour_unique"
            )
        ]

    def __str__(self):
        return f"{self.job_id}#{self.attempt} node {self.node_id} hour {self.hour}"


class EvidenceWindow(WindowFields):
    """A rank window an incident names as evidence, kept when the raw windows go."""

    job = models.ForeignKey(TrainingJob, related_name="evidence_windows", **STREAM_FK)
    node = models.ForeignKey(
        Node,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "rank", "first_step"], name="evidence_window_unique"
            )
        ]

    def __str__(self):
        return f"{self.job_id}#{self.attempt} rank {self.rank} [{self.first_step}] (evidence)"


class StreamRollup(models.Model):
    """How far upkeep has rolled a job's streams up: the stream tables' ids it has
    been through, and the job-clock time before which raw rank windows are gone."""

    job = models.OneToOneField(TrainingJob, on_delete=models.CASCADE, related_name="rollup")
    beats_upto_id = models.BigIntegerField(default=0)
    windows_upto_id = models.BigIntegerField(default=0)
    # Per launch, the highest first step rolled up: a window at or below it that
    # arrives later (a resend) is not stored again. {"<attempt>": step}
    windows_rolled = models.JSONField(default=dict)
    # The job's revision when upkeep last went through it, and whether detection had
    # not read far enough then: a job with nothing new since is not visited again.
    revision = models.BigIntegerField(default=0)
    waiting = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"rollup of {self.job_id}"


class UpkeepRun(models.Model):
    """One run of storage upkeep, and what it did."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # The highest event id when the run started: a later run drops the high-volume
    # raw events up to it once it is REBOUND_KEEP_WINDOW_EVENTS_S old.
    event_id_at_start = models.BigIntegerField()
    events_dropped_upto = models.BigIntegerField(default=0)
    report = models.JSONField(default=dict)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self):
        return f"upkeep at {self.started_at:%Y-%m-%d %H:%M:%S}"
