"""The nodes pages: who may see them, the list's filters, pagination and columns, the
node page, and the manual actions, which go through the same service call as the
REST API (so its policies and guardrails apply), refused to viewers and without a
CSRF token."""

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Node, TrainingJob
from recovery.models import Action
from tests.factories import (
    ActionFactory,
    AttemptFactory,
    ClusterFactory,
    ClusterRecoverySettingsFactory,
    NodeFactory,
    TrainingJobFactory,
    incident_row,
)

pytestmark = pytest.mark.django_db

S = Action.State


@pytest.fixture
def east(db):
    return ClusterFactory(name="east")


@pytest.fixture
def node(east):
    return NodeFactory(cluster=east, name="n01", gpus=8)


def make_nodes(cluster, n, state=Node.State.ACTIVE, prefix="n"):
    return Node.objects.bulk_create(
        Node(cluster=cluster, name=f"{prefix}{i:04d}", state=state, gpus=8) for i in range(n)
    )


def make_job(cluster, key="llm"):
    return TrainingJobFactory(
        key=key, cluster=cluster, status=TrainingJob.Status.RUNNING, last_event_ts=1.0
    )


XID = {"detector": "test", "cause": "gpu", "fault_type": "gpu_xid", "summary": "Xid 79"}


def make_incident(job, nodes, *, fault_at=None, lost_s=0.0):
    return incident_row(job, fault_at=fault_at, nodes=nodes, lost_s=lost_s, **XID)


def make_action(node, state=S.AWAITING_APPROVAL, kind=Action.Kind.CORDON_NODE, **fields):
    return ActionFactory(
        kind=kind,
        state=state,
        cluster=node.cluster,
        node=node,
        requested_by=fields.pop("requested_by", "someone"),
        reason="test",
        **fields,
    )


def rows(html: str) -> list[str]:
    body = html[html.index("<tbody>") : html.index("</tbody>")]
    return re.findall(r"<tr>.*?</tr>", body, re.S)


# --- who may see them ----------------------------------------------------------------


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin"])
def test_roles_see_the_list_and_the_node(client, personas, node, persona):
    client.force_login(personas[persona].user)
    r = client.get("/nodes/")
    assert r.status_code == 200 and ">n01</a>" in r.content.decode()
    r = client.get("/nodes/east/n01/")
    assert r.status_code == 200
    html = r.content.decode()
    assert "<h1>n01" in html and f'data-live-node="{node.pk}"' in html
    # Operators and admins get the manual actions; viewers see no button at all.
    buttons = re.findall(r'<button name="kind" value="(\w+)">', html)
    if persona == "viewer":
        assert buttons == [] and "/nodes/east/n01/act/" not in html
    else:
        assert buttons == ["cordon_node", "uncordon_node", "validate_node"]
        assert "csrfmiddlewaretoken" in html


def test_outsiders_are_refused_and_strangers_sent_to_sign_in(client, personas, node):
    for url in ("/nodes/", "/nodes/east/n01/"):
        r = client.get(url)
        assert r.status_code == 302 and r["Location"].startswith("/login/")
    client.force_login(personas["outsider"].user)
    assert client.get("/nodes/").status_code == 403
    assert client.get("/nodes/east/n01/").status_code == 403


def test_an_unknown_node_is_404(client, personas, node):
    client.force_login(personas["viewer"].user)
    assert client.get("/nodes/east/nope/").status_code == 404
    assert client.get("/nodes/west/n01/").status_code == 404


# --- the list ------------------------------------------------------------------------


