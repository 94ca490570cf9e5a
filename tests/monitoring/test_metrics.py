"""GET /metrics: the text format parses, its figures are the database's (a known job's
ledger, the worked example's incidents), who may read it, a bounded number of queries,
and a broker or a cache that is away leaving their metrics out without failing it."""

import ipaddress
import json
import uuid
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from common.models import OutboxEntry
from console.metrics import refusals
from console.metrics.collector import TIME_BUCKETS_S, forget_totals, snapshot_totals
from console.services import token_issue, user_set_role
from incidents.models import Incident
from jobs.models import LedgerSnapshot, TrainingJob
from recovery.models import Action
from tests.factories import ActionFactory, IncidentFactory, TrainingJobFactory, UserFactory
from tests.monitoring.metrics import families, sample_job, scrape, value
from tests.processes import free_port

pytestmark = pytest.mark.django_db

BAD = ("startup", "checkpoint_restore", "checkpoint_save", "wasted_progress", "stalled")


def viewer(personas) -> APIClient:
    return personas["viewer"].client()


# --- the figures ---------------------------------------------------------------------


def test_the_text_format_parses_and_names_every_family(personas):
    fams = families(scrape(viewer(personas)))
    for name in (
        "rebound_jobs",
        "rebound_ingest_events",
        "rebound_job_goodput_seconds",
        "rebound_job_badput_seconds",
        "rebound_incidents_open",
        "rebound_incident_lost_gpu_seconds",
        "rebound_incident_time_to_detect_seconds",
        "rebound_incident_time_to_resume_seconds",
        "rebound_incident_time_to_recover_seconds",
        "rebound_actions",
        "rebound_actions_finished",
        "rebound_approvals_waiting",
        "rebound_outbox_due",
        "rebound_outbox_oldest_due_age_seconds",
        "rebound_scrape_errors",
        "rebound_ingest_refused_requests",
    ):
        assert name in fams, name
    assert fams["rebound_ingest_events"].type == "counter"
    assert fams["rebound_incident_time_to_detect_seconds"].type == "histogram"


def test_a_jobs_goodput_and_badput_are_its_ledgers(personas, ingest, sample):
    _, expected = sample
    job = sample_job(ingest, sample)
    fams = families(scrape(viewer(personas)))
    at = {"job_key": "sample-small", "cluster": job.cluster.name}
    categories, gpu = expected["categories"], expected["gpu_categories"]
    assert value(fams, "rebound_job_goodput_seconds", **at) == pytest.approx(
        categories["productive"]
    )
    assert value(fams, "rebound_job_goodput_gpu_seconds", **at) == pytest.approx(gpu["productive"])
    for category in (*BAD, "downtime", "other"):
        assert value(fams, "rebound_job_badput_seconds", **at, category=category) == pytest.approx(
            categories[category]
        ), category
        assert value(
            fams, "rebound_job_badput_gpu_seconds", **at, category=category
        ) == pytest.approx(gpu[category])
    assert value(fams, "rebound_job_badput_seconds", **at, category="productive") is None
    assert value(fams, "rebound_job_elapsed_seconds", **at) == pytest.approx(expected["elapsed_s"])
    assert value(fams, "rebound_job_elapsed_gpu_seconds", **at) == pytest.approx(sum(gpu.values()))
    assert value(fams, "rebound_job_slowdown_seconds", **at) == pytest.approx(
        expected["slowdown_s"], abs=1e-4
    )
    assert value(fams, "rebound_ingest_events_total", cluster=job.cluster.name) == len(sample[0])


