"""Delivery through each channel kind to a local receiver: the generic webhook's
payload and its HMAC signature, Slack's incoming-webhook body, PagerDuty's Events API
v2 trigger and resolve (one dedup key per incident), e-mail (Django's locmem
backend); failures, retries and the per-channel rate limit; every attempt on the
incident's timeline."""

import hashlib
import hmac
import json
import time
from decimal import Decimal

import pytest
from django.core import mail

from incidents import services as incident_services
from incidents.models import Incident, TimelineEntry
from incidents.signals import incident_opened
from notify import services
from notify.models import DeliveryAttempt, Notification
from tests.notify.conftest import ROUTING_KEY, SECRET, make_channel, make_incident, make_rule

pytestmark = pytest.mark.django_db

PUBLIC = "https://rebound.example.com"


@pytest.fixture(autouse=True)
def public_url(settings):
    settings.REBOUND_PUBLIC_URL = PUBLIC
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def verify(secret: str, request: dict, tolerance_s: float = 300) -> bool:
    """How a receiver checks a Rebound webhook (docs/notifications.md)."""
    timestamp = request["headers"]["X-Rebound-Timestamp"]
    given = request["headers"]["X-Rebound-Signature"]
    expected = hmac.new(
        secret.encode(), timestamp.encode() + b"." + request["body"], hashlib.sha256
    ).hexdigest()
    fresh = abs(time.time() - int(timestamp)) <= tolerance_s
    return fresh and hmac.compare_digest(given, "sha256=" + expected)


def open_and_deliver(job, **incident_fields):
    """An incident opens (the incidents app's signal); its notifications are delivered."""
    incident = make_incident(job, **incident_fields)
    incident_opened.send(sender=Incident, incident=incident)
    results = [
        services.notification_deliver(notification_id=n.pk)
        for n in Notification.objects.filter(incident=incident).order_by("id")
    ]
    return incident, results


def test_the_webhook_payload_is_signed_with_the_channel_secret(receiver, job):
    make_rule(make_channel("webhook", receiver.url), group_window_s=0)
    incident, [result] = open_and_deliver(job)
    assert result.outcome == "sent"
    [request] = receiver.requests
    assert verify(SECRET, request)
    assert not verify("another-key", request)
    assert request["headers"]["X-Rebound-Event"] == "incident_opened"
    body = json.loads(request["body"])
    assert body["version"] == 1
    assert body["event"] == "incident_opened"
    assert body["cluster"] == "east"
    assert body["sent_at"].endswith("Z")
    assert body["count"] == 1
    [item] = body["items"]
    assert item["type"] == "incident"
    assert item["id"] == incident.pk
    assert item["url"] == f"{PUBLIC}/incidents/{incident.pk}/"
    assert item["lost_gpu_hours"] == 2.0
    assert (item["lost_cost"], item["currency"]) == (None, None)  # the cluster has no price
    assert (item["cause"], item["severity"], item["job"]) == ("gpu", "critical", "llm")
    n = Notification.objects.get(incident=incident)
    assert (n.state, n.attempts, n.sent_at is not None) == ("sent", 1, True)
    [attempt] = n.delivery_attempts.all()
    assert (attempt.outcome, attempt.http_status) == ("sent", 200)
    assert attempt.duration_s >= 0
    [entry] = incident.timeline.filter(kind=TimelineEntry.Kind.NOTIFICATION)
    assert "sent (HTTP 200)" in entry.message
    assert entry.data["outcome"] == "sent"


def test_messages_show_the_lost_compute_in_money_where_it_has_a_price(receiver, job):
    job.cluster.gpu_hour_price, job.cluster.currency = Decimal("3.20"), "EUR"
    job.cluster.save()
    make_rule(make_channel("webhook", receiver.url), group_window_s=0)
    make_rule(make_channel("slack", receiver.url), group_window_s=0)
    open_and_deliver(job)
    bodies = [json.loads(r["body"]) for r in receiver.requests]
    [webhook] = [b for b in bodies if "items" in b]
    [slack] = [b for b in bodies if "blocks" in b]
    [item] = webhook["items"]
    assert (item["lost_gpu_hours"], item["lost_cost"], item["currency"]) == (2.0, 6.4, "EUR")
    assert "2 GPU-h = 6.40 EUR lost" in json.dumps(slack)


def test_a_second_delivery_of_the_same_message_sends_nothing(receiver, job):
    make_rule(make_channel("webhook", receiver.url), group_window_s=0)
    incident, [first] = open_and_deliver(job)
    n = Notification.objects.get(incident=incident)
    again = services.notification_deliver(notification_id=n.pk)
    assert (first.outcome, again.outcome) == ("sent", "skipped")
    assert len(receiver.requests) == 1


def test_slack_gets_its_incoming_webhook_format_with_the_link(receiver, job):
    make_rule(make_channel("slack", receiver.url), group_window_s=0)
    incident, [result] = open_and_deliver(job, summary="Xid 79 on n01")
    assert result.outcome == "sent"
    [body] = receiver.bodies()
    link = f"{PUBLIC}/incidents/{incident.pk}/"
    assert set(body) == {"text", "blocks"}
    assert "Xid 79 on n01" in body["text"] and f"<{link}|" in body["text"]
    assert body["blocks"][0]["type"] == "section"
    assert body["blocks"][0]["text"]["type"] == "mrkdwn"
    assert any(link in b.get("text", {}).get("text", "") for b in body["blocks"])
    assert "X-Rebound-Signature" not in receiver.requests[0]["headers"]


