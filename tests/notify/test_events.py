"""Which events become notifications, for which rules: the filters (cluster, severity,
cause, event), and the events of actions (waiting for approval, about to expire,
failed) and of the storm guardrail (once per cluster and trip)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from incidents.models import Incident
from incidents.signals import incident_opened
from jobs.models import Node
from notify import services
from notify.models import Announcement, Notification
from recovery import services as recovery_services
from recovery.models import Action
from recovery.services.actions import action_transition
from tests.factories import ActionFactory, ClusterFactory, NodeFactory
from tests.notify.conftest import make_channel, make_incident, make_rule
from tests.recovery.conftest import make_incident as make_recovery_incident
from tests.recovery.conftest import make_job

pytestmark = pytest.mark.django_db

S = Action.State


def opened(incident) -> set[str]:
    """The rules whose notifications an incident's opening made."""
    incident_opened.send(sender=Incident, incident=incident)
    return set(Notification.objects.filter(incidents=incident).values_list("rule__name", flat=True))


def test_rules_filter_by_cluster_severity_cause_and_event(job):
    ClusterFactory(name="west")
    channel = make_channel("webhook", "http://127.0.0.1:9/")
    make_rule(channel, name="all")
    make_rule(channel, name="east", clusters=["east"])
    make_rule(channel, name="west", clusters=["west"])
    make_rule(channel, name="critical", severities=["critical"])
    make_rule(channel, name="gpu", causes=["gpu"])
    make_rule(channel, name="resolved-only", events=["incident_resolved"])
    make_rule(channel, name="opened-only", events=["incident_opened"])
    make_rule(channel, name="off", enabled=False)
    gpu = make_incident(job, cause="gpu", severity="critical")
    assert opened(gpu) == {"all", "east", "critical", "gpu", "opened-only"}
    minor = make_incident(job, cause="software", severity="minor", fault_type="crash")
    assert opened(minor) == {"all", "east", "opened-only"}


def test_planned_incidents_page_only_the_rules_that_name_planned(job):
    """Scheduled maintenance wakes no one: an empty cause filter lets everything through
    but `planned`; a rule naming `planned` gets it."""
    channel = make_channel("webhook", "http://127.0.0.1:9/")
    make_rule(channel, name="all")
    make_rule(channel, name="critical", severities=["critical"])
    make_rule(channel, name="maintenance", causes=["planned"])
    make_rule(channel, name="gpu-and-planned", causes=["gpu", "planned"])
    planned = make_incident(job, cause="planned", severity="critical")
    assert opened(planned) == {"maintenance", "gpu-and-planned"}
    gpu = make_incident(job, cause="gpu", severity="critical")
    assert opened(gpu) == {"all", "critical", "gpu-and-planned"}


def test_a_disabled_channel_s_rules_make_nothing(job):
    make_rule(make_channel("webhook", "http://127.0.0.1:9/", enabled=False))
    assert opened(make_incident(job)) == set()


def test_events_within_the_window_join_one_message_per_rule(job):
    channel = make_channel("webhook", "http://127.0.0.1:9/")
    make_rule(channel, name="a", group_window_s=60)
    make_rule(channel, name="b", group_window_s=60, severities=["critical"])
    incidents = [make_incident(job) for _ in range(3)]
    for incident in incidents:
        incident_opened.send(sender=Incident, incident=incident)
    groups = list(Notification.objects.order_by("rule__name"))
    assert [n.rule.name for n in groups] == ["a", "b"]
    for n in groups:
        assert n.subjects == [{"incident": i.pk} for i in incidents]
        assert set(n.incidents.all()) == set(incidents)
    # Once claimed (sent or not), the next event opens a new message.
    services.notification_deliver(notification_id=groups[0].pk, now=groups[0].next_attempt_at)
    incident_opened.send(sender=Incident, incident=make_incident(job))
    assert Notification.objects.filter(rule__name="a").count() == 2
    assert Notification.objects.filter(rule__name="b").count() == 1