def test_incident_histograms_lost_compute_and_open_counts(personas, ingest, sample):
    """The worked example's three incidents, recovered: their times land in the buckets
    a per-incident count gives, and their lost compute is summed by cause."""
    _, expected = sample
    job = sample_job(ingest, sample)
    incidents = list(Incident.objects.filter(job=job))
    assert len(incidents) == len(expected["incidents"])
    cluster = job.cluster.name
    fams = families(scrape(viewer(personas)))
    for name, of in (
        ("detect", lambda i: i.time_to_detect_s),
        ("resume", lambda i: i.time_to_resume_s),
        ("recover", lambda i: i.time_to_recover_s),
    ):
        times = [of(i) for i in incidents if of(i) is not None]
        metric = f"rebound_incident_time_to_{name}_seconds"
        assert value(fams, f"{metric}_count", cluster=cluster) == len(times)
        assert value(fams, f"{metric}_sum", cluster=cluster) == pytest.approx(sum(times))
        for bound in TIME_BUCKETS_S:
            assert value(fams, f"{metric}_bucket", cluster=cluster, le=f"{float(bound)}") == sum(
                t <= bound for t in times
            ), (name, bound)
    expected_recover = sorted(i["time_to_recover_s"] for i in expected["incidents"])
    assert sorted(i.time_to_recover_s for i in incidents) == pytest.approx(expected_recover)
    lost = {}
    for i in incidents:
        lost[i.cause] = lost.get(i.cause, 0.0) + i.lost_gpu_seconds
    for cause, seconds in lost.items():
        got = value(fams, "rebound_incident_lost_gpu_seconds_total", cluster=cluster, cause=cause)
        assert got == pytest.approx(seconds)
    # Recovered, so none open; one opened by hand is counted by cluster, cause, severity.
    assert value(fams, "rebound_incidents_open", cluster=cluster) is None
    IncidentFactory(job=job, cluster=job.cluster, cause="network", severity="critical")
    fams = families(scrape(viewer(personas)))
    assert (
        value(fams, "rebound_incidents_open", cluster=cluster, cause="network", severity="critical")
        == 1
    )


def test_actions_approvals_and_the_outbox(personas):
    now = timezone.now()
    old = ActionFactory(state=Action.State.AWAITING_APPROVAL)
    Action.objects.filter(pk=old.pk).update(created_at=now - timedelta(minutes=20))
    ActionFactory(state=Action.State.AWAITING_APPROVAL, cluster=old.cluster)
    ActionFactory(state=Action.State.SUCCEEDED, cluster=old.cluster, kind="restart_job")
    OutboxEntry.objects.create(task="t", key="1", due_at=now - timedelta(seconds=90), retry_at=now)
    OutboxEntry.objects.create(task="t", key="2", due_at=now + timedelta(hours=1), retry_at=now)
    fams = families(scrape(viewer(personas)))
    cluster = old.cluster.name
    assert value(fams, "rebound_approvals_waiting", cluster=cluster) == 2
    age = value(fams, "rebound_approvals_oldest_age_seconds", cluster=cluster)
    assert 20 * 60 <= age < 21 * 60
    assert (
        value(fams, "rebound_actions", cluster=cluster, kind=old.kind, state="awaiting_approval")
        >= 1
    )
    assert (
        value(
            fams,
            "rebound_actions_finished_total",
            cluster=cluster,
            kind="restart_job",
            state="succeeded",
        )
        == 1
    )
    assert value(fams, "rebound_actions", state="succeeded") is None  # a counter, not a gauge
    assert value(fams, "rebound_outbox_due") == 1
    assert 90 <= value(fams, "rebound_outbox_oldest_due_age_seconds") < 150


