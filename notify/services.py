"""Writes of the notify app: recording what happened as notifications (grouped per
rule, event and cluster within the rule's window), delivering them (claimed, rate
limited per channel, retried with backoff, every attempt recorded and put on the
incident's timeline), the test send, and the periodic announcements (approvals about
to expire) and resends.

Delivery is handed to Celery through `common.outbox` (task `notify.deliver`, keyed by
the notification), written in the same transaction as the row: it survives a broker
outage. The task may run twice: a delivery claims its row with a conditional UPDATE
(pending, the attempt count it read, due) that also pushes `next_attempt_at` past the
attempt's longest run, so a second message finds nothing due.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from common.outbox import Work, outbox_enqueue
from incidents.models import Incident, TimelineEntry
from incidents.services import timeline_entry_add
from notify import messages, selectors, transport
from notify.models import Announcement, Channel, DeliveryAttempt, Event, Notification
from recovery.models import Action
from recovery.selectors import cluster_settings

logger = logging.getLogger(__name__)

DELIVER_TASK = "notify.deliver"
MAX_ATTEMPTS = 6
# A claimed delivery runs no longer than this (the task's time limit is below it); a
# row still pending past it was lost with its worker and is sent again.
CLAIM_S = 300.0
# A countdown may fire a little early: a message this close to its due time may claim.
EARLY_S = 1.0
# A pending row this far past its due time lost its message: the resend sweep sends it.
RESEND_AFTER_S = 60.0
RATE_WINDOW_S = 60.0

P = Notification.State


def backoff_s(attempt: int) -> float:
    """The wait after failed attempt `attempt` (1, 2, ...): base, 2 x base, 4 x base ...
    capped (REBOUND_NOTIFY_RETRY_BASE_S, REBOUND_NOTIFY_RETRY_MAX_S)."""
    base = settings.REBOUND_NOTIFY_RETRY_BASE_S
    return min(base * 2 ** (attempt - 1), settings.REBOUND_NOTIFY_RETRY_MAX_S)


def _deliver_later(notification_id: int, delay_s: float) -> None:
    outbox_enqueue([Work(DELIVER_TASK, str(notification_id), [notification_id], max(0.0, delay_s))])


# --- recording events --------------------------------------------------------------


def event_record(
    *,
    event: str,
    cluster_id: int | None,
    incident: Incident | None = None,
    action: Action | None = None,
    detail: dict | None = None,
    join_only: bool = False,
    now=None,
) -> list[Notification]:
    """The event, as a subject (`incident` or else `action`), for every rule it matches:
    it joins the rule's open group for (event, cluster), or opens one due after the
    rule's group window. With `join_only`, it only joins (a storm's later actions).
    Severity and cause filters read `incident` (for an action: the one it answers)."""
    now = now or timezone.now()
    if action is not None and incident is None and action.incident_id:
        incident = Incident.objects.filter(pk=action.incident_id).first()
    subject = {"action": action.pk} if action is not None else {"incident": incident.pk}
    rules = selectors.rules_matching(event=event, cluster_id=cluster_id, incident=incident)
    out = []
    for rule in rules:
        n = _group_join(
            rule=rule,
            event=event,
            cluster_id=cluster_id,
            subject=subject,
            incident=incident,
            action=action,
            detail=detail or {},
            join_only=join_only,
            now=now,
        )
        if n is not None:
            out.append(n)
    return out


def _group_join(*, rule, event, cluster_id, subject, incident, action, detail, join_only, now):
    for _ in range(3):  # another process opened the group meanwhile: join that one
        with transaction.atomic():
            n = (
                Notification.objects.select_for_update()
                .filter(rule=rule, event=event, cluster_id=cluster_id, open_group=True)
                .first()
            )
            if n is not None:
                if subject not in n.subjects:
                    n.subjects.append(subject)
                    n.save(update_fields=["subjects"])
                    if incident is not None:
                        n.incidents.add(incident)
                return n
            if join_only:
                return None
            try:
                with transaction.atomic():
                    n = Notification.objects.create(
                        rule=rule,
                        channel=rule.channel,
                        event=event,
                        incident=incident,
                        action=action,
                        cluster_id=cluster_id,
                        subjects=[subject],
                        detail=detail,
                        next_attempt_at=now + timedelta(seconds=rule.group_window_s),
                    )
            except IntegrityError:
                continue
            if incident is not None:
                n.incidents.add(incident)
            _deliver_later(n.pk, rule.group_window_s)
            return n
    raise RuntimeError(f"could not open or join a group of rule {rule.pk} for {event}")


def storm_trip_record(*, action: Action, now=None) -> list[Notification]:
    """The storm guardrail held `action`: one notification per cluster and trip. A trip
    goes on while held actions keep coming within the cluster's storm window; its
    later actions join the trip's message while that is still open."""
    now = now or timezone.now()
    window = timedelta(seconds=cluster_settings(action.cluster_id).storm_window_s)
    key = f"storm_tripped:{action.cluster_id}"
    with transaction.atomic():
        mark, created = Announcement.objects.select_for_update().get_or_create(
            key=key, defaults={"at": now}
        )
        new_trip = created or mark.at < now - window
        mark.at = now
        mark.save(update_fields=["at"])
        return event_record(
            event=Event.STORM_TRIPPED,
            cluster_id=action.cluster_id,
            action=action,
            detail={"why": action.blocked_reason},
            join_only=not new_trip,
            now=now,
        )


