"""Never a 500: pages with names the wire refuses today but older rows may hold, bad
query parameters on every list and page, tokens without a user asking for HTML,
missing static files, and the one error shape under /api/ whatever went wrong."""

import json
import re
from datetime import timedelta
from html import unescape

import pytest
from django.test import Client
from django.utils import timezone

from console.services import token_issue
from incidents.models import Incident
from jobs.models import Cluster, Event, TrainingJob
from recovery.models import Action
from tests.factories import (
    ActionFactory,
    AttemptFactory,
    NodeFactory,
    TrainingJobFactory,
    incident_row,
)

pytestmark = pytest.mark.django_db

# Names stored before the wire checked them with \A...\Z, or by other paths (the
# admin, a shell): a trailing newline, a slash, characters a URL must escape.
ODD_JOBS = ["runnl\n", "team/run 1?#%"]
ODD_NODES = ["rack1/gpu-001", "gpu-002\n", "rack2/gpu-003/act", "gpu 004?#%"]


@pytest.fixture
def odd_rows(personas):
    east = Cluster.objects.get(name="east")
    now = timezone.now()
    nodes = [NodeFactory(cluster=east, name=n, last_heard_at=now) for n in ODD_NODES]
    jobs = []
    for key in ODD_JOBS:
        job = TrainingJobFactory(
            key=key, cluster=east, status=TrainingJob.Status.RUNNING, first_event_ts=1
        )
        attempt = AttemptFactory(job=job, number=1, world_size=8, started_at=now)
        attempt.nodes.set(nodes)
        jobs.append(job)
        incident = incident_row(job, nodes=nodes, fault_at=now - timedelta(minutes=5))
        for node in nodes:
            ActionFactory(
                kind=Action.Kind.CORDON_NODE,
                state=Action.State.AWAITING_APPROVAL,
                cluster=east,
                node=node,
                job=job,
                incident=incident,
                reason="odd names",
                requested_by="operator",
            )
    return {"jobs": jobs, "nodes": nodes}


def _links(html: str) -> set[str]:
    return {unescape(h) for h in re.findall(r'href="(/[^"]*)"', html)}


def test_every_page_renders_and_links_rows_with_any_stored_name(client, personas, odd_rows):
    client.force_login(personas["viewer"].user)
    incident = Incident.objects.filter(job__key=ODD_JOBS[0]).first()
    action = Action.objects.first()
    pages = [
        "/",
        "/jobs/",
        "/incidents/",
        f"/incidents/{incident.pk}/",
        "/approvals/",
        "/nodes/",
        "/nodes/?cluster=east",
        "/reliability/",
        "/maintenance/",
        f"/status.json?nodes=all&actions={action.pk}",
    ]
    found = set()
    for url in pages:
        r = client.get(url)
        assert r.status_code == 200, url
        found |= _links(r.content.decode())
    # Every job and node page is linked from the lists, and each link opens its row.
    for job in odd_rows["jobs"]:
        hrefs = {h for h in found if h.startswith("/jobs/") and h != "/jobs/"}
        opened = [h for h in hrefs if client.get(h).context.get("job") == job]
        assert opened, f"no working link to job {job.key!r} among {sorted(hrefs)}"
    for node in odd_rows["nodes"]:
        hrefs = {h for h in found if h.startswith("/nodes/east/")}
        opened = [h for h in hrefs if (client.get(h).context or {}).get("node") == node]
        assert opened, f"no working link to node {node.name!r} among {sorted(hrefs)}"
        r = client.get(opened[0])
        assert r.status_code == 200 and node.name in unescape(r.content.decode())


def test_a_node_named_like_another_nodes_action_url_keeps_both(client, personas, odd_rows):
    """`rack2/gpu-003/act` is a node; `rack2/gpu-003/act/` is also where the node
    `rack2/gpu-003` would be acted on: a GET shows the first, a POST acts on the second
    (which does not exist here)."""
    client.force_login(personas["operator"].user)
    r = client.get("/nodes/east/rack2/gpu-003/act/")
    assert r.status_code == 200 and r.context["node"].name == "rack2/gpu-003/act"
    r = client.post("/nodes/east/rack2/gpu-003/act/", {"kind": "cordon_node", "reason": "x"})
    assert r.status_code == 404


def test_an_operator_acts_on_a_node_with_a_slash_in_its_name(client, personas, odd_rows):
    client.force_login(personas["operator"].user)
    page = client.get("/nodes/east/rack1/gpu-001/").content.decode()
    action = re.search(r'action="(/nodes/[^"]+/act/)"', page).group(1)
    r = client.post(
        unescape(action),
        {"kind": "validate_node", "reason": "odd name"},
        HTTP_ACCEPT="application/json",
    )
    assert r.status_code == 200, r.content
    assert Action.objects.get(pk=r.json()["action"]).node.name == "rack1/gpu-001"


# --- query parameters ----------------------------------------------------------------

