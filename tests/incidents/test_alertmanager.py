"""Alertmanager's webhook (POST /api/v1/alerts/alertmanager): the payload read strictly
(a 400 naming the field, nothing stored), labels mapped to a node and a fault (built-in
rules, a cluster's own), one incident per fault episode however often an alert is
delivered, resolved with the alert when it alone opened it, an alert for a node that
runs no job, and who may post. The real Alertmanager: test_alertmanager_live.py."""

import json
import subprocess
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from incidents.models import Alert, Incident, TimelineEntry
from jobs.models import Event, Node, TrainingJob
from tests.processes import need_program

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
URL = "/api/v1/alerts/alertmanager"
T0 = 1_790_000_000.0
STARTS = "2026-09-21T12:00:00.123456789Z"  # after T0: while the launch runs
ENDS = "2026-09-21T12:05:00Z"
ZERO = "0001-01-01T00:00:00Z"  # Go's zero time: a firing alert's endsAt


def alert(
    labels=None, *, status="firing", starts=STARTS, ends=ZERO, fingerprint="5e1f00d1c0ffee01"
):
    labels = {"alertname": "GpuXidError", "Hostname": "n1", **(labels or {})}
    return {
        "status": status,
        "labels": {k: v for k, v in labels.items() if v is not None},
        "annotations": {"summary": "GPU fell off the bus", "description": "Xid 79 on GPU 3"},
        "startsAt": starts,
        "endsAt": ends,
        "generatorURL": "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS",
        "fingerprint": fingerprint,
    }


def payload(*alerts, **top):
    return {
        "version": "4",
        "groupKey": '{}:{alertname="GpuXidError"}',
        "truncatedAlerts": 0,
        "status": alerts[0]["status"] if alerts else "firing",
        "receiver": "rebound",
        "groupLabels": {"alertname": "GpuXidError"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
        **top,
    }


@pytest.fixture
def post(personas):
    def post_(body, persona="ingest", query=""):
        client = personas[persona].client() if persona else APIClient()
        raw = body if isinstance(body, bytes | str) else json.dumps(body)
        return client.post(URL + query, data=raw, content_type="application/json")

    return post_


@pytest.fixture
def running(ingest):
    """Job j1 of cluster east, its launch 1 running on n1 and n2; node n3 idle."""
    events = [
        {"id": "s1", "job": "j1", "kind": "attempt_started", "ts": T0, "attempt": 1,
         "data": {"world_size": 16, "gpus_per_node": 8, "nodes": ["n1", "n2"]}},
        {"id": "r1", "job": "j1", "kind": "ready", "ts": T0 + 5, "attempt": 1, "data": {}},
        {"id": "t1", "job": "j1", "kind": "step", "ts": T0 + 6, "attempt": 1, "data": {"step": 1}},
        {"id": "h3", "job": "j2", "kind": "heartbeat", "ts": T0, "node": "n3", "data": {}},
    ]  # fmt: skip
    assert ingest(events).status_code == 202
    return TrainingJob.objects.get(key="j1")


def incidents():
    return list(Incident.objects.order_by("id"))


# --- the payload ----------------------------------------------------------------


def _bad(field, value):
    """Set (or, with KeyError, remove) a top-level field, or ("a.") one of the second
    alert's: the first alert is good and is not stored either (all or nothing)."""

    def change(p):
        target, key = (p["alerts"][1], field[2:]) if field.startswith("a.") else (p, field)
        if value is KeyError:
            del target[key]
        else:
            target[key] = value
        return p

    return change


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("version", "3", "version"),
        ("version", KeyError, "version"),
        ("status", "pending", "status"),
        ("receiver", 7, "receiver"),
        ("groupKey", KeyError, "groupKey"),
        ("truncatedAlerts", -1, "truncatedAlerts"),
        ("commonLabels", {"a": 1}, "commonLabels.a"),
        ("alerts", [], "alerts"),
        ("alerts", {"0": {}}, "alerts"),
        ("alerts", [alert(), "x"], "alerts[1]"),
        ("a.status", "firin", "alerts[1].status"),
        ("a.labels", KeyError, "alerts[1].labels"),
        ("a.labels", ["alertname"], "alerts[1].labels"),
        ("a.labels", {"alertname": None}, "alerts[1].labels.alertname"),
        ("a.labels", {"alertname": "x\x00y"}, "alerts[1].labels.alertname"),
        ("a.annotations", {"summary": 3}, "alerts[1].annotations.summary"),
        ("a.startsAt", KeyError, "alerts[1].startsAt"),
        ("a.startsAt", "2026-09-21 12:00:00", "alerts[1].startsAt"),
        ("a.startsAt", ZERO, "alerts[1].startsAt"),
        ("a.startsAt", 1790000000, "alerts[1].startsAt"),
        ("a.endsAt", "soon", "alerts[1].endsAt"),
        ("a.generatorURL", ["u"], "alerts[1].generatorURL"),
        ("a.fingerprint", KeyError, "alerts[1].fingerprint"),
        ("a.fingerprint", "../etc", "alerts[1].fingerprint"),
        ("a.fingerprint", "f" * 65, "alerts[1].fingerprint"),
    ],
)
def test_a_malformed_payload_is_a_400_naming_the_field_and_stores_nothing(
    post, running, field, value, named
):
    body = _bad(field, value)(payload(alert(), alert(fingerprint="0000000000000002")))
    r = post(body)
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid_alerts"
    assert named in [e["field"] for e in r.json()["errors"]], r.json()
    assert Alert.objects.count() == 0
    assert not Event.objects.filter(kind="fault").exists()
    assert incidents() == []


