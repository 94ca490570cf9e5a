"""The incident pages: the filtered, paginated list and one incident in depth, with its
notes and its resolution for operators and nothing to change for viewers."""

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from incidents.models import Incident, TimelineEntry
from recovery.models import Action
from tests.factories import (
    ActionFactory,
    ClusterFactory,
    NodeFactory,
    TrainingJobFactory,
    incident_row,
)

pytestmark = pytest.mark.django_db

NOW = timezone.now()


def make_incident(job, *, fault_at, nodes=(), **fields):
    fields.setdefault("detected_at", fault_at + timedelta(seconds=5))
    return incident_row(job, fault_at=fault_at, nodes=nodes, **fields)


@pytest.fixture
def world(personas):
    """Two clusters, a job on each, and five incidents that differ in every filter."""
    east = ClusterFactory(name="east")  # the ingest personas made them
    west = ClusterFactory(name="west")
    nodes = {n: NodeFactory(cluster=east, name=n, gpus=8) for n in ("n01", "n02")}
    nodes["w01"] = NodeFactory(cluster=west, name="w01", gpus=8)
    llm = TrainingJobFactory(key="llm", cluster=east)
    vit = TrainingJobFactory(key="vit", cluster=west)
    day = timedelta(days=1)
    i = {
        "gpu_old": make_incident(
            llm,
            fault_at=datetime(2026, 1, 10, 12, tzinfo=UTC),
            cause="gpu",
            fault_type="gpu_xid",
            state="resolved",
            nodes=[nodes["n01"]],
        ),
        "hang_week": make_incident(
            llm, fault_at=NOW - 3 * day, cause="hang", fault_type="hang", state="recovered"
        ),
        "net_today": make_incident(
            llm,
            fault_at=NOW - timedelta(hours=2),
            cause="network",
            state="open",
            nodes=[nodes["n01"], nodes["n02"]],
            resumed_at=NOW - timedelta(hours=1),
            recovered_at=NOW - timedelta(minutes=30),
            lost_gpu_seconds=7200.0,
            lost_breakdown={"stalled": 3600.0, "downtime": 3600.0},
        ),
        "vit_month": make_incident(
            vit, fault_at=NOW - 20 * day, cause="software", state="open", nodes=[nodes["w01"]]
        ),
        "vit_jan": make_incident(
            vit,
            fault_at=datetime(2026, 1, 20, 8, tzinfo=UTC),
            cause="memory",
            fault_type="ecc",
            state="recovered",
        ),
    }
    return {"clusters": (east, west), "nodes": nodes, "jobs": (llm, vit), "incidents": i}


def listed(client, **params) -> list[int]:
    r = client.get("/incidents/", params)
    assert r.status_code == 200
    return [row["incident"].pk for row in r.context["rows"]]


def chart(html: str, div_id: str) -> dict:
    m = re.search(
        rf'<script type="application/json" id="{div_id}-data" data-chart="{div_id}">(.*?)</script>',
        html,
        re.S,
    )
    assert m, f"no chart {div_id}"
    return json.loads(m.group(1))


def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


# --- who may see and do what ----------------------------------------------------------


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin"])
def test_roles_see_the_list_and_the_incident(client, personas, world, persona):
    client.force_login(personas[persona].user)
    net = world["incidents"]["net_today"]
    html = client.get("/incidents/").content.decode()
    assert f'href="/incidents/{net.pk}/"' in html and "Showing 5 of 5 incidents" in html
    r = client.get(f"/incidents/{net.pk}/")
    assert r.status_code == 200
    html = r.content.decode()
    assert "crash on a node" in html and 'href="/nodes/east/n01/"' in html
    forms = f'action="/incidents/{net.pk}/notes/"' in html, "Resolve incident" in html
    if persona == "viewer":
        assert forms == (False, False) and "not written yet" in html
    else:
        assert forms == (True, True) and "csrfmiddlewaretoken" in html


def test_outsiders_and_strangers_see_nothing(client, personas, world):
    pk = world["incidents"]["net_today"].pk
    r = client.get("/incidents/")
    assert r.status_code == 302 and "/login/" in r["Location"]
    client.force_login(personas["outsider"].user)
    assert client.get("/incidents/").status_code == 403
    assert client.get(f"/incidents/{pk}/").status_code == 403
    for what in ("notes", "resolve"):
        r = client.post(
            f"/incidents/{pk}/{what}/", {"root_cause": "x"}, HTTP_ACCEPT="application/json"
        )
        assert r.status_code == 403
    assert Incident.objects.get(pk=pk).state == "open"
    assert Incident.objects.get(pk=pk).root_cause == ""