API_LISTS = [
    "/api/v1/jobs/",
    "/api/v1/incidents/",
    "/api/v1/nodes/",
    "/api/v1/actions/",
    "/api/v1/reliability",
    "/api/v1/detector-settings",
    "/api/v1/maintenance",
]
PAGES = [
    "/",
    "/jobs/",
    "/incidents/",
    "/approvals/",
    "/nodes/",
    "/reliability/",
    "/maintenance/",
    "/status.json",
]
NUL = "\x00"
BAD = {
    "cluster": NUL,
    "job": f"a{NUL}b",
    "node": NUL,
    "nodes": NUL,
    "state": NUL,
    "incident": "\u00b2",  # '²': str.isdigit() says yes, int() says no
    "actions": "\u00b2",
    "until": "9999-12-31",
    "since": "0001-01-01",
    "start": "9999-12-31T23:59:59+00:00",
    "end": "0001-01-01T00:00:00+00:00",
    "page": NUL,
    "attempt": "\u00b2",
}


@pytest.mark.parametrize("url", API_LISTS)
def test_bad_query_parameters_are_a_400_naming_them_on_the_api(personas, url):
    client = personas["admin"].client()
    for name, value in BAD.items():
        params = {name: value}
        if url.endswith("detector-settings") and name != "cluster":
            params["cluster"] = "east"
        r = client.get(url, params)
        assert r.status_code < 500, (url, name, r.content[:300])
        if r.status_code == 400:
            body = r.json()
            assert set(body) >= {"error", "detail"} and name in body["detail"], body
            assert body.get("field") == name, body


@pytest.mark.parametrize(
    "url,name",
    [
        ("/api/v1/jobs/", "cluster"),
        ("/api/v1/incidents/", "cluster"),
        ("/api/v1/incidents/", "job"),
        ("/api/v1/nodes/", "cluster"),
        ("/api/v1/actions/", "cluster"),
        ("/api/v1/actions/", "job"),
        ("/api/v1/actions/", "node"),
        ("/api/v1/actions/", "incident"),
        ("/api/v1/reliability", "cluster"),
        ("/api/v1/reliability", "start"),
        ("/api/v1/reliability", "end"),
        ("/api/v1/incidents/", "until"),
        ("/api/v1/incidents/", "since"),
        ("/api/v1/detector-settings", "cluster"),
    ],
)
def test_the_reported_parameters_are_refused_with_400(personas, url, name):
    r = personas["viewer"].client().get(url, {name: BAD[name]})
    assert r.status_code == 400, (url, name, r.content[:300])
    assert r.json()["field"] == name


@pytest.mark.parametrize("url", PAGES)
def test_bad_query_parameters_never_break_a_page(client, personas, url):
    client.force_login(personas["viewer"].user)
    for name, value in BAD.items():
        r = client.get(url, {name: value})
        assert r.status_code in (200, 400), (url, name, r.status_code)
        if r.status_code == 400:
            assert name in r.content.decode()


@pytest.mark.parametrize(
    "url,params",
    [
        ("/nodes/", {"cluster": NUL}),
        ("/status.json", {"nodes": NUL}),
        ("/status.json", {"actions": "\u00b2"}),
        ("/incidents/", {"until": "9999-12-31"}),
        ("/reliability/", {"until": "9999-12-31"}),
        ("/reliability/", {"until": "0001-01-01"}),
    ],
)
def test_the_reported_page_parameters_are_answered(client, personas, url, params):
    client.force_login(personas["viewer"].user)
    r = client.get(url, params)
    (name,) = params
    if r.status_code == 200:  # a form's filter: ignored, and the page says why
        assert "field-error" in r.content.decode() and r.context["form"].has_error(name)
    else:
        assert r.status_code == 400 and name in r.content.decode()


# --- tokens without a user ---------------------------------------------------------


@pytest.fixture
def bare_viewer(db):
    """A viewer token without a user, as `manage.py issue_token --scope viewer` makes."""
    return token_issue(scope="viewer")[1]


@pytest.mark.parametrize("url", API_LISTS[:-1] + ["/api/v1/schema", "/api/v1/docs"])
@pytest.mark.parametrize("how", [{"HTTP_ACCEPT": "text/html"}, {"QUERY_STRING": "format=api"}])
def test_a_token_without_a_user_never_gets_a_500(bare_viewer, url, how):
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {bare_viewer}")
    r = client.get(url, **how)
    assert r.status_code < 500, (url, how, r.content[:300])
    if url != "/api/v1/docs" and r.status_code >= 400:
        assert set(r.json()) >= {"error", "detail"}


def test_ingest_asking_for_html_stores_nothing_or_answers_its_count(personas):
    """The answer is decided before anything is stored: either the batch is refused
    (406, nothing stored) or it is stored and answered."""
    _, raw = token_issue(scope="ingest", cluster_name="east")
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = {"events": [{"id": "h1", "job": "html", "kind": "heartbeat", "ts": 1.8e9, "node": "n1"}]}
    r = client.post(
        "/api/v1/ingest", json.dumps(body), content_type="application/json", HTTP_ACCEPT="text/html"
    )
    stored = Event.objects.filter(job__key="html").count()
    assert (r.status_code, stored) in ((406, 0), (202, 1), (200, 1)), (r.status_code, stored)
    assert set(r.json()) >= ({"error", "detail"} if r.status_code == 406 else {"accepted"})


