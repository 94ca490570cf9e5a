"""Notifications: the channels messages go out through, the rules that say which
events go to which channel, and the record of every message (`Notification`) and of
every delivery attempt (`DeliveryAttempt`).

A Notification groups the events of one (rule, event, cluster) that arrive within
the rule's group window: while `open_group` is set it takes more subjects, and at
most one per (rule, event, cluster) is open (a partial unique constraint). The
delivery task claims it with a conditional UPDATE (notify.services.delivery).
"""

from django.db import models
from django.db.models import Q

from incidents.models import Incident
from jobs.models import Cluster
from recovery.models import Action

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


class Event(models.TextChoices):
    INCIDENT_OPENED = "incident_opened"
    INCIDENT_RESOLVED = "incident_resolved"
    APPROVAL_WAITING = "approval_waiting"
    APPROVAL_EXPIRING = "approval_expiring"
    ACTION_FAILED = "action_failed"
    STORM_TRIPPED = "storm_tripped"
    TEST = "test"  # "send test": a channel's test message, no rule


# The events a rule may name (a test message goes to its channel only).
RULE_EVENTS = [e for e in Event.values if e != Event.TEST]


class Channel(models.Model):
    class Kind(models.TextChoices):
        WEBHOOK = "webhook"
        SLACK = "slack"
        PAGERDUTY = "pagerduty"
        EMAIL = "email"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    url = models.URLField(
        max_length=500, blank=True, help_text="webhook and Slack; PagerDuty: its Events API v2"
    )
    secret = models.CharField(
        max_length=200, blank=True, help_text="webhook: the HMAC key; PagerDuty: the routing key"
    )
    emails = models.JSONField(default=list, blank=True, help_text="e-mail: the addresses")
    rate_limit_per_minute = models.PositiveIntegerField(
        default=30, help_text="deliveries a minute at most; more wait for the next slot"
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.kind})"


class Rule(models.Model):
    """Which events go to a channel. An empty filter lets everything through; severity
    and cause filters apply to an incident, or to the incident an action answers."""

    name = models.CharField(max_length=100, unique=True)
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="rules")
    clusters = models.JSONField(default=list, blank=True, help_text="cluster names; empty: all")
    severities = models.JSONField(default=list, blank=True, help_text="empty: all")
    causes = models.JSONField(
        default=list, blank=True, help_text="incident causes; empty: all but planned"
    )
    events = models.JSONField(default=list, blank=True, help_text="empty: all")
    group_window_s = models.PositiveIntegerField(
        default=60, help_text="events within this many seconds go out as one message"
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Notification(models.Model):
    """One message to send: the events of one (rule, event, cluster) grouped."""

    class State(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"

    rule = models.ForeignKey(
        Rule, on_delete=models.SET_NULL, null=True, blank=True, related_name="notifications"
    )
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=24, choices=Event.choices)
    # The first subject's incident and action: the message's filterable anchor.
    incident = models.ForeignKey(
        Incident, on_delete=models.SET_NULL, null=True, blank=True, related_name="notifications"
    )
    action = models.ForeignKey(
        Action, on_delete=models.SET_NULL, null=True, blank=True, related_name="notifications"
    )
    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, null=True, blank=True, related_name="notifications"
    )
    # Every incident the message is about (its subjects' and their actions'), to filter by.
    incidents = models.ManyToManyField(Incident, blank=True, related_name="+")
    # [{"incident": id} | {"action": id}, ...], in the order the events came.
    subjects = models.JSONField(default=list, blank=True)
    detail = models.JSONField(default=dict, blank=True, help_text="what the event adds (why)")
    open_group = models.BooleanField(default=True, help_text="still takes more subjects")
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "event", "cluster"],
                condition=Q(open_group=True),
                name="notification_one_open_group",
            )
        ]
        indexes = [
            # The resend sweep's poll (notify.services.notifications_resend).
            models.Index(
                fields=["next_attempt_at"],
                name="notification_pending_due",
                condition=Q(state="pending"),
            ),
            models.Index(fields=["incident", "-created_at"], name="notification_by_incident"),
        ]

    def __str__(self):
        return f"#{self.pk} {self.event} via {self.channel_id} ({self.state})"


class DeliveryAttempt(models.Model):
    """One try to deliver a notification, its slot in the channel's rate limit taken
    when it starts."""

    class Outcome(models.TextChoices):
        SENDING = "sending"
        SENT = "sent"
        ERROR = "error"

    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="delivery_attempts"
    )
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="+")
    number = models.PositiveIntegerField()
    at = models.DateTimeField()
    outcome = models.CharField(max_length=8, choices=Outcome.choices, default=Outcome.SENDING)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["channel", "at"], name="delivery_by_channel")]

    def __str__(self):
        return f"#{self.notification_id} try {self.number}: {self.outcome}"


class Announcement(models.Model):
    """An event announced once per occurrence, whatever the number of rules: an
    approval about to expire (per action and expiry) and a storm trip (per cluster,
    `at` renewed while the trip goes on)."""

    key = models.CharField(max_length=200, unique=True)
    at = models.DateTimeField()

    def __str__(self):
        return self.key