def test_only_recent_jobs_have_ledger_series(personas, settings):
    """Running jobs, and others heard from within the horizon; an old one is left out."""
    settings.REBOUND_METRICS_JOB_HORIZON_S = 3600
    now = timezone.now()
    figures = {"elapsed_s": 10.0, "categories": {"productive": 7.0}, "gpu_seconds": {}}
    jobs = {
        "running-old": TrainingJobFactory(status="running", last_received_at=now - timedelta(1)),
        "done-recent": TrainingJobFactory(status="completed", last_received_at=now),
        "done-old": TrainingJobFactory(
            status="completed",
            last_received_at=now - timedelta(hours=2),
            finished_at=now - timedelta(hours=2),
        ),
    }
    for key, job in jobs.items():
        TrainingJob.objects.filter(pk=job.pk).update(key=key)
        LedgerSnapshot.objects.create(job=job, revision=0, figures=figures)
    fams = families(scrape(viewer(personas)))
    assert value(fams, "rebound_job_goodput_seconds", job_key="running-old") == 7.0
    assert value(fams, "rebound_job_goodput_seconds", job_key="done-recent") == 7.0
    assert value(fams, "rebound_job_goodput_seconds", job_key="done-old") is None


# --- ingest refusals -------------------------------------------------------------------


def test_ingest_refusals_are_counted_by_reason(personas, ingest):
    def refused(fams, reason):
        return value(fams, "rebound_ingest_refused_requests_total", reason=reason)

    before = families(scrape(viewer(personas)))
    bad_event = {"id": "x", "job": "j", "kind": "no-such-kind", "ts": 1.0, "attempt": 1}
    assert ingest([bad_event]).status_code == 400
    assert ingest([bad_event]).status_code == 400
    body = APIClient().post("/api/v1/ingest", data="{}", content_type="application/json")
    assert body.status_code == 401
    garbled = (
        personas["ingest"]
        .client()
        .post("/api/v1/ingest", data="not json", content_type="application/json")
    )
    assert garbled.status_code == 400
    viewer_post = viewer(personas).post(
        "/api/v1/ingest", data=json.dumps({"events": []}), content_type="application/json"
    )
    assert viewer_post.status_code == 403
    after = families(scrape(viewer(personas)))
    assert refused(after, "invalid_events") - refused(before, "invalid_events") == 2
    assert refused(after, "not_authenticated") - refused(before, "not_authenticated") == 1
    assert refused(after, "invalid_body") - refused(before, "invalid_body") == 1
    assert refused(after, "permission_denied") - refused(before, "permission_denied") == 1
    # Another endpoint's refusal is not an ingest refusal.
    assert viewer(personas).get("/api/v1/jobs/nope").status_code == 404
    again = families(scrape(viewer(personas)))
    assert sum(s.value for s in again["rebound_ingest_refused_requests"].samples) == sum(
        s.value for s in after["rebound_ingest_refused_requests"].samples
    )


def test_unknown_codes_count_as_other():
    assert refusals.reason_of(b'{"error": "something_new"}') == "other"
    assert refusals.reason_of(b"<html>") == "other"
    assert refusals.reason_of(b'{"error": "invalid_events"}') == "invalid_events"