def test_filters_by_cluster_and_state(client, personas, east):
    west = ClusterFactory(name="west")
    make_nodes(east, 3, prefix="e")
    make_nodes(east, 2, Node.State.CORDONED, prefix="ec")
    make_nodes(west, 4, Node.State.CORDONED, prefix="wc")
    client.force_login(personas["viewer"].user)

    def names(**query):
        html = client.get("/nodes/", query).content.decode()
        return sorted(re.findall(r'<td><a href="/nodes/\w+/(\w+)/">', html)), html

    got, html = names()
    assert len(got) == 9 and "showing 9 of 9 nodes" in html
    got, html = names(cluster="east")
    assert got == ["e0000", "e0001", "e0002", "ec0000", "ec0001"]
    assert 'data-live-nodes="east"' in html  # the poll asks for this cluster's states only
    got, _ = names(state="cordoned")
    assert got == ["ec0000", "ec0001", "wc0000", "wc0001", "wc0002", "wc0003"]
    got, html = names(cluster="west", state="cordoned")
    assert got == ["wc0000", "wc0001", "wc0002", "wc0003"]
    assert '<option value="west" selected>' in html and '<option value="cordoned" selected>' in html
    got, _ = names(cluster="west", state="active")
    assert got == []
    got, _ = names(state="bogus")  # an unknown state filters nothing
    assert len(got) == 9


def test_paginates_by_200(client, personas, east):
    make_nodes(east, 450)
    client.force_login(personas["viewer"].user)
    html = client.get("/nodes/").content.decode()
    assert len(rows(html)) == 200
    assert "showing 200 of 450 nodes" in html and "page 1 of 3" in html
    assert 'href="?page=2"' in html
    html = client.get("/nodes/", {"page": 3}).content.decode()
    assert len(rows(html)) == 50 and ">n0449</a>" in html and ">n0399</a>" not in html
    html = client.get("/nodes/", {"cluster": "east", "page": 2}).content.decode()
    assert 'href="?cluster=east&amp;page=3"' in html  # the filter is kept across pages
    assert 'href="?cluster=east&amp;page=1"' in html


def test_the_columns(client, personas, east):
    a, b = (
        NodeFactory(cluster=east, name="a", gpus=8),
        NodeFactory(cluster=east, name="b", state=Node.State.IN_REPAIR),
    )
    job = make_job(east)
    now = timezone.now()
    make_incident(job, [a], fault_at=now - timedelta(days=1))
    make_incident(job, [a, b], fault_at=now - timedelta(days=10))
    make_incident(job, [a], fault_at=now - timedelta(days=40))
    Node.objects.filter(pk=a.pk).update(last_heard_at=now - timedelta(seconds=12))
    busy = make_action(a, S.QUEUED)
    make_action(b, S.SUCCEEDED, kind=Action.Kind.DRAIN_NODE)  # finished: not current
    client.force_login(personas["viewer"].user)
    row_a, row_b = rows(client.get("/nodes/").content.decode())
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row_a, re.S)
    assert cells[3:6] == ["8", "1", "2"]  # GPUs, incidents in 7 days, in 30 days
    assert re.search(r'<span title="[^"]+">(1[2-9]|[2-5][0-9]) s ago</span>', cells[6])
    assert f'data-live-action="{busy.pk}"' in cells[7] and "queued" in cells[7]
    assert 'data-state="active"' in cells[2] and 'title="a: active"' in cells[2]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row_b, re.S)
    assert 'data-state="in_repair"' in cells[2] and 'title="b: in repair"' in cells[2]
    assert cells[3:7] == ["\u2013", "0", "1", '<span class="muted">never</span>']  # no GPUs
    assert "data-live-action" not in cells[7]


# --- the node page -------------------------------------------------------------------