def test_an_action_awaiting_approval_and_a_failed_one_are_announced(
    job, personas, django_capture_on_commit_callbacks
):
    make_rule(
        make_channel("webhook", "http://127.0.0.1:9/"),
        events=["approval_waiting", "action_failed"],
    )
    incident = make_incident(job)
    with django_capture_on_commit_callbacks(execute=True):
        action = recovery_services.action_propose(
            cluster=job.cluster,
            kind="restart_job",
            job=job,
            incident=incident,
            reason="try again",
            requested_by="operator",
        )
    assert action.state == S.AWAITING_APPROVAL
    waiting = Notification.objects.get(event="approval_waiting")
    assert waiting.subjects == [{"action": action.pk}]
    assert (waiting.action_id, list(waiting.incidents.all())) == (action.pk, [incident])

    running = ActionFactory(kind="restart_job", job=job, cluster=job.cluster, state=S.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        action_transition(action=running, to=S.FAILED, actor="rebound:worker", why="boom")
    failed = Notification.objects.get(event="action_failed")
    assert failed.subjects == [{"action": running.pk}]
    assert failed.detail == {"why": "boom"}


def test_an_approval_about_to_expire_is_announced_once(job):
    make_rule(make_channel("webhook", "http://127.0.0.1:9/"), events=["approval_expiring"])
    now = timezone.now()
    soon = ActionFactory(
        kind="restart_job",
        job=job,
        cluster=job.cluster,
        state=S.AWAITING_APPROVAL,
        expires_at=now + timedelta(minutes=5),
    )
    node = NodeFactory(cluster=job.cluster, name="late")
    ActionFactory(  # 20 minutes left: not yet
        node=node,
        cluster=job.cluster,
        state=S.AWAITING_APPROVAL,
        expires_at=now + timedelta(minutes=20),
    )
    assert services.approvals_expiring_record(now=now) == 1
    assert services.approvals_expiring_record(now=now + timedelta(seconds=60)) == 0
    [n] = Notification.objects.filter(event="approval_expiring")
    assert n.subjects == [{"action": soon.pk}]
    assert n.detail == {"why": "expires in 5 min"}
    # Its announcement stays while it could matter, then goes (the storm's mark stays).
    Announcement.objects.create(key="storm_tripped:1", at=now)
    assert services.approvals_expiring_record(now=now + timedelta(hours=12)) == 0
    assert Announcement.objects.count() == 2
    assert services.approvals_expiring_record(now=now + timedelta(days=2)) == 0
    assert list(Announcement.objects.values_list("key", flat=True)) == ["storm_tripped:1"]


@pytest.fixture
def big(job):
    """20 active nodes and 2 spares on `east`: 10% of them allows 2 automatic isolations."""
    cluster = job.cluster
    nodes = {f"g{i:02d}": NodeFactory(cluster=cluster, name=f"g{i:02d}") for i in range(20)}
    for name in ("s1", "s2"):
        nodes[name] = NodeFactory(cluster=cluster, name=name, state=Node.State.SPARE)
    return nodes


def test_a_storm_trip_is_announced_once_per_cluster_and_trip(
    job, big, django_capture_on_commit_callbacks
):
    """Six GPU faults at once: the storm guardrail holds four automatic cordons (as in
    tests/recovery/test_storm.py); one storm message lists them, and one grouped
    approval message per rule."""
    channel = make_channel("webhook", "http://127.0.0.1:9/")
    make_rule(channel, name="storms", events=["storm_tripped"])
    make_rule(channel, name="approvals", events=["approval_waiting"])
    incidents = []
    for i in range(6):
        name = f"g{i:02d}"
        j = make_job(job.cluster, big, key=f"job{i}", on=(name,), world_size=8)
        incidents.append(
            make_recovery_incident(
                j, cause="gpu", fault_type="gpu_xid", xid=79, nodes=[big[name]], attempt=1
            )
        )
    with django_capture_on_commit_callbacks(execute=True):
        for incident in incidents:
            incident_opened.send(sender=Incident, incident=incident)
    held = list(Action.objects.filter(blocked_by="storm").order_by("id"))
    assert len(held) == 4
    [storm] = Notification.objects.filter(event="storm_tripped")
    assert storm.subjects == [{"action": a.pk} for a in held]
    assert storm.detail["why"].startswith("storm: ")
    [waiting] = Notification.objects.filter(event="approval_waiting")
    assert waiting.subjects == [{"action": a.pk} for a in held]

    # The same trip, after its message went: nothing new. A later trip: a new message.
    services.notification_deliver(notification_id=storm.pk, now=storm.next_attempt_at)
    services.storm_trip_record(action=held[0])
    assert Notification.objects.filter(event="storm_tripped").count() == 1
    Announcement.objects.update(at=timezone.now() - timedelta(hours=1))
    services.storm_trip_record(action=held[1])
    assert Notification.objects.filter(event="storm_tripped").count() == 2


def test_delivery_is_handed_over_durably_and_lost_messages_are_sent_again(job):
    """The delivery's outbox row is written with the notification (it survives a broker
    outage); a pending row long past due (its message lost) is sent again."""
    from common.models import OutboxEntry

    make_rule(make_channel("webhook", "http://127.0.0.1:9/"), group_window_s=60)
    incident_opened.send(sender=Incident, incident=make_incident(job))
    n = Notification.objects.get()
    entry = OutboxEntry.objects.get(task="notify.deliver", key=str(n.pk))
    assert entry.args == [n.pk]
    assert abs((entry.due_at - n.next_attempt_at).total_seconds()) < 1
    OutboxEntry.objects.all().delete()  # the task started and died with its worker
    assert services.notifications_resend(now=n.next_attempt_at) == 0  # not late yet
    late = n.next_attempt_at + timedelta(seconds=services.RESEND_AFTER_S + 1)
    assert services.notifications_resend(now=late) == 1
    assert OutboxEntry.objects.filter(task="notify.deliver", key=str(n.pk)).exists()


def test_a_rolled_back_change_notifies_nobody(job, django_capture_on_commit_callbacks):
    from django.db import transaction

    from incidents import services as incident_services

    make_rule(make_channel("webhook", "http://127.0.0.1:9/"))
    incident = make_incident(job)
    action = ActionFactory(kind="restart_job", job=job, cluster=job.cluster, state=S.RUNNING)
    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        incident_services.incident_resolve(incident=incident, actor="operator")
        action_transition(action=action, to=S.FAILED, actor="rebound:worker", why="boom")
        assert not Notification.objects.exists()  # nothing is announced before the commit
        raise RuntimeError("rolled back")
    assert not Notification.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        incident_services.incident_resolve(incident=incident, actor="operator")
    assert list(Notification.objects.values_list("event", flat=True)) == ["incident_resolved"]
