"""The detector settings API: defaults, cluster and job overrides, validation, roles,
the audit trail, and a change taking effect on the next detection pass."""

import json
import logging

import pytest
from rest_framework.test import APIClient

from incidents.models import DetectorSetting, Incident
from incidents.settings import DEFAULTS, DESCRIPTIONS, INTEGERS, detector_settings
from jobs.models import Cluster, TrainingJob
from tests.incidents.conftest import detect

pytestmark = pytest.mark.django_db

URL = "/api/v1/detector-settings"


@pytest.fixture
def jobs(personas):
    """j1 on cluster east, w1 on cluster west (both made by the personas' tokens)."""
    east, west = Cluster.objects.get(name="east"), Cluster.objects.get(name="west")
    j1 = TrainingJob.objects.create(key="j1", cluster=east)
    return j1, TrainingJob.objects.create(key="w1", cluster=west)


def patch(personas, body, persona="operator"):
    return personas[persona].client().patch(URL, body, format="json")


def by_name(response) -> dict[str, dict]:
    assert response.status_code == 200, response.content
    return {item["name"]: item for item in response.json()}


def get(personas, persona="viewer", **params):
    return personas[persona].client().get(URL, params)


# --- reading ----------------------------------------------------------------------


def test_every_parameter_is_listed_with_its_default(personas, jobs):
    r = get(personas, cluster="east")
    assert r.status_code == 200
    items = r.json()
    assert [i["name"] for i in items] == list(DEFAULTS)
    for item in items:
        assert item == {
            "name": item["name"],
            "description": DESCRIPTIONS[item["name"]],
            "default": DEFAULTS[item["name"]],
            "cluster_value": None,
            "job_value": None,
            "value": DEFAULTS[item["name"]],
            "updated_at": None,
            "updated_by": None,
        }
        assert item["description"]
    assert type(by_name(r)["hang.factor"]["value"]) is int  # counts are not turned into floats


def test_every_parameter_has_a_description_and_the_rules_name_only_parameters():
    assert set(DESCRIPTIONS) == set(DEFAULTS)
    assert set(DEFAULTS) >= INTEGERS
    assert all(len(d) <= 100 for d in DESCRIPTIONS.values())  # one line


def test_the_listing_takes_a_fixed_number_of_queries(personas, jobs, django_assert_max_num_queries):
    patch(personas, {"cluster": "east", "values": {"hang.factor": 4, "loss.window": 20}})
    patch(personas, {"cluster": "east", "job": "j1", "values": {"hang.factor": 3}})
    client = personas["viewer"].client()
    with django_assert_max_num_queries(8):
        assert client.get(URL, {"cluster": "east", "job": "j1"}).status_code == 200


# --- writing ----------------------------------------------------------------------


def test_operators_set_a_cluster_override(personas, jobs):
    r = patch(personas, {"cluster": "east", "values": {"hang.factor": 4}})
    item = by_name(r)["hang.factor"]
    assert (item["cluster_value"], item["job_value"], item["value"]) == (4, None, 4)
    assert item["updated_by"] == "operator" and item["updated_at"]
    row = DetectorSetting.objects.get()
    assert (row.cluster.name, row.job, row.value, row.updated_by) == ("east", None, 4, "operator")
    # Viewers see it, on that cluster's jobs too; the other cluster keeps the default.
    assert by_name(get(personas, cluster="east"))["hang.factor"]["value"] == 4
    on_job = by_name(get(personas, cluster="east", job="j1"))["hang.factor"]
    assert (on_job["cluster_value"], on_job["job_value"], on_job["value"]) == (4, None, 4)
    assert by_name(get(personas, cluster="west"))["hang.factor"]["value"] == DEFAULTS["hang.factor"]
    assert detector_settings(jobs[0])["hang.factor"] == 4


def test_a_job_override_wins_over_the_cluster(personas, jobs):
    patch(personas, {"cluster": "east", "values": {"hang.factor": 4, "loss.min_rel": 0.5}})
    r = patch(personas, {"cluster": "east", "job": "j1", "values": {"hang.factor": 3}}, "admin")
    items = by_name(r)
    job_row = DetectorSetting.objects.get(job=jobs[0])
    assert items["hang.factor"] == {
        "name": "hang.factor",
        "description": DESCRIPTIONS["hang.factor"],
        "default": 5,
        "cluster_value": 4,
        "job_value": 3,
        "value": 3,
        "updated_at": job_row.updated_at.isoformat().replace("+00:00", "Z"),  # the job's
        "updated_by": "admin",
    }
    assert items["loss.min_rel"]["value"] == 0.5
    assert items["loss.min_rel"]["updated_by"] == "operator"  # the cluster's, in force
    # The cluster's own listing is unchanged; the job's row is the job's alone.
    assert by_name(get(personas, cluster="east"))["hang.factor"]["value"] == 4
    assert job_row.name == "hang.factor"
    # The table says what the detectors read.
    in_force = detector_settings(jobs[0])
    assert {n: i["value"] for n, i in items.items()} == in_force


