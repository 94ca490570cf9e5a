"""The notify API: channels and rules (viewers read, admins change), secrets never
returned, the test send through the real path, the notifications list by incident;
each endpoint allowed and forbidden."""

import json

import pytest

from incidents.models import Incident
from incidents.signals import incident_opened
from notify.models import Channel, Notification, Rule
from tests.notify.conftest import SECRET, make_channel, make_incident, make_rule

pytestmark = pytest.mark.django_db

CHANNELS = "/api/v1/notify/channels"
RULES = "/api/v1/notify/rules"
NOTIFICATIONS = "/api/v1/notify/notifications"


def post(persona, url, body=None):
    return persona.client().post(url, json.dumps(body or {}), content_type="application/json")


def put(persona, url, body):
    return persona.client().put(url, json.dumps(body), content_type="application/json")


def webhook(url="https://hooks.example.com/rebound", **fields):
    return {"name": "ops-hook", "kind": "webhook", "url": url, "secret": SECRET, **fields}


def test_an_admin_creates_reads_replaces_and_deletes_a_channel(personas):
    admin = personas["admin"]
    r = post(admin, CHANNELS, webhook())
    assert r.status_code == 201, r.content
    created = r.json()
    assert "secret" not in created and created["has_secret"] is True
    assert Channel.objects.get(pk=created["id"]).secret == SECRET
    url = f"{CHANNELS}/{created['id']}"

    r = put(admin, url, {"name": "ops-hook", "kind": "webhook", "url": "https://h.example.com/x"})
    assert r.status_code == 200, r.content
    assert r.json()["url"] == "https://h.example.com/x"
    # A secret left out of a replacement is kept; it is never shown.
    assert Channel.objects.get(pk=created["id"]).secret == SECRET
    for body in (admin.client().get(url).json(), admin.client().get(CHANNELS).json()):
        assert SECRET not in json.dumps(body)

    assert admin.client().delete(url).status_code == 204
    assert not Channel.objects.filter(pk=created["id"]).exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "x", "kind": "webhook"}, "url"),
        ({"name": "x", "kind": "slack", "url": "ftp://example.com/"}, "url"),
        ({"name": "x", "kind": "pagerduty"}, "secret"),
        ({"name": "x", "kind": "email", "emails": []}, "emails"),
        ({"name": "x", "kind": "email", "emails": ["not an address"]}, "emails"),
        ({"name": "x", "kind": "sms"}, "kind"),
        (webhook(rate_limit_per_minute=-1), "rate_limit_per_minute"),
    ],
)
def test_a_channel_that_cannot_work_is_refused_naming_the_field(personas, body, field):
    r = post(personas["admin"], CHANNELS, body)
    assert r.status_code == 400
    assert field in r.json()["fields"]


def test_a_pagerduty_channel_defaults_to_the_events_api(personas):
    r = post(personas["admin"], CHANNELS, {"name": "pd", "kind": "pagerduty", "secret": "k" * 32})
    assert r.status_code == 201, r.content
    assert r.json()["url"] == ""  # the default, https://events.pagerduty.com/v2/enqueue


def test_viewers_read_and_only_admins_change(personas):
    channel = make_channel("webhook", "https://hooks.example.com/")
    rule = make_rule(channel)
    for name in ("viewer", "operator", "admin"):
        client = personas[name].client()
        urls = (CHANNELS, f"{CHANNELS}/{channel.pk}", RULES, f"{RULES}/{rule.pk}", NOTIFICATIONS)
        for url in urls:
            assert client.get(url).status_code == 200, (name, url)
    for name in ("viewer", "operator"):
        persona = personas[name]
        assert post(persona, CHANNELS, webhook(name="new")).status_code == 403
        assert put(persona, f"{CHANNELS}/{channel.pk}", webhook()).status_code == 403
        assert persona.client().delete(f"{CHANNELS}/{channel.pk}").status_code == 403
        assert post(persona, f"{CHANNELS}/{channel.pk}/test").status_code == 403
        body = {"name": "r2", "channel": channel.pk}
        assert post(persona, RULES, body).status_code == 403
        assert persona.client().delete(f"{RULES}/{rule.pk}").status_code == 403
    outsider = personas["outsider"].client()
    assert outsider.get(CHANNELS).status_code == 403
    assert post(personas["ingest"], RULES, {"name": "r3", "channel": channel.pk}).status_code == 403
    from rest_framework.test import APIClient

    assert APIClient().get(RULES).status_code in (401, 403)
    assert Channel.objects.count() == 1 and Rule.objects.count() == 1


