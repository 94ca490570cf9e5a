"""bench/fleet_load.py scaled down (64 ranks on 8 nodes, 7 s at the real rate, no burst):
the load run itself runs, every event it posts is accepted, and its side job's GPU Xid
opens an incident. On PostgreSQL and Redis (a queue of the run's own), as CI has them."""

import os
import subprocess
import sys
import time

import orjson
import pytest

from tests.processes import ROOT, database_url

pytestmark = [
    pytest.mark.postgres,  # the bench's server and worker share the test database
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (REDIS_URL)"),
    pytest.mark.timeout(120),
]


def test_fleet_load_scaled_down(tmp_path):
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(ROOT / "bench" / "fleet_load.py"), "--minutes", "0.12"]
    cmd += ["--ranks", "64", "--nodes", "8", "--step-s", "0.5", "--fault-every-s", "6"]
    cmd += ["--burst-s", "0", "--report-s", "5", "--database-url", database_url()]
    cmd += ["--redis-url", os.environ["REDIS_URL"], "--json", str(out)]
    t = time.monotonic()
    # Detection passes a second apart, not five: the run's wait for them at the end is short.
    env = dict(os.environ, REBOUND_DETECT_DEBOUNCE_S="1", REBOUND_LEDGER_DEBOUNCE_S="1")
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    took = time.monotonic() - t
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = orjson.loads(out.read_bytes())
    assert figures["ok"]
    assert figures["real"]["events"] > 50  # steps, heartbeats, windows: all accepted
    assert [f["opened"] for f in figures["faults"]] == [True]
    assert figures["fault_latency_s"]["from_accepted"]["p95"] < 2.0
    assert took < 40, f"the scaled-down run took {took:.0f} s"