def test_the_console_shows_a_token_principal_its_scope(bare_viewer):
    """Swagger UI is a page: it renders with the header's context for a token's scope."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {bare_viewer}")
    assert client.get("/api/v1/docs").status_code == 200


# --- static files -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/static/nonexistent.js", "/static/vendor/nope.js"])
def test_a_missing_static_file_is_a_404(settings, path):
    settings.DEBUG = True  # WhiteNoise asks the finders (read when the client starts)
    r = Client(raise_request_exception=False).get(path)
    assert r.status_code == 404


# --- the one error shape under /api/ ----------------------------------------------


def _shape(r, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.content[:300])
    assert r["Content-Type"].startswith("application/json"), r["Content-Type"]
    body = r.json()
    assert isinstance(body.get("error"), str) and isinstance(body.get("detail"), str), body
    return body


@pytest.mark.parametrize("debug", [True, False])
def test_api_errors_have_one_shape(settings, personas, debug):
    settings.DEBUG = debug
    viewer = Client(raise_request_exception=False)
    viewer.force_login(personas["viewer"].user)
    token = {"HTTP_AUTHORIZATION": f"Bearer {personas['viewer'].token}"}
    anon = Client(raise_request_exception=False)
    assert _shape(anon.get("/api/v1/nope"), 404)["error"] == "not_found"
    assert _shape(anon.get("/api/nope/"), 404)["error"] == "not_found"
    assert "/api/v1/jobs/" in _shape(anon.post("/api/v1/jobs"), 404)["detail"]
    _shape(anon.get("/api/v1/jobs/"), 401)
    _shape(anon.get("/api/v1/jobs/", **token, HTTP_ACCEPT="text/html"), 406)
    assert "json" in _shape(anon.get("/api/v1/jobs/?format=api", **token), 406)["detail"]
    _shape(anon.delete("/api/v1/jobs/", **token), 403)  # a viewer may not write
    _shape(viewer.put("/api/v1/incidents/", **token), 403)
    _shape(anon.get("/api/v1/jobs/nope/", **token), 404)
    _shape(anon.post("/api/v1/ingest", "{", content_type="application/json", **token), 403)
    # A session without its CSRF token
    csrf = Client(enforce_csrf_checks=True, raise_request_exception=False)
    csrf.force_login(personas["operator"].user)
    body = _shape(csrf.post("/api/v1/actions/", {}, content_type="application/json"), 403)
    assert "CSRF" in body["detail"]
    # Refused by Django before any view: a host it does not serve
    _shape(anon.get("/api/v1/jobs/", **token, HTTP_HOST="elsewhere.example"), 400)
    # A method the view does not have
    admin = {"HTTP_AUTHORIZATION": f"Bearer {personas['admin'].token}"}
    _shape(anon.delete("/api/v1/jobs/", **admin), 405)


def test_an_unexpected_api_error_is_a_500_in_the_shape(settings, personas, monkeypatch):
    """A bug in a view (here: a selector that raises) answers JSON, not a page."""
    from jobs import selectors

    def broken(**kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(selectors, "job_list", broken)
    for debug in (True, False):
        settings.DEBUG = debug
        client = personas["viewer"].client()
        client.raise_request_exception = False
        assert _shape(client.get("/api/v1/jobs/"), 500)["error"] == "server_error"


def test_pages_keep_their_html_errors(client, personas):
    client.force_login(personas["viewer"].user)
    r = client.get("/jobs/no-such-job/")
    assert r.status_code == 404 and not r["Content-Type"].startswith("application/json")


def test_a_nul_in_a_pages_form_is_a_400_naming_the_field(client, personas, odd_rows):
    """Forms read without a Django form field (an approval's comment, a node action's
    reason) would carry a NUL to PostgreSQL, which refuses it (a 500)."""
    client.force_login(personas["operator"].user)
    action = Action.objects.filter(state=Action.State.AWAITING_APPROVAL).first()
    posts = [
        (f"/approvals/{action.pk}/decide", {"decision": "reject", "comment": f"no{NUL}"}),
        ("/nodes/east/rack1/gpu-001/act/", {"kind": "validate_node", "reason": f"x{NUL}y"}),
    ]
    for url, form in posts:
        r = client.post(url, form)
        assert r.status_code == 400, (url, r.status_code)
        name = next(k for k, v in form.items() if NUL in v)
        assert name in r.content.decode()
    action.refresh_from_db()
    assert action.state == Action.State.AWAITING_APPROVAL
    assert not Action.objects.filter(kind=Action.Kind.VALIDATE_NODE).exists()