def test_the_cache_away_leaves_the_refusals_out_and_ingest_answers(settings, personas, ingest):
    settings.CACHES = {
        "default": {
            "BACKEND": "common.cache.FailSoftRedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
    assert ingest([{"id": "x"}]).status_code == 400  # counted nowhere, still answered
    fams = families(scrape(viewer(personas)))
    assert fams["rebound_ingest_refused_requests"].samples == []  # not zeros: no reset
    assert value(fams, "rebound_scrape_errors", source="cache") == 1
    assert value(fams, "rebound_scrape_errors", source="broker") in (0, None)


# --- the broker ------------------------------------------------------------------------


def test_the_broker_away_does_not_fail_the_scrape(settings, personas):
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"
    fams = families(scrape(viewer(personas)))
    assert fams["rebound_celery_queue_length"].samples == []
    assert value(fams, "rebound_scrape_errors", source="broker") == 1
    assert "rebound_jobs" in fams  # the database's figures are all there


@pytest.mark.skipif(not django_settings.REDIS_URL, reason="the Redis broker (set REDIS_URL)")
def test_queue_lengths_on_a_redis_broker(settings, personas):
    import redis

    prefix = f"test-metrics-{uuid.uuid4().hex[:8]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = prefix
    client = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    detect = f"{prefix}.detect"
    try:
        client.lpush(detect, "a", "b", "c")
        client.lpush(detect + "\x06\x163", "d")  # kombu's list of priority 3
        client.lpush(prefix, "e")
        fams = families(scrape(viewer(personas)))
    finally:
        client.delete(detect, detect + "\x06\x163", prefix)
    assert value(fams, "rebound_celery_queue_length", queue=detect) == 4
    assert value(fams, "rebound_celery_queue_length", queue=prefix) == 1
    assert value(fams, "rebound_celery_queue_length", queue=f"{prefix}.recovery") == 0
    assert value(fams, "rebound_scrape_errors", source="broker") == 0


# --- cost ------------------------------------------------------------------------------


def _queries(client) -> int:
    with CaptureQueriesContext(connection) as queries:
        scrape(client)
    return len(queries)


def _fresh_queries(client) -> int:
    forget_totals()
    return _queries(client)


def test_the_query_count_is_bounded_whatever_the_events_jobs_and_incidents(
    personas, ingest, sample
):
    client = viewer(personas)
    scrape(client)  # the token's last_used_at is written at most once a minute
    fresh = _fresh_queries(client)  # the totals read anew
    cached = _queries(client)  # the totals from the snapshot
    assert cached <= 7 and fresh == cached + 3
    sample_job(ingest, sample)  # events, steps, a ledger, incidents
    for _ in range(5):
        job = TrainingJobFactory(status="running")
        LedgerSnapshot.objects.create(job=job, revision=0, figures={"categories": {}})
        IncidentFactory(job=job, cluster=job.cluster)
        ActionFactory(job=job, cluster=job.cluster)
    assert _fresh_queries(client) == fresh
    assert _queries(client) == cached


def test_the_totals_are_read_at_most_once_a_max_age(settings, personas):
    """Lost compute and finished actions come from the snapshot until it is max age old;
    open incidents and waiting approvals are live at every scrape; 0 reads at each."""
    settings.REBOUND_METRICS_TOTALS_MAX_AGE_S = 60
    job = TrainingJobFactory(status="running")
    at = {"cluster": job.cluster.name, "cause": "network"}
    IncidentFactory(job=job, cluster=job.cluster, cause="network", lost_gpu_seconds=100.0)
    client = viewer(personas)
    assert value(families(scrape(client)), "rebound_incident_lost_gpu_seconds_total", **at) == 100
    IncidentFactory(
        job=job, cluster=job.cluster, cause="network", severity="critical", lost_gpu_seconds=50.0
    )
    ActionFactory(job=job, cluster=job.cluster, state=Action.State.AWAITING_APPROVAL)
    fams = families(scrape(client))
    assert value(fams, "rebound_incident_lost_gpu_seconds_total", **at) == 100  # the snapshot
    assert value(fams, "rebound_incidents_open", severity="critical", **at) == 1  # live
    assert value(fams, "rebound_approvals_waiting", cluster=job.cluster.name) == 1  # live

    now = timezone.now()
    assert snapshot_totals(now + timedelta(seconds=30))["lost"] == [(*at.values(), 100.0)]
    assert snapshot_totals(now + timedelta(seconds=61))["lost"] == [(*at.values(), 150.0)]
    IncidentFactory(job=job, cluster=job.cluster, cause="network", lost_gpu_seconds=25.0)
    settings.REBOUND_METRICS_TOTALS_MAX_AGE_S = 0
    fams = families(scrape(client))
    assert value(fams, "rebound_incident_lost_gpu_seconds_total", **at) == 175


# --- who may read it -------------------------------------------------------------------


def _refusal(response, status, code):
    assert response.status_code == status, response.content
    body = json.loads(response.content)
    assert body["error"] == code and body["detail"]
    return response


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin", "ingest"])
def test_any_api_token_may_scrape(personas, persona):
    scrape(personas[persona].client())


def test_a_user_signed_in_with_a_role_may_read_it(personas, client):
    client.force_login(personas["viewer"].user)
    scrape(client)
    client.force_login(personas["outsider"].user)
    _refusal(client.get("/metrics"), 403, "permission_denied")


def test_no_credentials_is_401_in_the_api_shape(client):
    response = _refusal(client.get("/metrics"), 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header",
    [
        "Bearer not-a-token",
        "Bearer",
        "Bearer a b",
        "Basic dXNlcjpwYXNz",
        "Bearer \u00ff\u00fe",
        "bearer " + "x" * 5000,
    ],
)
def test_bad_credentials_are_401(client, db, header):
    response = client.get("/metrics", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401, response.content
    assert json.loads(response.content)["error"] in ("authentication_failed", "not_authenticated")


def test_a_revoked_token_and_a_token_whose_user_lost_its_role(client, db):
    token, raw = token_issue(scope="viewer", name="revoked")
    token.revoked_at = timezone.now()
    token.save()
    _refusal(
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {raw}"), 401, "authentication_failed"
    )
    user = UserFactory(username="demoted", role="viewer")
    _, raw = token_issue(scope="viewer", username="demoted")
    user_set_role(user=user, role=None)
    _refusal(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {raw}"), 403, "permission_denied")


def test_the_dedicated_metrics_token(settings, client, db):
    settings.REBOUND_METRICS_TOKEN = "s3cret-scraper-token"
    scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-scraper-token")
    _refusal(
        client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scraper-tokeN"),
        401,
        "authentication_failed",
    )


def test_allowed_addresses_need_no_token(settings, client, db):
    settings.REBOUND_METRICS_ALLOW_FROM = [ipaddress.ip_network("10.1.0.0/16")]
    scrape(client, REMOTE_ADDR="10.1.2.3")
    _refusal(client.get("/metrics", REMOTE_ADDR="10.2.0.1"), 401, "not_authenticated")
    _refusal(client.get("/metrics", REMOTE_ADDR="not-an-address"), 401, "not_authenticated")
    settings.REBOUND_METRICS_ALLOW_FROM = [ipaddress.ip_network("::1/128")]
    scrape(client, REMOTE_ADDR="::1")
    # Behind a proxy, the address is the client it forwarded for, not the proxy's.
    settings.REBOUND_TRUSTED_PROXIES = 1
    settings.REBOUND_METRICS_ALLOW_FROM = [ipaddress.ip_network("10.1.0.0/16")]
    scrape(client, REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="10.1.9.9")
    _refusal(
        client.get("/metrics", REMOTE_ADDR="10.1.0.5", HTTP_X_FORWARDED_FOR="192.0.2.1"),
        401,
        "not_authenticated",
    )


def test_only_get_and_head(personas):
    response = _refusal(viewer(personas).post("/metrics"), 405, "method_not_allowed")
    assert response["Allow"] == "GET, HEAD"
    assert viewer(personas).head("/metrics").status_code == 200
    assert APIClient().head("/metrics").status_code == 401  # a HEAD answer has no body


def test_the_allow_from_setting_refuses_what_is_not_a_network():
    import subprocess
    import sys

    from tests.processes import ROOT

    env = {"REBOUND_METRICS_ALLOW_FROM": "10.0.0.0/8,not-a-network", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "console.settings", "REBOUND_VAR_DIR": "/tmp"},
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "REBOUND_METRICS_ALLOW_FROM must be comma-separated CIDRs" in out.stderr


def test_the_database_away_is_a_503_prometheus_sees_as_down(personas, monkeypatch):
    from django.db import OperationalError

    from console.metrics.collector import ReboundCollector

    def away(self):
        raise OperationalError("connection refused")
        yield  # a generator, as collect is

    monkeypatch.setattr(ReboundCollector, "collect", away)
    response = viewer(personas).get("/metrics")
    assert response.status_code == 503
    assert response["Retry-After"]