def test_null_removes_an_override(personas, jobs):
    patch(personas, {"cluster": "east", "values": {"hang.factor": 4, "hang.floor_s": 90}})
    patch(personas, {"cluster": "east", "job": "j1", "values": {"hang.factor": 3}})

    r = patch(personas, {"cluster": "east", "job": "j1", "values": {"hang.factor": None}})
    item = by_name(r)["hang.factor"]
    assert (item["cluster_value"], item["job_value"], item["value"]) == (4, None, 4)

    r = patch(personas, {"cluster": "east", "values": {"hang.factor": None}})
    item = by_name(r)["hang.factor"]
    assert (item["cluster_value"], item["value"], item["updated_at"]) == (None, 5, None)
    assert list(DetectorSetting.objects.values_list("name", flat=True)) == ["hang.floor_s"]
    # Removing what is not there is fine and changes nothing.
    assert patch(personas, {"cluster": "east", "values": {"loss.window": None}}).status_code == 200
    assert DetectorSetting.objects.count() == 1


def test_counts_given_as_whole_floats_are_stored_as_integers(personas, jobs):
    r = patch(personas, {"cluster": "east", "values": {"straggler.windows": 4.0}})
    assert by_name(r)["straggler.windows"]["value"] == 4
    assert type(DetectorSetting.objects.get().value) is int


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("hang.smoothing", 1),
        ("hang.smoothing", 0.01),
        ("loss.min_rel", 0.05),
        ("hang.floor_s", 1e9),
    ],
)
def test_values_at_the_edges_are_accepted(personas, jobs, name, value):
    r = patch(personas, {"cluster": "east", "values": {name: value}})
    assert by_name(r)[name]["value"] == value


def test_each_change_is_audited_with_who_what_from_and_to(
    personas, jobs, caplog, django_capture_on_commit_callbacks
):
    def change(values, job=None, persona="operator"):
        body = {"cluster": "east", "values": values} | ({"job": job} if job else {})
        caplog.clear()
        with django_capture_on_commit_callbacks(execute=True):
            assert patch(personas, body, persona).status_code == 200
        return [r.getMessage() for r in caplog.records if r.name == "rebound.audit"]

    caplog.set_level(logging.INFO, logger="rebound.audit")
    assert change({"hang.factor": 4, "loss.window": 20}) == [
        "detector setting hang.factor for cluster east changed from unset to 4 by operator",
        "detector setting loss.window for cluster east changed from unset to 20 by operator",
    ]
    assert change({"hang.factor": 6}, persona="admin") == [
        "detector setting hang.factor for cluster east changed from 4 to 6 by admin"
    ]
    assert DetectorSetting.objects.get(name="hang.factor").updated_by == "admin"
    assert change({"hang.factor": 6}) == []  # the same value: no change, no entry
    assert DetectorSetting.objects.get(name="hang.factor").updated_by == "admin"
    assert change({"hang.factor": 2}, job="j1") == [
        "detector setting hang.factor for job j1 changed from unset to 2 by operator"
    ]
    assert change({"loss.window": None}) == [
        "detector setting loss.window for cluster east changed from 20 to unset by operator"
    ]
    record = next(r for r in caplog.records if r.name == "rebound.audit")
    assert (record.setting, record.scope, record.old, record.new, record.actor) == (
        "loss.window",
        "cluster east",
        20,
        None,
        "operator",
    )


# --- validation -------------------------------------------------------------------