@pytest.mark.parametrize(
    "body, reason",
    [(b"{", "not JSON"), (b"[]", "must be a JSON object"), (b"null", "must be a JSON object")],
)
def test_a_body_that_is_no_json_object_is_a_400(post, body, reason):
    r = post(body)
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"] == "body"
    assert reason in r.json()["errors"][0]["reason"]


def test_fields_alertmanager_may_add_later_are_let_through(post, running):
    r = post(payload(alert(), future="field"))
    assert r.status_code == 200, r.content


# --- mapping ---------------------------------------------------------------------


def test_a_dcgm_xid_alert_opens_the_jobs_incident_with_its_xid(post, running):
    r = post(payload(alert({"err_code": "79", "gpu": "3"})))
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["received"], body["new"], body["repeats"]) == (1, 1, 0)
    [incident] = incidents()
    assert (incident.job.key, incident.fault_type, incident.xid) == ("j1", "gpu_xid", 79)
    assert (incident.cause, incident.severity) == ("gpu", "critical")  # Xid 79: hardware
    assert [n.name for n in incident.nodes.all()] == ["n1"]
    assert incident.attempt == 1
    [record] = body["alerts"]
    assert record["node"] == "n1" and record["outcome"] == "incident"
    assert record["incidents"] == [incident.pk]
    assert (record["fault_type"], record["xid"], record["rule"]) == (
        "gpu_xid",
        79,
        "builtin:dcgm_xid",
    )
    [event] = Event.objects.filter(kind="fault")
    assert event.node == "n1" and event.data["xid"] == 79
    assert "GPU fell off the bus" in event.data["message"]
    signal = incident.timeline.get(kind="signal", source="alertmanager")
    assert "GpuXidError firing on n1" in signal.message


