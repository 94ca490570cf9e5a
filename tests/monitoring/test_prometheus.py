"""A real Prometheus (Debian's `prometheus`) scrapes the live server's /metrics with a
bearer token, and its HTTP API answers a query with the goodput of a test job."""

import subprocess
import time

import pytest
import requests

from tests.monitoring.metrics import sample_job
from tests.processes import _stop, free_port, need_program

pytestmark = [pytest.mark.engine_free, pytest.mark.django_db(transaction=True)]

CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: rebound
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: ["{target}"]
"""


def query(base: str, promql: str) -> list:
    r = requests.get(f"{base}/api/v1/query", params={"query": promql}, timeout=5)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def until(condition, what: str, process: subprocess.Popen, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"prometheus exited: {_stop(process)}"
        try:
            found = condition()
        except requests.RequestException:
            found = None
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; prometheus said: {_stop(process)[-3000:]}")


def test_prometheus_scrapes_the_goodput_of_a_job(tmp_path, live_server, personas, ingest, sample):
    need_program("prometheus", "apt-get install prometheus", require="REBOUND_REQUIRE_MONITORING")
    _, expected = sample
    sample_job(ingest, sample)
    token_file = tmp_path / "token"
    token_file.write_text(personas["viewer"].token)
    target = live_server.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(CONFIG.format(token_file=token_file, target=target))
    port = free_port()
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        result = until(
            lambda: query(base, 'rebound_job_goodput_seconds{job_key="sample-small"}'),
            "Rebound's goodput in Prometheus",
            process,
        )
        up = query(base, 'up{job="rebound"}')
    finally:
        out = _stop(process)
    assert len(result) == 1, result
    series = result[0]
    assert float(series["value"][1]) == pytest.approx(expected["categories"]["productive"])
    # The training job's key is `job_key`: `job` is the scrape job's (Prometheus's own).
    assert series["metric"]["job"] == "rebound"
    assert series["metric"]["cluster"] == "east"
    assert [float(s["value"][1]) for s in up] == [1.0], out[-2000:]