def test_the_node_page_shows_actions_incidents_and_launches(client, personas, east, node):
    job = make_job(east)
    attempt = AttemptFactory(job=job, number=3, world_size=16, started_at=timezone.now())
    attempt.nodes.set([node])
    now = timezone.now()
    older = make_incident(job, [node], fault_at=now - timedelta(hours=3), lost_s=7200)
    newer = make_incident(job, [node], fault_at=now - timedelta(hours=1))
    done = make_action(
        node, S.FAILED, approved_by="operator2", error="the scheduler said no", finished_at=now
    )
    live = make_action(node, S.QUEUED, kind=Action.Kind.VALIDATE_NODE, requested_by="policy:xid")
    client.force_login(personas["viewer"].user)
    html = client.get("/nodes/east/n01/").content.decode()
    assert "State since" in html and "GPUs</dt><dd>8" in html
    assert html.index(f"/incidents/{newer.pk}/") < html.index(f"/incidents/{older.pk}/")
    assert ">2.00<" in html  # the older incident's lost GPU-hours
    assert f'data-live-action="{live.pk}"' in html  # current, live
    assert f'data-live-action="{done.pk}"' not in html  # finished: nothing to poll
    assert "operator2" in html and "the scheduler said no" in html and "policy:xid" in html
    assert '<td class="num">3</td>' in html and '<td class="num">16</td>' in html  # the launch
    assert f'href="/jobs/{job.key}/"' in html


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_query_counts_do_not_grow_with_rows(client, personas, east, django_assert_max_num_queries):
    client.force_login(personas["operator"].user)
    few = make_nodes(east, 3)
    job = make_job(east)
    make_incident(job, few[:2])
    make_action(few[0])
    AttemptFactory(job=job, number=1).nodes.set(few)
    small = (_queries(client, "/nodes/"), _queries(client, "/nodes/east/n0000/"))

    many = make_nodes(east, 500, prefix="m")
    for i in range(60):
        make_incident(job, [few[0], many[i], many[i + 1]])
    for i in range(40):
        make_action(many[i], S.QUEUED if i % 2 else S.AWAITING_APPROVAL)
    for _ in range(60):
        make_action(few[0], S.SUCCEEDED)
    for number in range(2, 40):
        AttemptFactory(job=job, number=number).nodes.set([few[0], *many[:50]])
    big = (_queries(client, "/nodes/"), _queries(client, "/nodes/east/n0000/"))
    assert big == small
    with django_assert_max_num_queries(12):
        assert client.get("/nodes/").status_code == 200
    with django_assert_max_num_queries(15):
        assert client.get("/nodes/east/n0000/").status_code == 200


# --- manual actions ------------------------------------------------------------------


def act(client, kind="cordon_node", reason="Xid 79 twice today", json_answer=True, **extra):
    headers = {"HTTP_ACCEPT": "application/json"} if json_answer else {}
    return client.post("/nodes/east/n01/act/", {"kind": kind, "reason": reason}, **headers, **extra)


def test_an_operators_cordon_is_proposed_like_the_apis(client, personas, node):
    client.force_login(personas["operator"].user)
    r = act(client)
    assert r.status_code == 200, r.content
    body = r.json()
    action = Action.objects.get(node=node)
    assert body["ok"] is True and body["action"] == action.pk
    assert body["state"] == S.AWAITING_APPROVAL
    assert f"action #{action.pk} waits for another operator's approval" in body["detail"]
    assert (action.kind, action.mode, action.state) == (
        "cordon_node",
        "approval",
        S.AWAITING_APPROVAL,
    )
    assert action.requested_by == "operator"
    assert action.requested_by_user == personas["operator"].user
    assert action.reason == "Xid 79 twice today" and action.dry_run is False
    assert list(action.audit.values_list("from_state", "to_state", "actor")) == [
        ("", S.PROPOSED, "operator"),
        (S.PROPOSED, S.AWAITING_APPROVAL, "operator"),
    ]

    # The REST API's proposal of the same thing, for comparison: the same row.
    other = NodeFactory(cluster=node.cluster, name="n02")
    api = (
        personas["admin"]
        .client()
        .post(
            "/api/v1/actions/",
            data=json.dumps(
                {
                    "kind": "cordon_node",
                    "cluster": "east",
                    "node": "n02",
                    "reason": "Xid 79 twice today",
                }
            ),
            content_type="application/json",
        )
    )
    assert api.status_code == 201, api.content
    twin = Action.objects.get(node=other)
    fields = ("kind", "mode", "state", "blocked_by", "blocked_reason", "dry_run", "params")
    assert [getattr(twin, f) for f in fields] == [getattr(action, f) for f in fields]


