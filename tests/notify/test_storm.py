"""A storm: 50 node faults within one minute on one cluster, through the real ingest
and detection, make ONE grouped notification per rule, not 50; delivered, each
rule's channel gets one message listing all 50 incidents."""

import pytest

from incidents import services as incident_services
from incidents.models import Incident
from jobs.models import TrainingJob
from notify import services
from notify.models import Notification
from tests.notify.conftest import make_channel, make_rule

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
FAULTS = 50


def storm_events() -> list[dict]:
    """50 jobs, one node each, each hit by a GPU fault (Xid 79) within one minute."""
    events = []
    for i in range(FAULTS):
        job, node, t = f"job{i:02d}", f"g{i:02d}", T0 + i
        events += [
            {"id": f"{job}-start", "job": job, "kind": "attempt_started", "ts": t, "attempt": 1,
             "data": {"world_size": 8, "gpus_per_node": 8, "nodes": [node]}},
            {"id": f"{job}-ready", "job": job, "kind": "ready", "ts": t + 1, "attempt": 1},
            {"id": f"{job}-step", "job": job, "kind": "step", "ts": t + 2, "attempt": 1,
             "data": {"step": 1}},
            {"id": f"{job}-xid", "job": job, "kind": "fault", "ts": t + 3, "attempt": 1,
             "node": node, "rank": 0, "data": {"type": "gpu_xid", "xid": 79}},
            {"id": f"{job}-end", "job": job, "kind": "attempt_ended", "ts": t + 4, "attempt": 1,
             "data": {"reason": "failed", "exit_code": 1}},
        ]  # fmt: skip
    return events


def test_fifty_faults_in_a_minute_make_one_message_per_rule(
    ingest, receiver, settings, django_capture_on_commit_callbacks
):
    settings.REBOUND_PUBLIC_URL = "https://rebound.example.com"
    make_rule(make_channel("webhook", receiver.url, name="hook"), name="everything")
    make_rule(make_channel("slack", receiver.url, name="chat"), name="gpu", causes=["gpu"])
    assert ingest(storm_events()).status_code == 202
    with django_capture_on_commit_callbacks(execute=True):
        for job in TrainingJob.objects.order_by("key"):
            incident_services.incidents_detect(job=job)
    incidents = list(Incident.objects.order_by("id"))
    assert len(incidents) == FAULTS
    assert {i.cause for i in incidents} == {"gpu"}

    opened = list(Notification.objects.filter(event="incident_opened").order_by("rule__name"))
    assert [n.rule.name for n in opened] == ["everything", "gpu"]
    for n in opened:
        assert n.subjects == [{"incident": i.pk} for i in incidents]
        assert n.incidents.count() == FAULTS

    for n in opened:
        result = services.notification_deliver(notification_id=n.pk, now=n.next_attempt_at)
        assert result.outcome == "sent"
    hook, chat = receiver.bodies()  # in rule order: "everything" (webhook), then "gpu"
    assert hook["count"] == FAULTS and len(hook["items"]) == FAULTS
    assert hook["title"] == f"{FAULTS} incidents opened on east"
    assert chat["text"].startswith(f"{FAULTS} incidents opened on east")
    assert "and 40 more" in chat["blocks"][-1]["elements"][0]["text"]
    # Each incident's timeline shows the two messages it went out in.
    for incident in incidents:
        assert incident.timeline.filter(kind="notification").count() == 2
