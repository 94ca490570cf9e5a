"""The monitoring examples shipped in deploy/: Prometheus's config and alerting rules
pass `promtool check`, and every query of the rules and of the Grafana dashboard is
valid PromQL naming only metrics /metrics exposes."""

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.monitoring.metrics import exposed_names, scrape
from tests.processes import ROOT, need_program

PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "rebound-dashboard.json"
INSTALL = "apt-get install prometheus"
METRIC = re.compile(r"\brebound_[a-z0-9_]+")
# What Grafana puts in place of its variables before it sends a query.
GRAFANA_VARIABLES = {"$cluster": ".*", "$__range": "6h", "$__rate_interval": "1m"}


def promtool(*args, cwd=None) -> subprocess.CompletedProcess:
    need_program("promtool", INSTALL, require="REBOUND_REQUIRE_MONITORING")
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def rule_queries() -> list[str]:
    rules = yaml.safe_load((PROMETHEUS / "rebound-rules.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


@pytest.mark.engine_free
def test_promtool_passes_the_alerting_rules():
    out = promtool("check", "rules", str(PROMETHEUS / "rebound-rules.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.mark.engine_free
def test_promtool_passes_the_scrape_config(tmp_path):
    """The example as shipped, with its token file and its rules beside it (promtool
    checks that the files it names exist)."""
    token = tmp_path / "rebound-token"
    token.write_text("a-token\n")
    config = (PROMETHEUS / "prometheus.yml").read_text()
    assert "credentials_file: /etc/prometheus/rebound-token" in config
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/rebound-token", str(token))
    )
    shutil.copy(PROMETHEUS / "rebound-rules.yml", tmp_path)
    out = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout + out.stderr


@pytest.mark.engine_free
def test_the_dashboards_queries_are_valid_promql(tmp_path):
    """Each query, Grafana's variables filled in, as a recording rule promtool parses."""
    rules = []
    for i, expr in enumerate(dashboard_queries()):
        if expr.startswith("label_values("):
            continue  # Grafana's own function, not PromQL
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_dashboard_has_a_datasource_variable_and_no_outside_assets():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for p in dashboard["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
    assert "http://" not in DASHBOARD.read_text() and "https://" not in DASHBOARD.read_text()


@pytest.mark.django_db
def test_the_dashboard_and_the_rules_name_only_exposed_metrics(personas):
    exposed = exposed_names(scrape(personas["viewer"].client()))
    for where, queries in (("dashboard", dashboard_queries()), ("rules", rule_queries())):
        named = {m for q in queries for m in METRIC.findall(q)}
        assert named, where
        assert named <= exposed, f"{where} names {sorted(named - exposed)}, not exposed"
    # What the brief asks the dashboard to show is there.
    named = {m for q in dashboard_queries() for m in METRIC.findall(q)}
    for metric in (
        "rebound_job_goodput_seconds",
        "rebound_job_badput_gpu_seconds",
        "rebound_incidents_open",
        "rebound_approvals_waiting",
        "rebound_approvals_oldest_age_seconds",
        "rebound_incident_time_to_detect_seconds_bucket",
        "rebound_incident_time_to_recover_seconds_bucket",
        "rebound_incident_lost_gpu_seconds_total",
        "rebound_outbox_oldest_due_age_seconds",
        "rebound_celery_queue_length",
    ):
        assert metric in named, metric


@pytest.mark.django_db
def test_the_name_check_sees_a_name_not_exposed(personas):
    exposed = exposed_names(scrape(personas["viewer"].client()))
    assert "rebound_job_goodput_seconds" in exposed
    assert "rebound_incident_time_to_detect_seconds_bucket" in exposed
    assert "rebound_ingest_events_total" in exposed
    assert "rebound_ingest_events" not in exposed  # a counter's samples end in _total
    assert "rebound_no_such_metric" not in exposed
