"""A real Alertmanager (Debian's prometheus-alertmanager) routing to the live server's
webhook with an ingest token: an alert posted to Alertmanager opens the incident of the
job on its node, and resolving it there resolves the incident. And an HA pair's two
deliveries of one notification, at the same moment, count once."""

import subprocess
from datetime import UTC, datetime, timedelta

import pytest
import requests

from console.services import token_issue
from incidents.models import Alert, Incident
from tests.live import until
from tests.processes import _stop, free_port, need_program

pytestmark = [pytest.mark.engine_free, pytest.mark.django_db(transaction=True)]

AM = "prometheus-alertmanager"
CONFIG = """\
route:
  receiver: rebound
  group_by: [alertname, Hostname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: rebound
    webhook_configs:
      - url: {url}/api/v1/alerts/alertmanager?cluster=east
        send_resolved: true
        http_config:
          authorization:
            credentials_file: {token_file}
"""


@pytest.fixture
def alertmanager(tmp_path, live_server):
    """Alertmanager on a free port, its webhook to the live server with an ingest token
    of cluster east; yields its URL."""
    need_program(
        AM, "apt-get install prometheus-alertmanager", require="REBOUND_REQUIRE_MONITORING"
    )
    _, token = token_issue(scope="ingest", cluster_name="east")
    token_file = tmp_path / "rebound.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    config = tmp_path / "alertmanager.yml"
    config.write_text(CONFIG.format(url=live_server.url, token_file=token_file))
    port = free_port()
    process = subprocess.Popen(
        [
            AM,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready():
            assert process.poll() is None, process.communicate()[0]
            try:
                return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
            except requests.ConnectionError:
                return False

        until(ready, "Alertmanager to be ready", timeout_s=30)
        yield {"url": url, "token": token, "rebound": live_server.url}
    finally:
        log = _stop(process)
        print(log[-5000:])  # shown when the test fails


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def test_an_alert_through_a_real_alertmanager_opens_and_resolves_the_incident(alertmanager):
    now = datetime.now(UTC)
    t = now.timestamp()
    launch = [
        {"id": "s1", "job": "am-live", "kind": "attempt_started", "ts": t - 60, "attempt": 1,
         "data": {"world_size": 8, "gpus_per_node": 8, "nodes": ["gpu-07"]}},
        {"id": "t1", "job": "am-live", "kind": "step", "ts": t - 30, "attempt": 1,
         "data": {"step": 1}},
    ]  # fmt: skip
    r = requests.post(
        f"{alertmanager['rebound']}/api/v1/ingest",
        json={"events": launch},
        headers={"Authorization": f"Bearer {alertmanager['token']}"},
        timeout=10,
    )
    assert r.status_code == 202, r.text

    labels = {"alertname": "GpuXidError", "Hostname": "gpu-07", "err_code": "79", "gpu": "3"}
    fire = {
        "labels": labels,
        "annotations": {"summary": "Xid 79: GPU 3 fell off the bus"},
        "startsAt": iso(now),
        "endsAt": iso(now + timedelta(hours=1)),
    }
    r = requests.post(f"{alertmanager['url']}/api/v2/alerts", json=[fire], timeout=5)
    assert r.status_code == 200, r.text

    def opened():
        return Incident.objects.filter(job__key="am-live", fault_type="gpu_xid").first()

    incident = until(opened, "Rebound to open the incident from Alertmanager's webhook")
    assert (incident.xid, incident.cause, incident.state) == (79, "gpu", "open")
    assert [n.name for n in incident.nodes.all()] == ["gpu-07"]
    record = Alert.objects.get()
    assert (record.status, record.outcome, record.node.name) == ("firing", "incident", "gpu-07")

    resolve = {**fire, "endsAt": iso(datetime.now(UTC) - timedelta(seconds=1))}
    r = requests.post(f"{alertmanager['url']}/api/v2/alerts", json=[resolve], timeout=5)
    assert r.status_code == 200, r.text

    def resolved():
        incident.refresh_from_db()
        return incident.state == "resolved"

    until(resolved, "Rebound to resolve the incident when Alertmanager resolves the alert")
    record.refresh_from_db()
    assert record.status == "resolved" and record.starts_at == now  # the same alert
    change = incident.timeline.get(kind="state_change", data__to="resolved")
    assert change.actor == "alertmanager"
    assert [e.data["status"] for e in incident.timeline.filter(source="alertmanager")] == [
        "firing",
        "resolved",
    ]


@pytest.mark.postgres
def test_an_ha_pairs_two_deliveries_at_once_count_once(live_server):
    """Two Alertmanagers of an HA pair send each notification, at the same moment: the
    cluster's deliveries take turns, so the second is a repeat."""
    from concurrent.futures import ThreadPoolExecutor

    from jobs.models import Event

    _, token = token_issue(scope="ingest", cluster_name="east")
    auth = {"Authorization": f"Bearer {token}"}
    t = datetime.now(UTC).timestamp()
    launch = [{"id": "s1", "job": "ha", "kind": "attempt_started", "ts": t - 60, "attempt": 1,
               "data": {"world_size": 8, "gpus_per_node": 8, "nodes": ["gpu-01"]}}]  # fmt: skip
    r = requests.post(f"{live_server.url}/api/v1/ingest", json={"events": launch}, headers=auth)
    assert r.status_code == 202, r.text
    body = {
        "version": "4",
        "groupKey": "{}:{}",
        "status": "firing",
        "receiver": "rebound",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "GpuEccErrors", "Hostname": "gpu-01"},
                "annotations": {},
                "startsAt": iso(datetime.now(UTC)),
                "endsAt": "0001-01-01T00:00:00Z",
                "fingerprint": "00ff00ff00ff00ff",
            }
        ],
    }

    def deliver(_):
        url = f"{live_server.url}/api/v1/alerts/alertmanager"
        return requests.post(url, json=body, headers=auth, timeout=30)

    for _ in range(3):  # a few rounds: each a new alert, both deliveries at once
        body["alerts"][0]["fingerprint"] = f"{int(body['alerts'][0]['fingerprint'], 16) + 1:016x}"
        with ThreadPoolExecutor(2) as pool:
            answers = [r.json() for r in pool.map(deliver, range(2))]
        assert sorted((a["new"], a["repeats"]) for a in answers) == [(0, 1), (1, 0)], answers
    assert Alert.objects.count() == 3
    assert set(Alert.objects.values_list("receipts", flat=True)) == {2}
    assert Event.objects.filter(kind="fault").count() == 3
    assert Incident.objects.filter(job__key="ha").count() == 1  # one launch, one episode