def approvals_expiring_record(*, now=None) -> int:
    """Actions still awaiting approval REBOUND_NOTIFY_APPROVAL_WARN_S before they
    expire: `approval_expiring`, once per action and expiry. Returns how many."""
    now = now or timezone.now()
    warn = settings.REBOUND_NOTIFY_APPROVAL_WARN_S
    # An announcement older than the warning's longest lead is past its action's expiry:
    # nothing can announce that expiry again, so its row only takes room.
    Announcement.objects.filter(
        key__startswith="approval_expiring:", at__lt=now - timedelta(seconds=warn + 86400)
    ).delete()
    count = 0
    for action in selectors.approvals_expiring(now=now, within_s=warn):
        key = f"approval_expiring:{action.pk}:{action.expires_at.timestamp():.0f}"
        try:
            with transaction.atomic():
                Announcement.objects.create(key=key, at=now)
                left = (action.expires_at - now).total_seconds()
                event_record(
                    event=Event.APPROVAL_EXPIRING,
                    cluster_id=action.cluster_id,
                    action=action,
                    detail={"why": f"expires in {left / 60:.0f} min"},
                    now=now,
                )
        except IntegrityError:
            continue  # announced already
        count += 1
    return count


def notifications_resend(*, now=None, limit: int = 500) -> int:
    """Pending notifications well past their due time (their message or their worker
    was lost): sent again. Returns how many."""
    now = now or timezone.now()
    late = list(
        Notification.objects.filter(
            state=P.PENDING, next_attempt_at__lt=now - timedelta(seconds=RESEND_AFTER_S)
        )
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    with transaction.atomic():
        for pk in late:
            _deliver_later(pk, 0)
    return len(late)


# --- delivery ----------------------------------------------------------------------


@dataclass
class Delivery:
    """What one run of the delivery did: `skipped` (not pending, not due, claimed by
    another), `waiting` (the channel's rate limit: tried again at the next slot),
    `sent`, `retry` (failed, tried again after `retry_in`), `failed` (for good)."""

    outcome: str
    attempt: DeliveryAttempt | None = None
    retry_in: float | None = None


def notification_deliver(
    *, notification_id: int, now=None, rate_limited: bool = True, max_attempts: int = MAX_ATTEMPTS
) -> Delivery:
    """Deliver a due notification once: claim it, send it through its channel, record
    the attempt (and its timeline entries), and schedule the retry or give up."""
    now = now or timezone.now()
    n = Notification.objects.select_related("channel", "cluster").filter(pk=notification_id)
    n = n.first()
    if n is None or n.state != P.PENDING or n.next_attempt_at > now + timedelta(seconds=EARLY_S):
        return Delivery("skipped")
    channel = n.channel
    with transaction.atomic():
        # One delivery at a time per channel decides on its rate-limit slots.
        Channel.objects.select_for_update().filter(pk=channel.pk).first()
        if rate_limited:
            wait = _slot_wait_s(channel, now)
            if wait > 0:
                Notification.objects.filter(pk=n.pk, state=P.PENDING, attempts=n.attempts).update(
                    next_attempt_at=now + timedelta(seconds=wait), open_group=False
                )
                _deliver_later(n.pk, wait)
                return Delivery("waiting", retry_in=wait)
        claimed = Notification.objects.filter(
            pk=n.pk,
            state=P.PENDING,
            attempts=n.attempts,
            next_attempt_at__lte=now + timedelta(seconds=EARLY_S),
        ).update(
            attempts=F("attempts") + 1,
            open_group=False,
            next_attempt_at=now + timedelta(seconds=CLAIM_S),
        )
        if not claimed:
            return Delivery("skipped")
        attempt = DeliveryAttempt.objects.create(
            notification=n, channel=channel, number=n.attempts + 1, at=now
        )
    n.refresh_from_db()
    started = time.monotonic()
    if channel.enabled:
        sent = _send(channel, messages.message_build(n))
    else:
        sent = transport.Sent.from_error("the channel is disabled", permanent=True)
    duration = time.monotonic() - started
    return _attempt_end(n, attempt, sent, duration, max_attempts)


def _slot_wait_s(channel: Channel, now) -> float:
    """Seconds until the channel has a free slot in its last minute (0: now)."""
    limit = channel.rate_limit_per_minute
    if limit <= 0:
        return 0.0
    recent = list(
        DeliveryAttempt.objects.filter(
            channel=channel, at__gt=now - timedelta(seconds=RATE_WINDOW_S)
        )
        .order_by("at")
        .values_list("at", flat=True)
    )
    if len(recent) < limit:
        return 0.0
    frees = recent[len(recent) - limit] + timedelta(seconds=RATE_WINDOW_S)
    return max(0.05, (frees - now).total_seconds())


def _send(channel: Channel, m: messages.Message) -> transport.Sent:
    kind = channel.kind
    if kind == Channel.Kind.WEBHOOK:
        return transport.post_json(
            channel.url, messages.webhook_body(m), secret=channel.secret, event=m.event
        )
    if kind == Channel.Kind.SLACK:
        return transport.post_json(channel.url, messages.slack_body(m))
    if kind == Channel.Kind.PAGERDUTY:
        url = channel.url or messages.PAGERDUTY_EVENTS_URL
        sent = transport.Sent(True)
        for event in messages.pagerduty_events(m, channel.secret):
            sent = transport.post_json(url, event)
            if not sent.ok:
                break  # the whole message again next time: PagerDuty dedups by key
        return sent
    subject, body = messages.email_message(m)
    return transport.send_email(subject, body, list(channel.emails))


def _attempt_end(n, attempt, sent, duration, max_attempts) -> Delivery:
    now = timezone.now()
    number = attempt.number
    attempt.outcome = DeliveryAttempt.Outcome.SENT if sent.ok else DeliveryAttempt.Outcome.ERROR
    attempt.http_status, attempt.error, attempt.duration_s = sent.http_status, sent.error, duration
    retry_in = None
    if sent.ok:
        fields, outcome = {"state": P.SENT, "sent_at": now, "last_error": ""}, "sent"
    elif sent.permanent or number >= max_attempts:
        fields, outcome = {"state": P.FAILED, "last_error": sent.error}, "failed"
    else:
        retry_in = backoff_s(number)
        next_at = now + timedelta(seconds=retry_in)
        fields, outcome = {"next_attempt_at": next_at, "last_error": sent.error}, "retry"
    with transaction.atomic():
        attempt.save(update_fields=["outcome", "http_status", "error", "duration_s"])
        Notification.objects.filter(pk=n.pk, state=P.PENDING, attempts=number).update(**fields)
        if retry_in is not None:
            _deliver_later(n.pk, retry_in)
        _timeline_add(n, attempt, outcome, retry_in, max_attempts)
    if not sent.ok:
        logger.warning(
            "notification #%s via %s: attempt %s %s: %s",
            n.pk,
            n.channel.name,
            number,
            outcome,
            sent.error,
        )
    return Delivery(outcome, attempt, retry_in)


def _timeline_add(n, attempt, outcome, retry_in, max_attempts) -> None:
    """The attempt on the timeline of every incident the message is about."""
    ids = sorted(set(n.incidents.values_list("pk", flat=True)))
    if not ids:
        return
    channel = n.channel
    status = f"HTTP {attempt.http_status}" if attempt.http_status else ""
    if outcome == "sent":
        what = "sent" + (f" ({status})" if status else "")
    elif outcome == "retry":
        what = (
            f"attempt {attempt.number} of {max_attempts} failed: {attempt.error};"
            f" next in {retry_in:g} s"
        )
    else:
        what = f"failed after {attempt.number} attempt(s): {attempt.error}"
    text = f"notification #{n.pk} {n.event} to {channel.name} ({channel.kind}): {what}"
    data = {
        "notification": n.pk,
        "channel": channel.pk,
        "event": n.event,
        "attempt": attempt.number,
        "outcome": outcome,
        "http_status": attempt.http_status,
        "error": attempt.error,
        "duration_s": round(attempt.duration_s or 0.0, 3),
    }
    for incident_id in ids:
        timeline_entry_add(
            incident_id=incident_id,
            kind=TimelineEntry.Kind.NOTIFICATION,
            at=attempt.at,
            actor=f"notify:{channel.name}"[:150],
            source="notify",
            message=text,
            data=data,
        )


def channel_test_send(*, channel: Channel) -> Delivery:
    """ "Send test": a test message through the channel now, by the real path (message,
    transport, attempt record), once, outside the rate limit."""
    with transaction.atomic():
        n = Notification.objects.create(
            channel=channel,
            event=Event.TEST,
            subjects=[],
            open_group=False,
            next_attempt_at=timezone.now(),
            detail={"why": f"a test of channel {channel.name}"},
        )
    return notification_deliver(notification_id=n.pk, rate_limited=False, max_attempts=1)