def test_pagerduty_triggers_on_open_and_resolves_the_same_dedup_key(
    receiver, job, django_capture_on_commit_callbacks
):
    make_rule(make_channel("pagerduty", receiver.url), group_window_s=0)
    incident, [result] = open_and_deliver(job)
    assert result.outcome == "sent"
    with django_capture_on_commit_callbacks(execute=True):
        incident_services.incident_resolve(incident=incident, actor="operator", note="fixed")
    # Committed, the resolve's delivery task ran (eager here) through the outbox.
    resolved = Notification.objects.get(incident=incident, event="incident_resolved")
    assert (resolved.state, resolved.attempts) == ("sent", 1)
    trigger, resolve = receiver.bodies()
    key = f"rebound-incident-{incident.pk}"
    assert trigger["routing_key"] == ROUTING_KEY
    assert (trigger["event_action"], trigger["dedup_key"]) == ("trigger", key)
    payload = trigger["payload"]
    assert set(payload) == {
        "summary",
        "source",
        "severity",
        "timestamp",
        "component",
        "group",
        "class",
        "custom_details",
    }
    assert (payload["severity"], payload["source"], payload["group"]) == (
        "critical",
        "east",
        "east",
    )
    assert (payload["component"], payload["class"]) == ("llm", "gpu")
    assert payload["custom_details"]["items"][0]["lost_gpu_hours"] == 2.0
    assert trigger["links"][0]["href"] == f"{PUBLIC}/incidents/{incident.pk}/"
    assert resolve == {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": key}


def test_e_mail_goes_through_django_mail_with_the_link(job):
    make_rule(make_channel("email"), group_window_s=0)
    incident, [result] = open_and_deliver(job, summary="Xid 79 on n01")
    assert result.outcome == "sent"
    [message] = mail.outbox
    assert message.to == ["sre@example.com", "oncall@example.com"]
    assert message.subject.startswith("[Rebound] Incident opened on east: #")
    assert "Xid 79 on n01" in message.subject
    assert f"{PUBLIC}/incidents/{incident.pk}/" in message.body


def test_a_failed_attempt_waits_its_backoff_and_shows_on_the_timeline(receiver, job):
    receiver.statuses = [500, 200]
    make_rule(make_channel("webhook", receiver.url), group_window_s=0)
    incident, [first] = open_and_deliver(job)
    assert (first.outcome, first.retry_in) == ("retry", services.backoff_s(1))
    n = Notification.objects.get(incident=incident)
    assert (n.state, n.attempts) == ("pending", 1)
    assert n.last_error.startswith("HTTP 500")
    # Not due yet: a message arriving early sends nothing.
    assert services.notification_deliver(notification_id=n.pk).outcome == "skipped"
    later = n.next_attempt_at
    assert services.notification_deliver(notification_id=n.pk, now=later).outcome == "sent"
    n.refresh_from_db()
    assert (n.state, n.attempts, n.last_error) == ("sent", 2, "")
    outcomes = list(n.delivery_attempts.values_list("number", "outcome", "http_status"))
    assert outcomes == [(1, "error", 500), (2, "sent", 200)]
    entries = [e.message for e in incident.timeline.filter(kind="notification")]
    assert "attempt 1 of 6 failed: HTTP 500" in entries[0]
    assert "sent (HTTP 200)" in entries[1]


def test_a_refusal_that_retrying_cannot_fix_fails_at_once(receiver, job):
    receiver.statuses = [404]
    make_rule(make_channel("webhook", receiver.url), group_window_s=0)
    incident, [result] = open_and_deliver(job)
    assert result.outcome == "failed"
    n = Notification.objects.get(incident=incident)
    assert (n.state, n.attempts) == ("failed", 1)
    [entry] = incident.timeline.filter(kind="notification")
    assert "failed after 1 attempt(s): HTTP 404" in entry.message


def test_an_unreachable_endpoint_is_an_error_not_a_crash(job):
    from tests.processes import free_port

    make_rule(make_channel("webhook", f"http://127.0.0.1:{free_port()}/"), group_window_s=0)
    _, [result] = open_and_deliver(job)
    assert result.outcome == "retry"
    assert "Connection refused" in result.attempt.error or "Errno" in result.attempt.error


def test_over_the_rate_limit_a_delivery_waits_for_the_next_slot(receiver, job):
    channel = make_channel("webhook", receiver.url, rate_limit_per_minute=2)
    make_rule(channel, group_window_s=0)
    results = [open_and_deliver(job)[1][0] for _ in range(3)]
    assert [r.outcome for r in results] == ["sent", "sent", "waiting"]
    assert 55 < results[2].retry_in <= 60
    assert len(receiver.requests) == 2
    waiting = Notification.objects.get(state="pending")
    assert waiting.attempts == 0  # not dropped, not counted as a failure
    assert DeliveryAttempt.objects.filter(channel=channel).count() == 2
    # Its slot comes: it goes.
    later = waiting.next_attempt_at
    assert services.notification_deliver(notification_id=waiting.pk, now=later).outcome == "sent"
    assert len(receiver.requests) == 3


def test_a_disabled_channel_gets_nothing(receiver, job):
    make_rule(make_channel("webhook", receiver.url, enabled=False), group_window_s=0)
    _, results = open_and_deliver(job)
    assert results == [] and receiver.requests == []