def test_an_unknown_incident_is_404(client, personas, world):
    client.force_login(personas["operator"].user)
    assert client.get("/incidents/999999/").status_code == 404
    r = client.post("/incidents/999999/resolve/", {}, HTTP_ACCEPT="application/json")
    assert r.status_code == 404


def test_pages_load_no_third_party_assets(client, personas, world):
    client.force_login(personas["operator"].user)
    for url in ("/incidents/", f"/incidents/{world['incidents']['net_today'].pk}/"):
        html = client.get(url).content.decode()
        assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html


# --- the list: filters, order, pages, queries ------------------------------------------


def test_every_filter_narrows_the_list(client, personas, world):
    client.force_login(personas["viewer"].user)
    i = {k: v.pk for k, v in world["incidents"].items()}
    newest_first = [i["net_today"], i["hang_week"], i["vit_month"], i["vit_jan"], i["gpu_old"]]
    assert listed(client) == newest_first
    assert listed(client, cluster="west") == [i["vit_month"], i["vit_jan"]]
    assert listed(client, job="llm") == [i["net_today"], i["hang_week"], i["gpu_old"]]
    assert listed(client, cause="memory") == [i["vit_jan"]]
    assert listed(client, state="open") == [i["net_today"], i["vit_month"]]
    assert listed(client, range="24h") == [i["net_today"]]
    assert listed(client, range="7d") == [i["net_today"], i["hang_week"]]
    assert listed(client, range="30d") == [i["net_today"], i["hang_week"], i["vit_month"]]
    # Whole UTC days, `until` included.
    assert listed(client, since="2026-01-10", until="2026-01-10") == [i["gpu_old"]]
    assert listed(client, since="2026-01-11", until="2026-01-31") == [i["vit_jan"]]
    assert listed(client, until="2026-01-19") == [i["gpu_old"]]
    # Filters combine.
    assert listed(client, cluster="west", state="open", range="30d") == [i["vit_month"]]
    assert listed(client, job="llm", cause="memory") == []


def test_a_bad_filter_is_shown_and_ignored(client, personas, world):
    client.force_login(personas["viewer"].user)
    r = client.get("/incidents/", {"cause": "gremlins", "state": "open"})
    assert "field-error" in r.content.decode()
    assert len(r.context["rows"]) == 2  # the state still filters
    r = client.get("/incidents/", {"since": "2026-02-01", "until": "2026-01-01"})
    assert "The end comes before the start." in r.content.decode()


def test_the_list_shows_the_columns(client, personas, world):
    client.force_login(personas["viewer"].user)
    html = client.get("/incidents/", {"cause": "network"}).content.decode()
    row = html[html.index("<tbody>") : html.index("</tbody>")]
    for text in (
        "network",
        "state-open",
        "sev-major",
        'href="/jobs/llm/"',
        'href="/nodes/east/n02/"',
        "5.0 s",  # time to detect
        "1 h 00 min",  # time to resume
        "1 h 30 min",  # time to recover
        "2.00",  # lost GPU-hours
    ):
        assert text in row, text


def test_the_list_is_paginated(client, personas, world):
    llm = world["jobs"][0]
    for k in range(245):
        make_incident(llm, fault_at=NOW - timedelta(days=40, minutes=k))
    client.force_login(personas["viewer"].user)
    r = client.get("/incidents/")
    assert len(r.context["rows"]) == 100
    assert "Showing 100 of 250 incidents (page 1 of 3)" in r.content.decode()
    r = client.get("/incidents/", {"page": 3})
    assert len(r.context["rows"]) == 50
    assert r.context["rows"][-1]["incident"].pk == world["incidents"]["gpu_old"].pk
    # The pages keep the filters.
    r = client.get("/incidents/", {"job": "llm", "page": 2})
    assert "job=llm" in r.content.decode().split('class="pager"')[1]
    all_pks = [
        row["incident"].pk
        for p in (1, 2, 3)
        for row in client.get("/incidents/", {"page": p}).context["rows"]
    ]
    assert len(set(all_pks)) == 250


def test_list_queries_do_not_grow_with_incidents(
    client, personas, world, django_assert_max_num_queries
):
    client.force_login(personas["viewer"].user)
    few = count_queries(client, "/incidents/?cluster=east")
    assert few <= 10
    llm = world["jobs"][0]
    nodes = list(world["nodes"].values())[:2]
    for k in range(150):
        make_incident(llm, fault_at=NOW - timedelta(minutes=k), nodes=nodes)
    with django_assert_max_num_queries(few):  # a full page of 100, each with two nodes
        r = client.get("/incidents/?cluster=east")
    assert len(r.context["rows"]) == 100