def test_an_admin_manages_rules_and_bad_filters_are_named(personas, cluster):
    admin = personas["admin"]
    channel = make_channel("webhook", "https://hooks.example.com/")
    body = {
        "name": "gpu-pages",
        "channel": channel.pk,
        "clusters": ["east"],
        "severities": ["critical"],
        "causes": ["gpu", "memory"],
        "events": ["incident_opened", "incident_resolved"],
        "group_window_s": 120,
    }
    r = post(admin, RULES, body)
    assert r.status_code == 201, r.content
    rule = r.json()
    assert {k: rule[k] for k in body} == body
    r = put(admin, f"{RULES}/{rule['id']}", {**body, "enabled": False, "events": []})
    assert r.status_code == 200 and r.json()["enabled"] is False and r.json()["events"] == []
    for bad, field in [
        ({"clusters": ["nowhere"]}, "clusters"),
        ({"events": ["test"]}, "events"),
        ({"causes": ["cosmic_rays"]}, "causes"),
        ({"severities": ["urgent"]}, "severities"),
        ({"group_window_s": 10**9}, "group_window_s"),
        ({"channel": 10**6}, "channel"),
    ]:
        r = post(admin, RULES, {**body, "name": "other", **bad})
        assert r.status_code == 400, bad
        assert field in r.json()["fields"], r.json()
    assert admin.client().delete(f"{RULES}/{rule['id']}").status_code == 204


def test_send_test_answers_the_attempt_s_outcome(personas, receiver):
    admin = personas["admin"]
    channel = make_channel("webhook", receiver.url)
    r = post(admin, f"{CHANNELS}/{channel.pk}/test")
    assert r.status_code == 200, r.content
    answer = r.json()
    assert answer["outcome"] == "sent"
    assert answer["attempt"]["http_status"] == 200
    [body] = receiver.bodies()
    assert body["event"] == "test" and body["items"] == []
    receiver.statuses = [500]
    answer = post(admin, f"{CHANNELS}/{channel.pk}/test").json()
    assert answer["outcome"] == "failed"
    assert answer["attempt"]["error"].startswith("HTTP 500")
    # A test is tried once: no retry is scheduled.
    assert Notification.objects.get(pk=answer["notification"]).state == "failed"
    assert post(admin, f"{CHANNELS}/999999/test").status_code == 404


def test_notifications_are_listed_by_incident(personas, job):
    make_rule(make_channel("webhook", "http://127.0.0.1:9/"))
    first, second, other = (make_incident(job) for _ in range(3))
    for incident in (first, second):
        incident_opened.send(sender=Incident, incident=incident)
    viewer = personas["viewer"].client()
    [n] = viewer.get(NOTIFICATIONS, {"incident": second.pk}).json()["results"]
    assert n["subjects"] == [{"incident": first.pk}, {"incident": second.pk}]
    assert (n["event"], n["state"], n["cluster"]) == ("incident_opened", "pending", "east")
    assert n["delivery_attempts"] == []
    assert viewer.get(NOTIFICATIONS, {"incident": other.pk}).json()["results"] == []
    r = viewer.get(NOTIFICATIONS, {"incident": "x"})
    assert r.status_code == 400 and r.json()["field"] == "incident"
    assert viewer.get(NOTIFICATIONS, {"state": "lost"}).status_code == 400


def test_the_admin_sends_a_test_through_a_channel(admin_client, receiver):
    channel = make_channel("webhook", receiver.url)
    r = admin_client.post(
        "/admin/notify/channel/",
        {"action": "send_test", "_selected_action": [channel.pk]},
        follow=True,
    )
    assert r.status_code == 200
    assert "Webhook-channel: sent (" in r.content.decode()  # the admin capitalises
    [body] = receiver.bodies()
    assert body["event"] == "test"
    n = Notification.objects.get(event="test")
    assert admin_client.get(f"/admin/notify/notification/{n.pk}/change/").status_code == 200
    assert admin_client.get(f"/admin/notify/channel/{channel.pk}/change/").status_code == 200


def test_the_notifications_list_costs_the_same_queries_for_one_or_many(
    personas, job, receiver, django_assert_max_num_queries
):
    from notify import services

    channel = make_channel("webhook", receiver.url, rate_limit_per_minute=0)
    make_rule(channel, group_window_s=0)
    viewer = personas["viewer"].client()

    def add(count):
        for _ in range(count):
            incident_opened.send(sender=Incident, incident=make_incident(job))
            n = Notification.objects.get(state="pending")
            services.notification_deliver(notification_id=n.pk)

    add(1)
    with django_assert_max_num_queries(12) as one:
        assert len(viewer.get(NOTIFICATIONS).json()["results"]) >= 1
    add(5)
    with django_assert_max_num_queries(len(one.captured_queries)):
        results = viewer.get(NOTIFICATIONS).json()["results"]
    assert len(results) == 6 and all(r["delivery_attempts"] for r in results)