NOT_A_NUMBER = "must be a number (or null to remove the override)"


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("hang.factorr", 4, "unknown parameter"),
        ("hang.factor", "4", NOT_A_NUMBER),
        ("hang.factor", True, NOT_A_NUMBER),
        ("hang.factor", False, NOT_A_NUMBER),
        ("hang.factor", [4], NOT_A_NUMBER),
        ("hang.factor", {"v": 4}, NOT_A_NUMBER),
        ("hang.factor", 0, "must be greater than 0"),
        ("hang.floor_s", -60, "must be greater than 0"),
        ("loss.min_rel", 0.0, "must be greater than 0"),
        ("hang.smoothing", 0, "must be greater than 0"),
        ("hang.smoothing", 1.5, "must be greater than 0 and at most 1"),
        ("dead_node.timeout_s", 10**400, "must be at most 1000000000"),
        ("crash_loop.launches", -2, "must be greater than 0"),
        ("hang.skip_steps", -1, "must be at least 0"),
        ("hang.save_allowance_s", -5, "must be at least 0"),
        *[(name, 2.5, "must be a whole number") for name in sorted(INTEGERS)],
    ],
)
def test_an_invalid_value_is_named_and_nothing_is_written(personas, jobs, name, value, reason):
    r = patch(personas, {"cluster": "east", "values": {name: value}})
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["error"] == "invalid_settings"
    assert body["errors"] == [{"name": name, "reason": reason}]
    assert "nothing was changed" in body["detail"]
    assert not DetectorSetting.objects.exists()


def test_skipping_nothing_and_no_save_allowance_are_allowed(personas, jobs):
    values = {"hang.skip_steps": 0, "loss.warmup_steps": 0, "hang.save_allowance_s": 0}
    r = patch(personas, {"cluster": "east", "values": values})
    assert r.status_code == 200, r.content
    assert {i["name"]: i["value"] for i in r.json() if i["name"] in values} == values


def test_one_bad_value_of_several_rejects_them_all(personas, jobs):
    patch(personas, {"cluster": "east", "values": {"hang.factor": 4, "loss.window": 20}})
    before = list(DetectorSetting.objects.values_list("name", "value", "updated_at"))
    body = {
        "cluster": "east",
        "values": {
            "hang.factor": 6,  # fine
            "loss.window": None,  # fine
            "hang.floor_s": 120,  # fine
            "straggler.windows": 0,
            "gremlins": 1,
        },
    }
    r = patch(personas, body)
    assert r.status_code == 400
    assert r.json()["errors"] == [
        {"name": "straggler.windows", "reason": "must be greater than 0"},
        {"name": "gremlins", "reason": "unknown parameter"},
    ]
    assert r.json()["detail"] == "2 of 5 values are invalid; nothing was changed."
    assert list(DetectorSetting.objects.values_list("name", "value", "updated_at")) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"values": {"hang.factor": 4}}, "cluster"),
        ({"cluster": "east"}, "values"),
        ({"cluster": "east", "values": {}}, "values"),
        ({"cluster": "east", "values": [["hang.factor", 4]]}, "values"),
        ({"cluster": "east", "values": "hang.factor=4"}, "values"),
    ],
)
def test_a_malformed_body_names_the_field(personas, jobs, body, field):
    r = patch(personas, body)
    assert r.status_code == 400
    assert r.json()["error"] == "invalid" and field in r.json()["fields"]
    assert not DetectorSetting.objects.exists()


def test_the_body_must_be_json(personas, jobs):
    c = personas["operator"].client()
    r = c.patch(URL, data="{not json", content_type="application/json")
    assert r.status_code == 400 and r.json()["error"] == "parse_error"
    r = c.patch(URL, {"cluster": "east", "values": "x"}, format="multipart")
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"
    assert not DetectorSetting.objects.exists()


# --- unknown names and scopes -----------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field", "named"),
    [
        ({"cluster": "nowhere"}, "cluster", "nowhere"),
        ({"cluster": "east", "job": "nope"}, "job", "nope"),
    ],
)
def test_unknown_clusters_and_jobs_are_404_by_name(personas, jobs, params, field, named):
    r = get(personas, **params)
    assert r.status_code == 404
    assert r.json()["error"] == "not_found" and r.json()["field"] == field
    assert named in r.json()["detail"]
    r = patch(personas, {**params, "values": {"hang.factor": 4}})
    assert r.status_code == 404 and named in r.json()["detail"]
    assert not DetectorSetting.objects.exists()


def test_a_job_of_another_cluster_is_400(personas, jobs):
    r = get(personas, cluster="east", job="w1")
    assert r.status_code == 400
    assert r.json() == {
        "error": "invalid_parameter",
        "detail": "Job w1 runs on cluster west, not east.",
        "field": "job",
    }
    r = patch(personas, {"cluster": "east", "job": "w1", "values": {"hang.factor": 4}})
    assert r.status_code == 400 and r.json()["field"] == "job"
    assert not DetectorSetting.objects.exists()