# --- one incident ---------------------------------------------------------------------


def add_timeline(incident, n, start):
    kinds = TimelineEntry.Kind.values
    TimelineEntry.objects.bulk_create(
        TimelineEntry(
            incident=incident,
            kind=kinds[k % len(kinds)],
            at=start + timedelta(seconds=k),
            actor=f"actor-{k}",
            message=f"entry {k}",
        )
        for k in range(n)
    )


def test_the_incident_page_shows_times_losses_and_the_timeline(client, personas, world):
    net = world["incidents"]["net_today"]
    add_timeline(net, 4, net.fault_at)
    client.force_login(personas["viewer"].user)
    html = client.get(f"/incidents/{net.pk}/").content.decode()
    for text in (
        "Time to detect",
        "5.0 s",
        "1 h 00 min",
        "1 h 30 min",
        "Lost GPU-hours</span><b>2</b>",
    ):
        assert text in html, text
    assert 'href="/nodes/east/n02/"' in html
    # The lost GPU-hours by category, in GPU-hours.
    lost = chart(html, "lost-chart")
    assert {t["name"]: t["x"] for t in lost["data"]} == {"stalled": [1.0], "downtime": [1.0]}
    assert lost["layout"]["xaxis"]["title"]["text"] == "GPU-hours"
    # The timeline: one trace per kind, every entry with its time and its actor: message.
    timeline = chart(html, "timeline-chart")
    entries = TimelineEntry.objects.filter(incident=net)
    by_kind = {t["name"]: t for t in timeline["data"]}
    assert set(by_kind) == {e.kind.replace("_", " ") for e in entries}
    for e in entries:
        trace = by_kind[e.kind.replace("_", " ")]
        assert f"{e.actor}: {e.message}" in trace["text"]
        k = trace["text"].index(f"{e.actor}: {e.message}")
        assert trace["x"][k] == e.at.strftime("%Y-%m-%d %H:%M:%S.%f")
        assert trace["y"][k] == e.kind.replace("_", " ")
    assert timeline["layout"]["xaxis"]["title"]["text"] == "time (UTC)"
    assert html.count('<tr class="kind-') == 4 and "Showing 4 of 4 entries" in html


def test_a_long_timeline_shows_its_first_and_latest_entries(client, personas, world):
    net = world["incidents"]["net_today"]
    add_timeline(net, 700, net.fault_at)
    client.force_login(personas["viewer"].user)
    html = client.get(f"/incidents/{net.pk}/").content.decode()
    assert "Showing 500 of 700 entries" in html
    assert ">entry 0<" in html and ">entry 249<" in html and ">entry 699<" in html
    assert ">entry 250<" not in html and ">entry 449<" not in html and ">entry 450<" in html
    texts = [t for trace in chart(html, "timeline-chart")["data"] for t in trace["text"]]
    assert len(texts) == 500


def test_the_actions_that_answer_it(client, personas, world):
    net = world["incidents"]["net_today"]
    east = world["clusters"][0]
    waiting = ActionFactory(
        kind="replace_node",
        state="awaiting_approval",
        cluster=east,
        node=world["nodes"]["n02"],
        incident=net,
        requested_by="policy:replace-bad-gpu",
    )
    done = ActionFactory(
        kind="restart_job",
        state="succeeded",
        cluster=east,
        job=world["jobs"][0],
        incident=net,
        requested_by="operator",
        approved_by="admin",
    )
    ActionFactory(kind="cordon_node", state="succeeded", cluster=east, requested_by="x")
    client.force_login(personas["viewer"].user)
    html = client.get(f"/incidents/{net.pk}/").content.decode()
    assert f'data-live-action="{waiting.pk}" data-state="awaiting_approval"' in html
    assert f'data-live-action="{done.pk}" data-state="succeeded"' in html
    assert html.count("data-live-action=") == 2  # not the action of no incident
    assert 'href="/approvals/">waiting' in html and "policy:replace-bad-gpu" in html
    assert ">admin<" in html and "Showing 2 of 2 actions" in html


