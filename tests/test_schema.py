"""The OpenAPI schema at /api/v1/schema: valid OpenAPI 3, every error answer documented
with the one error shape, and each operation's inputs as the server reads them."""

import json

import pytest
from drf_spectacular.validation import validate_schema

ERROR_REF = "#/components/schemas/Error"
METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    from django.test import Client

    with django_db_blocker.unblock():
        r = Client().get("/api/v1/schema", {"format": "json"})
    assert r.status_code == 200
    return json.loads(r.content)


def operations(schema):
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method in item:
                yield f"{method.upper()} {path}", item[method]


def test_the_schema_is_valid_openapi_3(schema):
    assert schema["openapi"].startswith("3.")
    validate_schema(schema)  # raises on any violation of the OpenAPI 3 meta-schema


def test_the_error_component_is_the_one_error_shape(schema):
    error = schema["components"]["schemas"]["Error"]
    assert error["type"] == "object"
    assert set(error["required"]) == {"error", "detail"}
    assert error["properties"]["error"]["type"] == "string"
    assert error["properties"]["detail"]["type"] == "string"


def test_every_error_answer_references_the_error_component(schema):
    bad = []
    for name, op in operations(schema):
        for code, response in op["responses"].items():
            if code < "400":
                continue
            content = response.get("content", {})
            refs = {media: c.get("schema", {}).get("$ref") for media, c in content.items()}
            if refs != {"application/json": ERROR_REF} or not response.get("description"):
                bad.append((name, code, refs))
    assert not bad


def test_every_operation_documents_the_errors_it_can_give(schema):
    missing = []
    for name, op in operations(schema):
        codes = set(op["responses"])
        params = op.get("parameters", [])
        expected = {"400", "401", "403", "503"}
        if any(p["in"] == "path" or p["name"] == "page" for p in params):
            expected.add("404")
        if not expected <= codes:
            missing.append((name, sorted(expected - codes)))
        assert "Retry-After" in op["responses"]["503"]["headers"]
    assert not missing


@pytest.mark.parametrize(
    "name, codes",
    [
        ("POST /api/v1/ingest", {"202", "400", "409", "413", "415"}),
        ("POST /api/v1/actions/", {"201", "400", "404", "409"}),
        ("POST /api/v1/actions/{id}/approve", {"200", "400", "404", "409"}),
        ("POST /api/v1/clusters/{name}/faults", {"200", "400", "404", "409"}),
        ("GET /api/v1/detector-settings", {"200", "400", "404"}),
    ],
)
def test_the_answers_an_operation_declares_are_documented(schema, name, codes):
    op = dict(operations(schema))[name]
    assert codes <= set(op["responses"])


def test_ingest_advertises_the_json_body_it_reads_and_no_form(schema):
    body = schema["paths"]["/api/v1/ingest"]["post"]["requestBody"]
    assert set(body["content"]) == {"application/json"}
    assert body["required"] is True


def test_detector_settings_need_a_cluster(schema):
    op = schema["paths"]["/api/v1/detector-settings"]
    (cluster,) = [p for p in op["get"]["parameters"] if p["name"] == "cluster"]
    assert cluster["required"] is True
    ref = op["patch"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    assert set(body["required"]) == {"cluster", "values"}


def test_the_ingest_schema_names_each_kinds_data_fields_as_the_wire_checks_them(schema):
    from jobs.api.serializers import DATA_FIELD_SCHEMAS
    from jobs.wire import DATA_SCHEMA, KINDS

    assert set(DATA_FIELD_SCHEMAS) == set(DATA_SCHEMA) == KINDS
    for kind, fields in DATA_SCHEMA.items():
        assert set(DATA_FIELD_SCHEMAS[kind]) == set(fields), kind
    body = schema["components"]["schemas"]["IngestRequestRequest"]
    assert body["additionalProperties"] is False
    events = body["properties"]["events"]
    assert (events["minItems"], events["maxItems"]) == (1, 5000)
    by_kind = {e["properties"]["kind"]["enum"][0]: e for e in events["items"]["oneOf"]}
    assert set(by_kind) == KINDS
    for kind, event in by_kind.items():
        required = {n for n, spec in DATA_SCHEMA[kind].items() if spec[1]}
        assert set(event["properties"]["data"].get("required", [])) == required, kind
        assert event["additionalProperties"] is False
    assert "attempt" not in by_kind["heartbeat"]["required"]
    assert "node" in by_kind["heartbeat"]["required"]
    assert "attempt" in by_kind["step"]["required"]


def test_the_schema_is_generated_without_a_warning(tmp_path):
    """A warning is a field or an answer drf-spectacular had to guess."""
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", tmp_path / "s.yaml")


def test_a_fault_injection_requires_what_its_kind_needs(schema):
    from recovery.faults import FAULTS

    shapes = schema["components"]["schemas"]["FaultRequest"]["oneOf"]
    by_kind = {s["properties"]["kind"]["allOf"][0]["enum"][0]: s for s in shapes}
    assert set(by_kind) == set(FAULTS)
    for kind, fault in FAULTS.items():
        assert set(by_kind[kind]["required"]) == {"kind", *fault.needs}, kind
    assert by_kind["slow"]["properties"]["factor"]["minimum"] == 1
