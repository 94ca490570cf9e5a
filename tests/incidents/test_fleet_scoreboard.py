"""The detection scoreboard on a small simulated fleet (bench/fleetsim): floors on what
the detectors achieve today, so a change that loses faults or invents incidents shows.

4 nodes x 8 GPUs (two jobs of 16 ranks) for 0.3 days, seed 7, 14,000 faults per 1,000
node-days with every class equally likely (the Llama 3 mix would leave most classes
empty at this size), stragglers at 0.3 of that: 21 faults. Replayed in ticks of 300 s,
full passes every 600 s, the sweep every tick (about 25 s of CPU).

Measured on PostgreSQL, as (recall, time to detect p95): gpu_xid 2/2 (0 s), crash
2/3 (0 s), nccl_timeout 2/4 (248 s; found as hangs before the watchdog's report at
600 s, so none typed nccl_timeout), hang 1/1 (261 s), dead_node 3/3 (20 s; typed
hang, the silent node named), straggler 2/5 (135 s), sdc 1/1 (214 s); the planned
stops opened nothing; 1 false incident (a hang); goodput exact for both jobs (0.000
percentage points). The floors below are those figures. SQLite alike, but for the sdc:
its NaN loss is not kept there, so it is found only as a launch that failed.
"""

import sys
from pathlib import Path

import pytest
from django.db import connection

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from fleetsim.drive import replay
from fleetsim.score import goodput_seen, incidents_seen, render, scoreboard
from fleetsim.sim import FleetConfig, simulate

pytestmark = pytest.mark.django_db

EVEN = dict.fromkeys(
    ("gpu_xid", "crash", "nccl_timeout", "hang", "dead_node", "sdc", "planned"), 1.0
)
CONFIG = FleetConfig(
    nodes=4,
    days=0.3,
    rate=14000,
    seed=7,
    job_nodes=(2, 2),
    mix=EVEN,
    hang_share=0.0,
    straggler_share=0.3,
)


def test_scoreboard_floors():
    fleet = simulate(CONFIG)
    replay(fleet.events, cluster_name="fleet", tick_s=300, pass_every_s=600)
    keys = [j.key for j in fleet.jobs]
    board = scoreboard(fleet, incidents_seen(keys), goodput_seen(keys))
    shown = render(board)
    classes = board["classes"]
    recall_floors = {
        "gpu_xid": 1.0,
        "crash": 0.66,
        "nccl_timeout": 0.5,
        "hang": 1.0,
        "dead_node": 1.0,
        "straggler": 0.4,
        "sdc": 1.0,
    }
    for cls, floor in recall_floors.items():
        assert classes[cls]["injected"], (cls, shown)
        assert classes[cls]["recall"] >= floor, (cls, shown)
    for cls in ("gpu_xid", "crash", "straggler"):
        assert classes[cls]["precision"] == 1.0, (cls, shown)
    if connection.vendor == "postgresql":  # SQLite keeps no NaN loss: the sdc shows as a failed end
        assert classes["sdc"]["typed"] == 1 and classes["sdc"]["precision"] == 1.0, shown
    assert classes["hang"]["precision"] >= 0.9, shown
    assert classes["planned"]["detected"] == 0, shown
    assert board["false_incidents"] <= 1, shown
    assert classes["gpu_xid"]["ttd_p95_s"] <= 1 and classes["crash"]["ttd_p95_s"] <= 1, shown
    assert classes["dead_node"]["ttd_p95_s"] <= 30, shown  # the dead-node timeout
    assert classes["hang"]["ttd_p95_s"] <= 300, shown
    assert board["goodput_error_pp_max"] <= 0.01, shown