def test_incident_queries_do_not_grow_with_timeline_actions_or_nodes(
    client, personas, world, django_assert_max_num_queries
):
    net = world["incidents"]["net_today"]
    east = world["clusters"][0]
    url = f"/incidents/{net.pk}/"
    client.force_login(personas["operator"].user)
    few = count_queries(client, url)
    assert few <= 11

    def grow(k):
        add_timeline(net, 1200, net.fault_at + timedelta(hours=k))
        extra = [NodeFactory(cluster=east, name=f"x{k}-{n:03d}") for n in range(40)]
        net.nodes.add(*extra)
        Action.objects.bulk_create(
            Action(kind="cordon_node", state="succeeded", cluster=east, node=n, incident=net)
            for n in extra * 4
        )

    grow(1)
    # Past their caps, the timeline and the actions cost a count each, and the
    # timeline its latest half: three more, once.
    with django_assert_max_num_queries(few + 3):
        client.get(url)
    many = count_queries(client, url)
    grow(2)
    with django_assert_max_num_queries(many):
        html = client.get(url).content.decode()
    assert "Showing 100 of 320 actions" in html and "Showing 500 of 2400 entries" in html


# --- notes and resolution ----------------------------------------------------------------


def test_an_operator_edits_the_notes_and_it_is_audited(client, personas, world):
    net = world["incidents"]["net_today"]
    client.force_login(personas["operator"].user)
    r = client.post(
        f"/incidents/{net.pk}/notes/",
        {"root_cause": "Bad NIC on n02", "postmortem": "Swapped the NIC.\nAdded a check."},
    )
    assert r.status_code == 302 and r["Location"] == f"/incidents/{net.pk}/"
    net.refresh_from_db()
    assert net.root_cause == "Bad NIC on n02"
    assert net.postmortem == "Swapped the NIC.\nAdded a check."
    note = TimelineEntry.objects.get(incident=net, kind="note")
    assert note.actor == "operator" and note.source == "console"
    assert note.data == {"root_cause": "Bad NIC on n02", "postmortem": net.postmortem}
    # Sending one field leaves the other as it is; the page shows what was saved.
    r = client.post(
        f"/incidents/{net.pk}/notes/", {"root_cause": "Bad NIC"}, HTTP_ACCEPT="application/json"
    )
    assert r.status_code == 200 and r.json()["ok"] is True
    net.refresh_from_db()
    assert (net.root_cause, net.postmortem) == ("Bad NIC", "Swapped the NIC.\nAdded a check.")
    assert TimelineEntry.objects.filter(incident=net, kind="note").count() == 2
    assert "Bad NIC</textarea>" in client.get(f"/incidents/{net.pk}/").content.decode()


def test_notes_over_the_limit_are_refused(client, personas, world):
    net = world["incidents"]["net_today"]
    client.force_login(personas["operator"].user)
    r = client.post(
        f"/incidents/{net.pk}/notes/",
        {"root_cause": "x" * 20001},
        HTTP_ACCEPT="application/json",
    )
    assert r.status_code == 400 and r.json()["ok"] is False
    assert Incident.objects.get(pk=net.pk).root_cause == ""


def test_a_viewer_changes_nothing(client, personas, world):
    net = world["incidents"]["net_today"]
    client.force_login(personas["viewer"].user)
    for what, data in (("notes", {"root_cause": "mine"}), ("resolve", {"note": "done"})):
        r = client.post(f"/incidents/{net.pk}/{what}/", data, HTTP_ACCEPT="application/json")
        assert r.status_code == 403 and r.json()["ok"] is False
        r = client.post(f"/incidents/{net.pk}/{what}/", data)  # a plain form: sent back
        assert r.status_code == 302
    net.refresh_from_db()
    assert (net.state, net.root_cause, net.resolved_at) == ("open", "", None)
    assert not TimelineEntry.objects.filter(incident=net).exists()
    assert client.get(f"/incidents/{net.pk}/notes/").status_code == 405


def test_an_operator_resolves_the_incident(client, personas, world):
    net = world["incidents"]["net_today"]
    client.force_login(personas["operator"].user)
    r = client.post(f"/incidents/{net.pk}/resolve/", {"note": "NIC replaced"})
    assert r.status_code == 302
    net.refresh_from_db()
    assert net.state == "resolved" and net.resolved_at is not None
    entry = TimelineEntry.objects.get(incident=net, kind="state_change")
    assert entry.actor == "operator" and "NIC replaced" in entry.message
    html = client.get(f"/incidents/{net.pk}/").content.decode()
    assert "Resolve incident" not in html and "state-resolved" in html
    # Resolving again changes nothing.
    r = client.post(f"/incidents/{net.pk}/resolve/", {}, HTTP_ACCEPT="application/json")
    assert r.json() == {"ok": True, "detail": "Already resolved.", "state": "resolved"}
    assert TimelineEntry.objects.filter(incident=net, kind="state_change").count() == 1