def test_the_xid_comes_from_the_metric_and_its_value_when_no_label_names_it(post, running):
    labels = {"alertname": "GPUErrors", "__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "n2"}
    a = alert(labels)
    a["annotations"]["value"] = "48"
    post(payload(a))
    [incident] = incidents()
    assert (incident.fault_type, incident.xid, incident.cause) == ("gpu_xid", 48, "gpu")


@pytest.mark.parametrize(
    "labels, fault, cause",
    [
        ({"alertname": "GpuEccDoubleBitErrors"}, "ecc", "memory"),
        ({"alertname": "GPUMemory", "metric": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}, "ecc", "memory"),
        ({"alertname": "NCCLTimeouts"}, "network", "network"),
        ({"alertname": "NodeNetworkReceiveErrs"}, "network", "network"),
        ({"alertname": "InfinibandPortDown"}, "network", "network"),
        ({"alertname": "DiskFull", "rebound_fault": "oom"}, "oom", "software"),
    ],
)
def test_built_in_rules_and_the_override_label(post, running, labels, fault, cause):
    post(payload(alert(labels)))
    [incident] = incidents()
    assert (incident.fault_type, incident.cause, incident.xid) == (fault, cause, None)


def test_node_exporters_node_down_is_a_host_fault_as_the_dead_node_detector_says(post, running):
    post(payload(alert({"alertname": "NodeDown", "Hostname": None, "instance": "n2:9100"})))
    [incident] = incidents()
    assert (incident.fault_type, incident.cause, incident.severity) == (
        "dead_node",
        "host",
        "critical",
    )
    assert [n.name for n in incident.nodes.all()] == ["n2"]
    assert Node.objects.get(name="n2").state == "suspect"  # as for a node found dead


def test_an_alert_no_rule_maps_is_recorded_and_ignored(post, running):
    r = post(payload(alert({"alertname": "NodeSuccessRateLow"})))  # not "ecc"
    assert r.json()["alerts"][0]["outcome"] == "ignored"
    assert r.json()["alerts"][0]["fault_type"] is None
    assert incidents() == []
    assert not Event.objects.filter(kind="fault").exists()
    assert Node.objects.get(name="n1").state == "active"


def test_a_cluster_maps_alerts_its_own_way(post, running, personas):
    operator = personas["operator"].client()
    values = {
        "alerts.node_labels": ["host"],
        "alerts.rules": [
            {"name": "fell-off", "match": {"alertname": "Gpu.*Lost"}, "fault": "gpu_xid",
             "xid": 79},
            {"match": {"alertname": "GpuXidError", "severity": "info"}, "fault": "ignore"},
        ],
        "alerts.unmatched": "other",
    }  # fmt: skip
    r = operator.patch(
        "/api/v1/alerts/settings",
        {"cluster": "east", "values": values},
        format="json",
    )
    assert r.status_code == 200, r.content
    assert {row["name"]: row["value"] for row in r.json()} == values
    post(payload(alert({"alertname": "GpuBusLost", "Hostname": None, "host": "n1.dc1.example"})))
    post(payload(alert({"severity": "info", "host": "n1"}, fingerprint="0000000000000002")))
    post(payload(alert({"alertname": "DiskFull", "host": "n2"}, fingerprint="0000000000000003")))
    by_fp = {a.fingerprint: a for a in Alert.objects.all()}
    lost = by_fp["5e1f00d1c0ffee01"]
    assert (lost.node.name, lost.fault_type, lost.xid, lost.rule) == (
        "n1",  # the FQDN's short name
        "gpu_xid",
        79,
        "rules[0]:fell-off",
    )
    assert by_fp["0000000000000002"].outcome == "ignored"
    assert (by_fp["0000000000000003"].fault_type, by_fp["0000000000000003"].rule) == (
        "other",
        "unmatched",
    )
    [incident] = incidents()  # one launch, one episode: the later alert joins it
    assert incident.xid == 79


@pytest.mark.parametrize(
    "values, name",
    [
        ({"alerts.node_labels": []}, "alerts.node_labels"),
        ({"alerts.node_labels": ["no-dash"]}, "alerts.node_labels"),
        ({"alerts.rules": [{"match": {"alertname": "("}, "fault": "ecc"}]}, "alerts.rules"),
        ({"alerts.rules": [{"match": {}, "fault": "melted"}]}, "alerts.rules"),
        ({"alerts.rules": [{"fault": "ecc", "when": "always"}]}, "alerts.rules"),
        ({"alerts.rules": [{"fault": "gpu_xid", "xid": -1}]}, "alerts.rules"),
        ({"alerts.unmatched": 3}, "alerts.unmatched"),
        ({"hang.factor": 3}, "hang.factor"),
    ],
)
def test_invalid_alert_settings_are_refused_and_nothing_changes(personas, running, values, name):
    r = (
        personas["operator"]
        .client()
        .patch(
            "/api/v1/alerts/settings",
            {"cluster": "east", "values": {"alerts.unmatched": "other", **values}},
            format="json",
        )
    )
    assert r.status_code == 400, r.content
    assert [e["name"] for e in r.json()["errors"]] == [name]
    rows = personas["viewer"].client().get("/api/v1/alerts/settings", {"cluster": "east"}).json()
    assert {row["name"]: row["cluster_value"] for row in rows} == {
        "alerts.node_labels": None,
        "alerts.rules": None,
        "alerts.unmatched": None,
    }


def test_alert_settings_need_an_operator_to_change(personas, running):
    body = {"cluster": "east", "values": {"alerts.unmatched": "other"}}
    for who in ("viewer", "ingest"):
        r = personas[who].client().patch("/api/v1/alerts/settings", body, format="json")
        assert r.status_code == 403
    assert (
        personas["ingest"].client().get("/api/v1/alerts/settings?cluster=east").status_code == 403
    )


# --- deliveries, repeats, resolves ----------------------------------------------------


def test_the_same_alert_delivered_again_changes_nothing(post, running):
    body = payload(alert({"err_code": "79"}))
    post(body)
    entries = TimelineEntry.objects.count()
    r = post(body)
    assert (r.json()["new"], r.json()["repeats"]) == (0, 1)
    assert len(incidents()) == 1
    assert Event.objects.filter(kind="fault").count() == 1
    assert TimelineEntry.objects.count() == entries
    [record] = Alert.objects.all()
    assert record.receipts == 2 and record.last_received_at > record.first_received_at


def test_the_same_alert_twice_in_one_delivery_counts_once(post, running):
    r = post(payload(alert(), alert()))
    assert r.status_code == 200
    assert Alert.objects.count() == 1 and len(incidents()) == 1


def test_an_alert_opens_its_incident_and_its_resolve_resolves_it(post, running):
    post(payload(alert({"err_code": "79"})))
    [incident] = incidents()
    assert incident.state == "open"
    r = post(payload(alert({"err_code": "79"}, status="resolved", ends=ENDS)))
    assert r.json()["resolved"] == 1
    incident.refresh_from_db()
    assert incident.state == "resolved" and incident.resolved_at is not None
    change = incident.timeline.get(kind="state_change", data__to="resolved")
    assert change.actor == "alertmanager"
    signals = incident.timeline.filter(source="alertmanager", kind="signal").order_by("at")
    assert [e.data["status"] for e in signals] == ["firing", "resolved"]
    record = Alert.objects.get()
    assert (record.status, record.ends_at.isoformat()) == ("resolved", "2026-09-21T12:05:00+00:00")
    # The resolve delivered again changes nothing more.
    entries = TimelineEntry.objects.count()
    assert post(payload(alert(status="resolved", ends=ENDS))).json()["repeats"] == 1
    assert TimelineEntry.objects.count() == entries


def test_an_incident_other_evidence_joined_stays_open_when_the_alert_resolves(
    post, running, ingest
):
    crash = {"id": "c1", "job": "j1", "kind": "fault", "ts": T0 + 7, "attempt": 1,
             "node": "n2", "rank": 9, "data": {"type": "crash"}}  # fmt: skip
    assert ingest([crash]).status_code == 202
    from incidents.services import incidents_detect

    incidents_detect(job=running)
    [incident] = incidents()
    post(payload(alert({"err_code": "79"})))
    assert incidents() == [incident]  # joined, not a second one
    assert Alert.objects.get().incidents.get() == incident
    incidents_detect(job=running)  # the full pass: the alert's fault in its evidence
    post(payload(alert(status="resolved", ends=ENDS)))
    incident.refresh_from_db()
    assert incident.state == "open"
    note = incident.timeline.get(kind="note", actor="alertmanager")
    assert "stays open" in note.message and "c1" in note.data["other_evidence"]


def test_an_alert_first_heard_of_as_resolved_does_nothing(post, running):
    r = post(payload(alert(status="resolved", ends=ENDS)))
    assert r.json()["alerts"][0]["outcome"] == "resolved_first"
    assert incidents() == [] and not Event.objects.filter(kind="fault").exists()


def test_an_alert_that_fires_again_later_is_a_new_alert(post, running):
    post(payload(alert()))
    post(payload(alert(status="resolved", ends=ENDS)))
    post(payload(alert(starts="2026-09-21T13:00:00Z")))
    assert Alert.objects.count() == 2
    assert Event.objects.filter(kind="fault").count() == 2


# --- nodes without a job, unknown nodes ------------------------------------------------


def test_an_alert_for_a_node_without_a_job_marks_it_suspect_and_opens_nothing(
    post, running, personas
):
    r = post(payload(alert({"Hostname": "n3", "err_code": "79"})))
    assert r.json()["alerts"][0]["outcome"] == "no_job"
    assert incidents() == [] and not Event.objects.filter(kind="fault").exists()
    assert Node.objects.get(name="n3").state == "suspect"
    listed = personas["viewer"].client().get("/api/v1/alerts", {"node": "n3"}).json()
    assert [a["fingerprint"] for a in listed["results"]] == ["5e1f00d1c0ffee01"]


def test_a_repeat_reports_the_fault_to_a_job_that_started_on_the_node_since(post, running, ingest):
    """A scheduler placed a job on the node the alert made suspect: the next repeat of
    the still-firing alert opens that job's incident; later repeats add nothing, and
    the resolve resolves it."""
    body = payload(alert({"Hostname": "n3", "err_code": "79"}))
    assert post(body).json()["alerts"][0]["outcome"] == "no_job"
    started = [{"id": "s3", "job": "j3", "kind": "attempt_started", "ts": T0 + 600,
                "attempt": 1, "data": {"world_size": 8, "nodes": ["n3"]}}]  # fmt: skip
    assert ingest(started).status_code == 202
    r = post(body)
    assert (r.json()["repeats"], r.json()["alerts"][0]["outcome"]) == (1, "incident")
    [incident] = incidents()
    assert (incident.job.key, incident.xid, incident.attempt) == ("j3", 79, 1)
    [record] = Alert.objects.all()
    assert list(record.incidents.all()) == [incident]
    post(body)
    assert Event.objects.filter(kind="fault").count() == 1 and len(incidents()) == 1
    post(payload(alert({"Hostname": "n3", "err_code": "79"}, status="resolved", ends=ENDS)))
    incident.refresh_from_db()
    assert incident.state == "resolved"


def test_a_cordoned_node_stays_cordoned(post, running):
    Node.objects.filter(name="n3").update(state="cordoned")
    post(payload(alert({"Hostname": "n3"})))
    assert Node.objects.get(name="n3").state == "cordoned"


def test_an_alert_for_no_known_node_is_recorded(post, running):
    post(payload(alert({"Hostname": "n99"})))
    post(payload(alert({"Hostname": None}, fingerprint="0000000000000002")))
    outcomes = dict(Alert.objects.values_list("fingerprint", "outcome"))
    assert outcomes == {"5e1f00d1c0ffee01": "unknown_node", "0000000000000002": "no_node"}
    assert incidents() == []


def test_a_finished_job_is_not_on_the_node_any_more(post, running, ingest):
    end = [{"id": "e1", "job": "j1", "kind": "attempt_ended", "ts": T0 + 9, "attempt": 1,
            "data": {"reason": "completed"}}]  # fmt: skip
    assert ingest(end).status_code == 202
    assert post(payload(alert())).json()["alerts"][0]["outcome"] == "no_job"


# --- who may post and read ---------------------------------------------------------


def test_only_an_ingest_token_may_post_alerts(post, running):
    assert post(payload(alert()), persona=None).status_code == 401
    for who in ("viewer", "operator", "admin"):
        assert post(payload(alert()), persona=who).status_code == 403
    assert Alert.objects.count() == 0


def test_a_token_of_another_cluster_is_refused(post, running):
    r = post(payload(alert()), persona="ingest_west", query="?cluster=east")
    assert r.status_code == 403 and r.json()["error"] == "forbidden_cluster"
    assert Alert.objects.count() == 0
    # Without naming a cluster, its alerts are its own cluster's: east's n1 is not there.
    r = post(payload(alert()), persona="ingest_west")
    assert r.json()["alerts"][0]["cluster"] == "west"
    assert r.json()["alerts"][0]["outcome"] == "unknown_node"
    assert incidents() == []
    assert post(payload(alert()), query="?cluster=east").status_code == 200


def test_the_alert_list_filters_and_needs_a_viewer(post, running, personas):
    post(payload(alert()))
    post(payload(alert({"Hostname": "n3"}, fingerprint="0000000000000002")))
    post(payload(alert(status="resolved", ends=ENDS)))
    viewer = personas["viewer"].client()

    def fingerprints(**params):
        r = viewer.get("/api/v1/alerts", params)
        assert r.status_code == 200, r.content
        return sorted(a["fingerprint"] for a in r.json()["results"])

    assert fingerprints() == ["0000000000000002", "5e1f00d1c0ffee01"]
    assert fingerprints(status="resolved") == ["5e1f00d1c0ffee01"]
    assert fingerprints(node="n3") == ["0000000000000002"]
    assert fingerprints(cluster="west") == []
    assert viewer.get("/api/v1/alerts", {"status": "gone"}).status_code == 400
    assert personas["ingest"].client().get("/api/v1/alerts").status_code == 403
    assert personas["outsider"].client().get("/api/v1/alerts").status_code == 403


# --- the shipped configuration ------------------------------------------------------


def test_the_shipped_alertmanager_configuration_is_valid():
    need_program("amtool", "Debian's prometheus-alertmanager", require="REBOUND_REQUIRE_MONITORING")
    config = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
    out = subprocess.run(
        ["amtool", "check-config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = config.read_text()
    assert "send_resolved: true" in text and "credentials_file:" in text
    assert "/api/v1/alerts/alertmanager" in text


def test_the_admin_lists_and_shows_alert_records(post, running, client, django_user_model):
    # Not pytest-django's admin_client: the personas' "admin" is no superuser.
    client.force_login(django_user_model.objects.create_superuser("root", "", "x"))
    admin_client = client
    post(payload(alert({"err_code": "79"})))
    record = Alert.objects.get()
    listing = admin_client.get("/admin/incidents/alert/", {"outcome": "incident"})
    assert listing.status_code == 200 and b"GpuXidError" in listing.content
    page = admin_client.get(f"/admin/incidents/alert/{record.pk}/change/")
    assert page.status_code == 200 and b"5e1f00d1c0ffee01" in page.content
    assert admin_client.get("/admin/incidents/alert/add/").status_code == 403


def test_the_alert_list_costs_the_same_queries_however_many_alerts(
    post, running, personas, django_assert_num_queries
):
    viewer = personas["viewer"].client()
    post(payload(alert({"err_code": "79"})))
    viewer.get("/api/v1/alerts")  # the token's last use is written once a minute: not below
    queries = 5  # the token, its role, the count, the page, their incidents
    with django_assert_num_queries(queries):
        assert viewer.get("/api/v1/alerts").json()["count"] == 1
    fired = [
        alert({"Hostname": n}, fingerprint=f"{k:016x}") for k, n in enumerate(["n2", "n3"] * 3)
    ]
    fired = [dict(a, startsAt=f"2026-09-21T12:0{k}:00Z") for k, a in enumerate(fired)]
    post(payload(*fired))
    with django_assert_num_queries(queries):
        assert viewer.get("/api/v1/alerts").json()["count"] == 7


def test_a_setting_broken_in_the_admin_falls_back_to_its_default(post, running, caplog):
    from incidents.models import DetectorSetting

    DetectorSetting.objects.create(cluster=running.cluster, name="alerts.rules", value={"x": 1})
    post(payload(alert({"err_code": "79"})))
    assert Alert.objects.get().rule == "builtin:dcgm_xid"
    assert "alert setting alerts.rules of east is invalid" in caplog.text


def test_every_job_on_the_node_gets_its_incident_and_the_resolve_closes_each(post, running, ingest):
    share = [{"id": "s2", "job": "j3", "kind": "attempt_started", "ts": T0 + 1, "attempt": 1,
              "data": {"world_size": 4, "gpus_per_node": 4, "nodes": ["n1"]}}]  # fmt: skip
    assert ingest(share).status_code == 202
    r = post(payload(alert({"alertname": "GpuEccDoubleBitErrors"})))
    opened = incidents()
    assert sorted(i.job.key for i in opened) == ["j1", "j3"]
    assert r.json()["alerts"][0]["incidents"] == [i.pk for i in opened]
    post(payload(alert(status="resolved", ends=ENDS)))
    assert {i.state for i in incidents()} == {"resolved"}


def test_the_follow_up_passes_keep_the_incident_the_alert_opened(
    post, running, django_capture_on_commit_callbacks
):
    """The outbox's follow-up (the full detection pass, the ledger, recovery's
    proposal) runs after the webhook as after any ingest, and agrees with it."""
    with django_capture_on_commit_callbacks(execute=True) as sent:
        post(payload(alert({"alertname": "NodeDown", "Hostname": None, "instance": "n2:9100"})))
    assert sent  # the follow-up was asked for
    [incident] = incidents()
    assert (incident.fault_type, incident.cause, incident.state) == ("dead_node", "host", "open")
    assert incident.evidence == [Alert.objects.get().events[0]["event"]]
    with django_capture_on_commit_callbacks(execute=True):
        post(payload(alert(status="resolved", ends=ENDS)))
    incident.refresh_from_db()
    assert incident.state == "resolved"


def test_the_incident_page_shows_the_alert_on_its_timeline(post, running, personas):
    post(payload(alert({"err_code": "79"})))
    post(payload(alert(status="resolved", ends=ENDS)))
    [incident] = incidents()
    client = personas["viewer"].client()
    client.credentials()  # the page, as a signed-in viewer
    client.force_login(personas["viewer"].user)
    page = client.get(f"/incidents/{incident.pk}/")
    assert page.status_code == 200
    assert b"GpuXidError firing on n1" in page.content
    assert b"GpuXidError resolved on n1" in page.content