def test_without_javascript_the_answer_is_a_message_and_a_redirect(client, personas, node):
    client.force_login(personas["operator"].user)
    r = act(client, kind="validate_node", json_answer=False)
    assert r.status_code == 302 and r["Location"] == "/nodes/east/n01/"
    page = client.get(r["Location"]).content.decode()
    assert "waits for another operator&#x27;s approval" in page
    assert Action.objects.get(node=node).kind == "validate_node"


def test_the_guardrails_apply_a_held_node_refuses_naming_the_lease(client, personas, node):
    holder = make_action(node, S.QUEUED, kind=Action.Kind.DRAIN_NODE)
    client.force_login(personas["operator"].user)
    r = act(client)
    assert r.status_code == 409
    body = r.json()
    assert body["ok"] is False and (body["code"], body["guardrail"]) == ("lease", "lease")
    assert f"#{holder.pk}" in body["detail"] and body["detail"].startswith("Refused (lease)")
    assert Action.objects.filter(node=node).count() == 1


def test_on_a_paused_cluster_it_waits_as_the_apis_does(client, personas, node, east):
    """A person's proposal always waits for approval; the pause, an automatic-only
    guardrail, is not named on it (it holds the action after approval instead): the
    page answers exactly what the API does."""
    ClusterRecoverySettingsFactory(
        cluster=east, paused=True, paused_by="admin", pause_reason="firmware"
    )
    client.force_login(personas["operator"].user)
    assert act(client).json()["state"] == S.AWAITING_APPROVAL
    NodeFactory(cluster=east, name="n02")
    api = (
        personas["operator"]
        .client()
        .post(
            "/api/v1/actions/",
            data=json.dumps(
                {"kind": "cordon_node", "cluster": "east", "node": "n02", "reason": "x"}
            ),
            content_type="application/json",
        )
    )
    page_action, api_action = Action.objects.order_by("id")
    assert api.json()["state"] == page_action.state
    assert (api_action.blocked_by, page_action.blocked_by) == ("", "")


@pytest.mark.parametrize("persona", ["viewer", "outsider"])
def test_viewers_and_outsiders_may_not_act(client, personas, node, persona):
    client.force_login(personas[persona].user)
    r = act(client)
    assert r.status_code == 403
    assert r.json()["ok"] is False
    assert not Action.objects.exists()
    node.refresh_from_db()
    assert node.state == Node.State.ACTIVE


def test_strangers_may_not_act(client, node):
    r = act(client, json_answer=False)
    assert r.status_code == 302 and r["Location"].startswith("/login/")
    assert not Action.objects.exists()


def test_act_is_post_only(client, personas, node):
    client.force_login(personas["operator"].user)
    assert client.get("/nodes/east/n01/act/").status_code == 405
    assert not Action.objects.exists()


@pytest.mark.parametrize(
    ("kind", "reason", "detail"),
    [
        ("drain_node", "why", "Unknown action"),  # not one the page offers
        ("cordon_node", "   ", "Say why"),
        ("cordon_node", "x" * 2001, "Say why"),
    ],
)
def test_invalid_requests_are_400(client, personas, node, kind, reason, detail):
    client.force_login(personas["operator"].user)
    r = act(client, kind=kind, reason=reason)
    assert r.status_code == 400 and detail in r.json()["detail"]
    assert not Action.objects.exists()


def test_an_unknown_node_cannot_be_acted_on(client, personas, node):
    client.force_login(personas["operator"].user)
    r = client.post("/nodes/east/nope/act/", {"kind": "cordon_node", "reason": "x"})
    assert r.status_code == 404
    assert not Action.objects.exists()


def test_csrf_is_enforced(personas, node):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(personas["operator"].user)
    r = act(browser)
    assert r.status_code == 403
    assert not Action.objects.exists()
    # The page's form carries the token: with it, the same post is accepted.
    page = browser.get("/nodes/east/n01/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    r = browser.post(
        "/nodes/east/n01/act/",
        {"kind": "cordon_node", "reason": "Xid 79", "csrfmiddlewaretoken": token},
        HTTP_ACCEPT="application/json",
    )
    assert r.status_code == 200 and Action.objects.filter(node=node).count() == 1