def test_the_cluster_is_required_to_read(personas, jobs):
    for params in ({}, {"job": "j1"}):
        r = get(personas, **params)
        assert r.status_code == 400 and r.json()["field"] == "cluster"


# --- roles ------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin"])
def test_viewers_and_above_read(personas, jobs, persona):
    assert get(personas, persona, cluster="east", job="j1").status_code == 200


@pytest.mark.parametrize("persona", ["operator", "admin"])
def test_operators_and_admins_change(personas, jobs, persona):
    r = patch(personas, {"cluster": "east", "values": {"hang.factor": 4}}, persona)
    assert r.status_code == 200
    assert DetectorSetting.objects.get().updated_by == persona


@pytest.mark.parametrize("persona", ["viewer", "ingest", "outsider"])
def test_viewers_and_others_may_not_change(personas, jobs, persona):
    r = patch(personas, {"cluster": "east", "values": {"hang.factor": 4}}, persona)
    assert r.status_code == 403
    assert r.json()["error"] == "permission_denied"
    assert not DetectorSetting.objects.exists()


@pytest.mark.parametrize("persona", ["ingest", "outsider"])
def test_ingest_tokens_and_users_without_a_role_may_not_read(personas, jobs, persona):
    assert get(personas, persona, cluster="east").status_code == 403


def test_strangers_get_401(personas, jobs):
    c = APIClient()
    assert c.get(URL, {"cluster": "east"}).status_code == 401
    r = c.patch(URL, {"cluster": "east", "values": {"hang.factor": 4}}, format="json")
    assert r.status_code == 401
    assert not DetectorSetting.objects.exists()


def test_other_methods_are_not_allowed(personas, jobs):
    c = personas["admin"].client()
    body = {"cluster": "east", "values": {"hang.factor": 4}}
    assert c.post(URL, body, format="json").status_code == 405
    assert c.put(URL, body, format="json").status_code == 405
    assert c.delete(URL).status_code == 405


def test_the_endpoint_is_in_the_openapi_schema(client):
    r = client.get("/api/v1/schema", {"format": "json"})
    assert r.status_code == 200
    schema = json.loads(r.content)
    op = schema["paths"]["/api/v1/detector-settings"]
    assert set(op) >= {"get", "patch"}
    assert {p["name"] for p in op["get"]["parameters"]} == {"cluster", "job"}
    assert {"200", "400", "404"} <= set(op["patch"]["responses"])
    # The PATCH body is a command, documented with its required fields, JSON only.
    body = op["patch"]["requestBody"]
    assert body["required"] and set(body["content"]) == {"application/json"}
    name = body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert set(schema["components"]["schemas"][name]["required"]) == {"cluster", "values"}


# --- at run time --------------------------------------------------------------------

T0 = 1_790_000_000.0


def test_a_change_applies_to_the_next_detection_pass(personas, ingest):
    """Steps every second until step 20 at t=30, then 170 s of heartbeats and no step:
    a hang under the default 60 s floor. The floor set through the API decides."""

    def ev(i, kind, t, **data):
        e = {"id": f"e{i}", "job": "j1", "kind": kind, "ts": T0 + t, "data": data}
        return e | ({"node": "n0"} if kind == "heartbeat" else {"attempt": 1})

    events = [ev(0, "attempt_started", 0, world_size=8, nodes=["n0"]), ev(1, "ready", 10)]
    events += [ev(10 + s, "step", 10 + s, step=s) for s in range(1, 21)]
    events += [ev(100 + t, "heartbeat", t) for t in range(31, 201, 5)]
    assert ingest(events).status_code == 202

    def hangs():
        return [i for i in detect("j1") if i.fault_type == "hang"]

    r = patch(personas, {"cluster": "east", "values": {"hang.floor_s": 300}})
    assert by_name(r)["hang.floor_s"]["value"] == 300
    assert hangs() == []  # 170 s without a step is under the cluster's 300 s floor

    r = patch(personas, {"cluster": "east", "job": "j1", "values": {"hang.floor_s": 120}})
    assert by_name(r)["hang.floor_s"]["value"] == 120
    [hang] = hangs()  # the job's own 120 s wins: now it is a hang
    assert hang.cause == Incident.Cause.HANG
    assert hang.fault_at.timestamp() == pytest.approx(T0 + 30)
    assert hang.time_to_detect_s == pytest.approx(120)
